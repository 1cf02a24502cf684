package asyncplatform

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

var bindKey = []byte("0123456789abcdef0123456789abcdef")

// signedPlatform starts a platform with bindKey over broker, working queues
// a and admin; it returns the jobs it ran, as queue/ID.
func signedPlatform(t *testing.T, broker *memory.Broker, cfg Config) (*Platform, func() []string) {
	t.Helper()
	cfg.Logger, cfg.SigningKey = quietLog, bindKey
	cfg.Queues = map[string]QueueConfig{"a": {}, "admin": {}}
	cfg.Policy = Policy{RetryLimit: Limit(0)}
	p, err := New(broker.Connect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ran []string
	_ = p.Handle("t", func(_ context.Context, j *Job) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, j.Queue+"/"+j.ID)
		return nil
	})
	return p, func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(ran)
		slices.Sort(out)
		return out
	}
}

// store puts body on queue straight through the backend, as a writer to
// the broker would.
func store(t *testing.T, p *Platform, queue, id string, body []byte) {
	t.Helper()
	if err := p.backend.Enqueue(context.Background(), queue, []driver.Message{{ID: id, Body: body}}); err != nil {
		t.Fatal(err)
	}
}

// signedAs is job id signed with bindKey, carrying the given headers
// verbatim (the binding a platform would write, or none).
func signedAs(p *Platform, id string, h map[string]string) []byte {
	w := wire.Job{ID: id, Type: "t", EnqueuedAt: time.Now(), Headers: h}
	return p.codec.Seal(wire.EncodeJob(&w))
}

// A signed job is bound to the queue it was written to: its bytes copied to
// another queue are dead-lettered there ("bad signature"), not run. A job
// signed by an earlier version (no binding) still runs by default, so a
// rolling upgrade dead-letters nothing.
func TestSignedJobBoundToQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := memory.NewBroker()
	p, ran := signedPlatform(t, broker, Config{})
	real := encodeMessage(p.codec, &Job{ID: "moved", Type: "t", Queue: "a", EnqueuedAt: time.Now()})
	store(t, p, "a", "moved", real.Body)
	store(t, p, "admin", "moved", real.Body)
	store(t, p, "a", "legacy", signedAs(p, "legacy", nil))
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx) })
	waitUntil(t, "two runs and a dead letter", func() bool {
		st, _ := p.Stats(ctx, "admin")
		return st.Dead == 1 && len(ran()) == 2
	})
	if got := ran(); !slices.Equal(got, []string{"a/legacy", "a/moved"}) {
		t.Fatalf("ran %q; want the job on its own queue, and the one signed by an earlier version", got)
	}
	page, _ := p.DeadLetters(ctx, "admin", "", 10)
	if dl := page.Letters[0]; dl.Reason != ReasonInvalid || !strings.Contains(dl.Error, `signed for queue "a"`) || dl.Raw == nil {
		t.Fatalf("the moved copy's dead letter: %s %q; want invalid, signed for queue a, raw", dl.Reason, dl.Error)
	}
}

