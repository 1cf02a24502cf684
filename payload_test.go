package asyncplatform

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

func TestEnqueueTooLargeWithoutStore(t *testing.T) {
	p, err := New(tinyBackend{memory.NewBroker().Connect()}, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	j := &Job{Type: "t", Payload: make([]byte, tinyMax)}
	err = p.Enqueue(context.Background(), j)
	if !errors.Is(err, ErrPayloadTooLarge) {
		t.Fatalf("got %v, want ErrPayloadTooLarge", err)
	}
	if max := p.MaxPayload(*j); max <= 0 || max >= tinyMax {
		t.Errorf("MaxPayload = %d for a %d-byte backend", max, tinyMax)
	}
}

// A job at the payload limit whose error is huge still fits in a dead letter,
// and so does a foreign message as large as the backend allows.
func TestDeadLettersFitTheBackend(t *testing.T) {
	b := tinyBackend{memory.NewBroker().Connect()}
	dead := make(chan DeadLetter, 2)
	p, err := New(b, Config{Logger: quietLog, Hooks: Hooks{OnDeadLetter: func(_ context.Context, dl DeadLetter) { dead <- dl }}})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Handle("t", func(context.Context, *Job) error {
		return Permanent(errors.New(string(bytes.Repeat([]byte("e"), 5000))))
	})
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	j := &Job{Type: "t"}
	j.Payload = make([]byte, p.MaxPayload(*j))
	if err := p.Enqueue(ctx, j); err != nil {
		t.Fatal(err)
	}
	garbage := bytes.Repeat([]byte{0xee}, tinyMax)
	if err := b.Enqueue(ctx, DefaultQueue, []driver.Message{{ID: "g", Body: garbage}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var dl DeadLetter
		select {
		case dl = <-dead:
		case <-time.After(5 * time.Second):
			t.Fatal("a record too large for the backend was never dead-lettered")
		}
		if dl.Raw == nil && (len(dl.Error) < minDeadError || len(dl.Job.Payload) != len(j.Payload)) {
			t.Errorf("job dead letter: error %d bytes, payload %d", len(dl.Error), len(dl.Job.Payload))
		}
	}
}
