package runner

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// counting is a memory backend that counts its ExtendDead calls.
type counting struct {
	*memory.Backend
	extends atomic.Int32
}

func (c *counting) ExtendDead(ctx context.Context, d *driver.DeadDelivery) error {
	c.extends.Add(1)
	return c.Backend.ExtendDead(ctx, d)
}

// deadEnv is a broker with one dead letter on queue "q", a holder that has
// taken it with NextDead, and another caller.
type deadEnv struct {
	holder *counting
	other  *memory.Backend
	dd     *driver.DeadDelivery
}

func newDeadEnv(t *testing.T, hold time.Duration) deadEnv {
	t.Helper()
	ctx := context.Background()
	br := memory.NewBroker()
	open := func() *memory.Backend {
		b, err := memory.New(ctx, memory.Config{Broker: br, DeadHold: hold})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	holder, other := &counting{Backend: open()}, open()
	if err := other.Enqueue(ctx, "q", []driver.Message{{ID: "j", Body: []byte("j")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := other.Receive(ctx, "q", 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: "rec"}); err != nil {
		t.Fatal(err)
	}
	dd, err := holder.NextDead(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	return deadEnv{holder: holder, other: other, dd: dd}
}

// stillHeld reports whether the other caller finds the record held.
func (e deadEnv) stillHeld(t *testing.T) bool {
	t.Helper()
	dd, err := e.other.NextDead(context.Background(), "q")
	switch {
	case errors.Is(err, driver.ErrNoDeadLetters):
		return true
	case err != nil:
		t.Fatal(err)
	}
	if dd.ID != "rec" {
		t.Fatalf("NextDead handed out %q, want rec", dd.ID)
	}
	return false
}

// TestKeepDead: while KeepDead runs, a hold outlasts its DeadHold many
// times over, for a backend whose holds lapse and for one whose holds do
// not (hold zero: nothing is renewed); the holder can then settle. A hold
// of 90 ms lapses when the machine stalls the keeper for a hold (a loaded
// machine): a round whose record came free runs again with twice the hold,
// up to keepDeadRounds rounds, and only a lapse in every round fails. A
// keeper that renews too late or too rarely lapses at every hold.
func TestKeepDead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		hold time.Duration
	}{
		{"lapsing", 90 * time.Millisecond},
		{"lasting", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hold := tc.hold
			for round := 1; ; round++ {
				err := keepDeadRound(t, hold)
				if err == nil {
					return
				}
				if hold == 0 || round == keepDeadRounds {
					t.Fatalf("round %d, hold %v: %v", round, hold, err)
				}
				t.Logf("round %d, hold %v: %v; again with twice the hold", round, hold, err)
				hold *= 2
			}
		})
	}
}

// keepDeadRounds bounds TestKeepDead's rounds: the last hold is 8 times
// the first.
const keepDeadRounds = 4

// keepDeadRound runs KeepDead over a hold of hold for four holds. It fails
// the test for a broken rule that no stall explains, and returns an error
// when the record came free while KeepDead ran or it was renewed less than
// four times.
func keepDeadRound(t *testing.T, hold time.Duration) error {
	e := newDeadEnv(t, hold)
	ctx := context.Background()
	stop := KeepDead(ctx, e.holder, e.dd, e.holder.Capabilities().DeadHold, quietLog)
	time.Sleep(4 * max(hold, 50*time.Millisecond))
	held := e.stillHeld(t)
	if held {
		if n, err := e.other.DeleteDead(ctx, "q", []string{"rec"}); err != nil || n != 0 {
			t.Fatalf("DeleteDead of the held record: %d, %v; want 0", n, err)
		}
	}
	stop()
	n := e.holder.extends.Load()
	switch {
	case hold == 0 && n != 0:
		t.Errorf("%d ExtendDead calls for holds that do not lapse, want none", n)
	case !held:
		return fmt.Errorf("the record came free after four holds while KeepDead ran (%d ExtendDead calls)", n)
	case hold > 0 && n < 4:
		return fmt.Errorf("%d ExtendDead calls over four holds, want one every third of a hold", n)
	}
	if err := e.holder.SettleDead(ctx, e.dd, true); err != nil {
		t.Fatalf("SettleDead after KeepDead: %v", err)
	}
	return nil
}

// TestKeepDeadStops: once stop returns, nothing renews the hold any more
// (no goroutine is left behind), so it lapses and the record comes free.
func TestKeepDeadStops(t *testing.T) {
	t.Parallel()
	const hold = 90 * time.Millisecond
	e := newDeadEnv(t, hold)
	stop := KeepDead(context.Background(), e.holder, e.dd, hold, quietLog)
	time.Sleep(2 * hold)
	stop()
	n := e.holder.extends.Load()
	time.Sleep(2 * hold)
	if after := e.holder.extends.Load(); after != n {
		t.Errorf("%d ExtendDead calls after stop returned, want none", after-n)
	}
	if e.stillHeld(t) {
		t.Errorf("the record was still held two holds after stop")
	}
}

// TestKeepDeadLost: a renewal that finds the hold lost (the record was
// purged) ends the renewals; stop still returns.
func TestKeepDeadLost(t *testing.T) {
	t.Parallel()
	const hold = 90 * time.Millisecond
	e := newDeadEnv(t, hold)
	stop := KeepDead(context.Background(), e.holder, e.dd, hold, quietLog)
	defer stop()
	if n, err := e.other.PurgeDead(context.Background(), "q"); err != nil || n != 1 {
		t.Fatalf("PurgeDead: %d, %v", n, err)
	}
	// The keeper's first renewal finds the hold lost; a loaded machine
	// may start it late, so it is waited for, not timed.
	for deadline := time.Now().Add(10 * time.Second); e.holder.extends.Load() == 0; time.Sleep(hold / 10) {
		if time.Now().After(deadline) {
			t.Fatalf("no ExtendDead call within 10s")
		}
	}
	n := e.holder.extends.Load()
	time.Sleep(2 * hold)
	if after := e.holder.extends.Load(); after != n {
		t.Errorf("%d ExtendDead calls after one found the hold lost, want none", after-n)
	}
}

// slowExtend is a memory backend whose ExtendDead waits delay (or until
// its context ends, failing then) before it renews.
type slowExtend struct {
	*memory.Backend
	delay time.Duration
}

func (s *slowExtend) ExtendDead(ctx context.Context, d *driver.DeadDelivery) error {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Backend.ExtendDead(ctx, d)
}

// TestKeepDeadSlowStore: a store whose renewals take more than a third of
// the hold (two fifths) but answer within it (a loaded machine) keeps the
// hold: a renewal is not cut off at the next tick.
func TestKeepDeadSlowStore(t *testing.T) {
	t.Parallel()
	const hold = 2 * time.Second // 400 ms of slack a renewal, for a loaded machine
	e := newDeadEnv(t, hold)
	slow := &slowExtend{Backend: e.holder.Backend, delay: 2 * hold / 5}
	stop := KeepDead(context.Background(), slow, e.dd, hold, quietLog)
	time.Sleep(4 * hold)
	held := e.stillHeld(t)
	stop()
	if !held {
		t.Error("the record came free while renewals answering in two fifths of a hold ran: a renewal was cut off before the hold lapsed")
	}
}