// With ReplayWindow, a signed job due longer ago than the window (a copy
// replayed later) is dead-lettered, and so is one with no binding; a fresh
// one and one whose NotBefore is recent run.
func TestSignedJobReplayWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := New(memory.NewBroker().Connect(), Config{ReplayWindow: time.Minute}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("ReplayWindow without a SigningKey: %v; want ErrInvalidConfig", err)
	}
	p, ran := signedPlatform(t, memory.NewBroker(), Config{ReplayWindow: time.Hour})
	at := func(d time.Duration) string { return strconv.FormatInt(time.Now().Add(d).UnixMilli(), 10) }
	store(t, p, "a", "fresh", encodeMessage(p.codec, &Job{ID: "fresh", Type: "t", Queue: "a", EnqueuedAt: time.Now()}).Body)
	store(t, p, "a", "replayed", signedAs(p, "replayed", map[string]string{wire.QueueHeader: "a", wire.SignedAtHeader: at(-2 * time.Hour)}))
	store(t, p, "a", "legacy", signedAs(p, "legacy", nil))
	due := wire.Job{ID: "due", Type: "t", EnqueuedAt: time.Now(), NotBefore: time.Now().Add(-time.Minute),
		Headers: map[string]string{wire.QueueHeader: "a", wire.SignedAtHeader: at(-2 * time.Hour)}} // scheduled 2 h ahead, due a minute ago
	store(t, p, "a", "due", p.codec.Seal(wire.EncodeJob(&due)))
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx) })
	waitUntil(t, "two runs and two dead letters", func() bool {
		st, _ := p.Stats(ctx, "a")
		return st.Dead == 2 && len(ran()) == 2
	})
	if got := ran(); !slices.Equal(got, []string{"a/due", "a/fresh"}) {
		t.Fatalf("ran %q; want the fresh job and the one due recently", got)
	}
	page, _ := p.DeadLetters(ctx, "a", "", 10)
	for _, dl := range page.Letters {
		if dl.Reason != ReasonInvalid || !strings.Contains(dl.Error, "bad signature") {
			t.Errorf("dead letter: %s %q; want invalid, bad signature", dl.Reason, dl.Error)
		}
	}
}

// Redrive sends a job back only to the queue it was dead-lettered from: a
// signed record copied into another queue's dead letters stays there, named
// in the error, and the queue's own records go back.
func TestRedriveSignedRecordOwnQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := memory.NewBroker()
	p, ran := signedPlatform(t, broker, Config{})
	if err := p.Pause(ctx, "a"); err != nil { // redriven jobs wait
		t.Fatal(err)
	}
	if err := p.Pause(ctx, "admin"); err != nil {
		t.Fatal(err)
	}
	rec := func(id, queue string) []byte {
		d := wire.Dead{Reason: "retries_exceeded", Queue: queue, DeadAt: time.Now(), Job: wire.Job{ID: id, Type: "t", EnqueuedAt: time.Now()}}
		return p.codec.Seal(wire.EncodeDead(&d))
	}
	deadOn := func(queue, id string, body []byte) {
		store(t, p, queue, "carrier-"+id, []byte("carrier"))
		ds, err := p.backend.Receive(ctx, queue, 1, time.Minute)
		if err != nil || len(ds) != 1 {
			t.Fatal(ds, err)
		}
		if err := p.backend.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: id, Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	deadOn("admin", "copied", rec("copied", "a")) // a's signed record, copied into admin's dead letters
	deadOn("admin", "own", rec("own", "admin"))
	n, err := p.Redrive(ctx, "admin")
	if n != 1 || !errors.Is(err, ErrInvalidJob) || !strings.Contains(err.Error(), "copied") {
		t.Fatalf("Redrive = %d, %v; want 1, and ErrInvalidJob naming the copied record", n, err)
	}
	page, _ := p.DeadLetters(ctx, "admin", "", 10)
	if len(page.Letters) != 1 || page.Letters[0].ID != "copied" {
		t.Fatalf("left %d letters; want the copied one", len(page.Letters))
	}
	if st, _ := p.Stats(ctx, "admin"); st.Ready != 1 {
		t.Fatalf("admin after the redrive: %+v; want its own job back", st)
	}
	_ = ran
}

// A signed job of MaxPayload bytes fits, its queue binding included, on a
// queue with the longest name (MaxPayload reserves the binding's largest
// size, so it may be a few bytes short of the exact limit when signed).
func TestSignedMaxPayloadFits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog, SigningKey: bindKey, MaxMessage: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	j := Job{Type: "t", Queue: strings.Repeat("q", 100)}
	j.Payload = make([]byte, p.MaxPayload(j))
	if err := p.Enqueue(ctx, &j); err != nil {
		t.Fatalf("a signed job of MaxPayload (%d) bytes: %v", len(j.Payload), err)
	}
	j2 := Job{Type: "t", Queue: j.Queue, Payload: make([]byte, len(j.Payload)+64)}
	if err := p.Enqueue(ctx, &j2); !errors.Is(err, ErrPayloadTooLarge) {
		t.Fatalf("64 bytes more: %v; want ErrPayloadTooLarge", err)
	}
}
