package health

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// patience bounds every wait of these tests; it only stops a hang, no
// assertion depends on how soon something happens.
const patience = 20 * time.Second

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

var errDown = errors.New("down")

// testBundle is a gate with one check, "db", whose result the test sets.
type testBundle struct {
	gate   *Gate
	base   context.Context // the gate's base (Start): the fetchers' context
	cancel context.CancelFunc

	mu    sync.Mutex
	err   error         // what the check returns
	calls atomic.Int32  // check runs
	ran   chan struct{} // gets a value after each check run (dropped when full)
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{gate: &Gate{}, ran: make(chan struct{}, 100)}
	b.base, b.cancel = context.WithCancel(context.Background())
	t.Cleanup(b.cancel)
	b.gate.Init(map[string]Check{"db": b.check})
	b.gate.Start(b.base)
	return b
}

func (b *testBundle) check(ctx context.Context) error {
	b.mu.Lock()
	err := b.err
	b.mu.Unlock()
	b.calls.Add(1)
	select {
	case b.ran <- struct{}{}:
	default:
	}
	return err
}

func (b *testBundle) set(err error) {
	b.mu.Lock()
	b.err = err
	b.mu.Unlock()
}

// loop runs Loop until the test ends, and returns a channel closed when it
// returns.
func (b *testBundle) loop(t *testing.T, ctx context.Context, every time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.gate.Loop(ctx, every, quietLog)
	}()
	t.Cleanup(func() {
		select {
		case <-done:
		case <-time.After(patience):
			t.Error("Loop did not return after its context ended")
		}
	})
	return done
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func closed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(patience):
		t.Fatalf("gave up waiting for %s", what)
	}
}

// waitOpen returns what Wait returns on a gate expected open (nil if it
// stayed closed for patience).
func waitOpen(g *Gate) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	return g.Wait(ctx)
}

// waitBlocks reports whether Wait blocks on the gate (for a short while: a
// correct gate cannot fail this, a broken one may slip through).
func waitBlocks(g *Gate) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	return g.Wait(ctx) == nil
}

