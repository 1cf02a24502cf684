package asyncplatform

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

func startPlatform(t *testing.T, cfg Config, handlers map[string]Handler) *Platform {
	t.Helper()
	cfg.Logger = quietLog
	p, err := New(memory.NewBroker().Connect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range handlers {
		if err := p.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
	})
	return p
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// encodeMessage encodes a job as the backend message of its current copy. A copy
// that outgrew the backend's limit loses its oldest error lines until it
// fits.
func encodeMessage(c wire.Codec, j *Job) driver.Message {
	w := toWire(j)
	body := c.Encode(j.Queue, &w)
	j.Errors = w.Errors
	return driver.Message{ID: messageID(j), Dedupe: c.DedupeKey(&w), Body: body, NotBefore: j.NotBefore}
}

// messageID names the current copy of j: its ID, then ID.N for the N-th copy.
func messageID(j *Job) string { return wire.MessageID(j.ID, j.copyNo) }
