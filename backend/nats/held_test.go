package nats

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

// A SettleDead that finds the hold in its guard window returns
// ErrLeaseLost and forgets the receipt: Close has nothing of it to give
// back, and b.held does not grow with lapsed holds.
func TestLapsedHoldNotKept(t *testing.T) {
	b := deadEnv(t, realURL(t), jetstream.MemoryStorage)
	q := queueName(t)
	ctx := context.Background()
	deadLetter(t, b, q, "a")
	dd, err := b.NextDead(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(b.cfg.DeadHold - guard(b.cfg.DeadHold) + 100*time.Millisecond)
	err = b.SettleDead(ctx, dd, true)
	b.mu.Lock()
	n := len(b.held)
	b.mu.Unlock()
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("SettleDead after the hold lapsed: %v, want ErrLeaseLost", err)
	}
	if n != 0 {
		t.Errorf("%d receipt(s) stay in b.held after a lapsed hold", n)
	}
	if err := b.ExtendDead(ctx, dd); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("ExtendDead of a settled hold: %v, want ErrLeaseLost", err)
	}
}