func TestGate(t *testing.T) {
	t.Parallel()

	t.Run("StartsOpen", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if !b.gate.OK() || !b.gate.Healthy() {
			t.Errorf("a new gate: OK %v, Healthy %v; want both", b.gate.OK(), b.gate.Healthy())
		}
		if p := waitOpen(b.gate); p == nil || p.Err() != nil {
			t.Error("Wait on a new gate did not return a live period")
		}
	})

	// FailFlipsAndRecovers: a failing check closes the gate, ends the
	// healthy period (a fetcher's Receive stops) and makes Wait block; a
	// pass opens it with a new period.
	t.Run("FailFlipsAndRecovers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		period := b.gate.Wait(context.Background())
		b.set(errDown)
		if b.gate.Run(context.Background(), quietLog) {
			t.Error("Run with a failing check reported healthy")
		}
		if b.gate.OK() || b.gate.Healthy() {
			t.Error("the gate is open with a failing check")
		}
		if period.Err() == nil {
			t.Error("the healthy period did not end when health was lost")
		}
		if res := b.gate.Results(); !errors.Is(res["db"], errDown) {
			t.Errorf("Results = %v, want db: %v", res, errDown)
		}
		if !waitBlocks(b.gate) {
			t.Error("Wait returned while unhealthy")
		}
		b.set(nil)
		if !b.gate.Run(context.Background(), quietLog) {
			t.Error("Run with a passing check reported unhealthy")
		}
		if !b.gate.OK() || !b.gate.Healthy() {
			t.Error("the gate stayed closed after the check passed")
		}
		if res := b.gate.Results(); len(res) != 1 || res["db"] != nil {
			t.Errorf("Results = %v, want db: nil", res)
		}
		if p := waitOpen(b.gate); p == nil || p.Err() != nil || p == period {
			t.Error("Wait after recovery did not return a new live period")
		}
	})

	// WaitWakes: a Wait blocked on a closed gate returns when it opens, and
	// returns nil when its own context ends first.
	t.Run("WaitWakes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.set(errDown)
		b.gate.Run(context.Background(), quietLog)
		got := make(chan context.Context, 1)
		go func() { got <- b.gate.Wait(context.Background()) }()
		b.set(nil)
		b.gate.Run(context.Background(), quietLog)
		select {
		case p := <-got:
			if p == nil || p.Err() != nil {
				t.Errorf("Wait returned %v after health returned, want a live period", p)
			}
		case <-time.After(patience):
			t.Fatal("Wait did not return after health returned")
		}

		b.gate.Hold()
		ctx, cancel := context.WithCancel(context.Background())
		go func() { got <- b.gate.Wait(ctx) }()
		cancel()
		select {
		case p := <-got:
			if p != nil {
				t.Error("Wait returned a period while the gate was held")
			}
		case <-time.After(patience):
			t.Fatal("Wait did not return when its context ended")
		}
	})

	// PeriodIsChildOfBase: the healthy period ends with the gate's base
	// (the fetchers' context).
	t.Run("PeriodIsChildOfBase", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.gate.Wait(context.Background())
		b.cancel()
		closed(t, "the period to end with its base", p.Done())
	})

	// StartUnhealthy: a gate unhealthy when Start is called gives no live
	// period until the checks pass.
	t.Run("StartUnhealthy", func(t *testing.T) {
		t.Parallel()
		g := &Gate{}
		g.Init(map[string]Check{"db": func(context.Context) error { return errDown }})
		g.Run(context.Background(), quietLog)
		g.Start(context.Background())
		if !waitBlocks(g) {
			t.Error("Wait returned on a gate started unhealthy")
		}
	})

	// HoldRelease: Hold closes the gate whatever the checks say, without
	// changing Healthy; Release opens it only if the checks pass.
	t.Run("HoldRelease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		period := b.gate.Wait(context.Background())
		b.gate.Hold()
		if b.gate.OK() || !b.gate.Healthy() {
			t.Errorf("held: OK %v, Healthy %v; want closed and healthy", b.gate.OK(), b.gate.Healthy())
		}
		if period.Err() == nil {
			t.Error("Hold did not end the healthy period")
		}
		b.gate.Run(context.Background(), quietLog) // passing checks do not open a held gate
		if b.gate.OK() {
			t.Error("a passing check opened a held gate")
		}
		b.set(errDown)
		b.gate.Run(context.Background(), quietLog)
		b.gate.Release()
		if b.gate.OK() {
			t.Error("Release opened the gate with a failing check")
		}
		b.set(nil)
		b.gate.Run(context.Background(), quietLog)
		if !b.gate.OK() {
			t.Error("the gate stayed closed after Release and a passing check")
		}
		if p := waitOpen(b.gate); p == nil || p.Err() != nil {
			t.Error("Wait did not return on the reopened gate")
		}
	})

	// PanickingCheck: a check that panics is a failure, not a crash.
	t.Run("PanickingCheck", func(t *testing.T) {
		t.Parallel()
		g := &Gate{}
		g.Init(map[string]Check{"bad": func(context.Context) error { panic("kaboom") }})
		if g.Run(context.Background(), quietLog) || g.OK() {
			t.Error("a panicking check counted as a pass")
		}
		if err := g.Results()["bad"]; err == nil || !strings.Contains(err.Error(), "kaboom") {
			t.Errorf("the panicking check's result is %v, want the panic", err)
		}
	})

	// AddPinger: a backend that can Ping becomes the "broker" check beside
	// the others; one that cannot adds nothing.
	t.Run("AddPinger", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.gate.AddPinger(noPing{})
		b.gate.Run(context.Background(), quietLog)
		if res := b.gate.Results(); len(res) != 1 {
			t.Errorf("a backend without Ping added a check: %v", res)
		}
		p := &pinger{err: errDown}
		b.gate.AddPinger(p)
		if b.gate.Run(context.Background(), quietLog) {
			t.Error("a failing Ping counted as healthy")
		}
		res := b.gate.Results()
		if !errors.Is(res["broker"], errDown) || res["db"] != nil {
			t.Errorf("Results = %v, want broker: down and db: nil", res)
		}
	})
}

// TestLoop covers Gate.Loop: checks every interval and on request, sooner
// while they fail, until its context ends.
func TestLoop(t *testing.T) {
	t.Parallel()

	// Periodic: the checks run again every interval, and a failure and a
	// recovery seen by the loop flip the gate.
	t.Run("Periodic", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b.loop(t, ctx, 20*time.Millisecond)
		waitFor(t, "three runs", func() bool { return b.calls.Load() >= 3 })
		b.set(errDown)
		waitFor(t, "the gate to close", func() bool { return !b.gate.OK() })
		b.set(nil)
		waitFor(t, "the gate to reopen", b.gate.OK)
	})

	// RetriesSoonerWhileFailing: with an interval no test waits for, a
	// failing check is run again after FirstRetry (doubling), so the gate
	// reopens soon after the check passes.
	t.Run("RetriesSoonerWhileFailing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.set(errDown)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b.loop(t, ctx, time.Hour)
		waitFor(t, "two failed runs", func() bool { return b.calls.Load() >= 2 })
		if b.gate.OK() {
			t.Error("the gate is open with a failing check")
		}
		b.set(nil)
		waitFor(t, "the gate to reopen without waiting an interval", b.gate.OK)
	})

	// Recheck: a request runs the checks at once, however long the
	// interval.
	t.Run("Recheck", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b.loop(t, ctx, time.Hour)
		waitFor(t, "the first run", func() bool { return b.calls.Load() == 1 })
		b.set(errDown)
		b.gate.Recheck()
		waitFor(t, "the gate to close on the recheck", func() bool { return !b.gate.OK() })
	})

	// CheckBoundedByInterval: a check that hangs gets a context that ends
	// after the interval, and counts as a failure.
	t.Run("CheckBoundedByInterval", func(t *testing.T) {
		t.Parallel()
		g := &Gate{}
		g.Init(map[string]Check{"hang": func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.Loop(ctx, 30*time.Millisecond, quietLog)
		}()
		waitFor(t, "the gate to close", func() bool { return !g.OK() })
		if err := g.Results()["hang"]; !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the hanging check's result is %v, want DeadlineExceeded", err)
		}
		cancel()
		closed(t, "Loop to return", done)
	})

	// StopsWithContext: Loop returns when its context ends, failing or
	// not, and runs no check after.
	t.Run("StopsWithContext", func(t *testing.T) {
		t.Parallel()
		for _, failing := range []bool{false, true} {
			b := setup(t)
			if failing {
				b.set(errDown)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := b.loop(t, ctx, 10*time.Millisecond)
			waitFor(t, "two runs", func() bool { return b.calls.Load() >= 2 })
			cancel()
			closed(t, "Loop to return", done)
			n := b.calls.Load()
			b.gate.Recheck()
			time.Sleep(30 * time.Millisecond) // may only hide a bug
			if m := b.calls.Load(); m != n {
				t.Errorf("failing %v: %d check runs after Loop returned", failing, m-n)
			}
		}
	})

	// NoChecks: with no checks Loop has nothing to do and returns at once,
	// leaving the gate open.
	t.Run("NoChecks", func(t *testing.T) {
		t.Parallel()
		g := &Gate{}
		g.Init(nil)
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.Loop(context.Background(), time.Millisecond, quietLog)
		}()
		closed(t, "Loop to return", done)
		g.Recheck() // must not block
		if !g.OK() {
			t.Error("a gate with no checks is closed")
		}
	})
}

// noPing is a backend that cannot Ping.
type noPing struct{ driver.Backend }

// pinger is a backend that can.
type pinger struct {
	driver.Backend
	err error
}

func (p *pinger) Ping(context.Context) error { return p.err }
