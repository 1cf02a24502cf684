package runner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/health"
	"github.com/asyncplatform/asyncplatform/internal/jobctx"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// testOpts configures the runner of one test.
type testOpts struct {
	concurrency int
	prefetch    int
	lease       time.Duration
	pause       bool     // give the queue a pause gate
	pool        []string // make the runner a pool of these queues
	// noLimit: the fake does not check the runner's claims against
	// Concurrency+Prefetch. For a test that lets deliveries go unsettled
	// (a panic, a lost lease), which the broker counts held until their
	// lease lapses, or whose pool sentinels claim with no slot (by design:
	// see PoolConfig and fetchPool).
	noLimit bool
	// freeEarly: the claim slot and the handler turn are given back when
	// the handler returns, before the settle, as the platform's Process
	// does (FreeSlot).
	freeEarly bool
}

// testBundle is one runner over a fake backend, with the machinery the
// platform would run beside it: a health gate, the workers, the lease
// keeper.
type testBundle struct {
	backend   *fakeBackend
	freeEarly bool
	gate      *health.Gate
	pause     *health.Gate   // nil unless testOpts.pause
	pauses    []*health.Gate // a pool's, one per queue
	queue     *Queue[string]
	lease     time.Duration
	workers   *sync.WaitGroup

	// handler runs each delivery the workers take; nil: succeed at once.
	// Set it before start.
	handler func(ctx context.Context, f *Delivery[string]) error

	running    atomic.Int32 // handlers running now
	maxRunning atomic.Int32
	started    atomic.Int32 // handlers started
	lostAtRun  atomic.Int32 // deliveries whose lease was lost before they ran
	settleErrs chan error   // each Settle's error

	handedBack atomic.Int32 // deliveries handed back by handBack

	fetchCtx    context.Context // Fetch's; the gates' healthy periods are its children, as in Platform.Start
	cancelFetch context.CancelFunc
	fetchDone   chan struct{}
	cancelKeep  context.CancelFunc
	keepDone    chan struct{}

	ended chan struct{} // closed when the test ends: handlers blocked in block return
}

const testQueue = "q"

func setup(t *testing.T, o testOpts) *testBundle {
	t.Helper()
	if o.concurrency == 0 {
		o.concurrency = 1
	}
	if o.lease == 0 {
		o.lease = 150 * time.Millisecond
	}
	b := &testBundle{
		backend:    newFakeBackend(t),
		gate:       &health.Gate{},
		lease:      o.lease,
		workers:    &sync.WaitGroup{},
		settleErrs: make(chan error, 1000),
		ended:      make(chan struct{}),
		freeEarly:  o.freeEarly,
	}
	if !o.noLimit {
		b.backend.limit = o.concurrency + o.prefetch
	}
	b.fetchCtx, b.cancelFetch = context.WithCancel(context.Background())
	b.gate.Init(nil)
	b.gate.Start(b.fetchCtx)
	cfg := Config[string]{
		Name:        testQueue,
		Backend:     b.backend,
		Gate:        b.gate,
		Lease:       o.lease,
		Concurrency: o.concurrency,
		Prefetch:    o.prefetch,
		Log:         quietLog,
		Process:     b.process,
		Workers:     b.workers,
	}
	if o.pause {
		b.pause = &health.Gate{}
		b.pause.Init(nil)
		b.pause.Start(b.fetchCtx)
		cfg.Pause = b.pause
	}
	if o.pool != nil {
		b.pauses = make([]*health.Gate, len(o.pool))
		for i := range b.pauses {
			b.pauses[i] = &health.Gate{}
			b.pauses[i].Init(nil)
			b.pauses[i].Start(b.fetchCtx)
		}
		cfg.Name = "pool"
		cfg.Pool = &PoolConfig[string]{
			Names:    o.pool,
			Pauses:   b.pauses,
			Probe:    10 * time.Millisecond,
			HandBack: b.handBack,
		}
	}
	b.queue = New(cfg)
	t.Cleanup(func() {
		close(b.ended)
		b.stop(t)
	})
	return b
}

// process is the platform's Process in small: start the handler's
// context, run the handler, settle (an Ack, or a Requeue on error).
func (b *testBundle) process(_ *jobctx.Timer, f *Delivery[string]) {
	f.Job = string(f.D.Body)
	f.Ctx.Parent = context.Background()
	if f.Start() {
		b.lostAtRun.Add(1)
		return // the job is another worker's now
	}
	n := b.running.Add(1)
	for {
		m := b.maxRunning.Load()
		if n <= m || b.maxRunning.CompareAndSwap(m, n) {
			break
		}
	}
	b.started.Add(1)
	var err error
	if b.handler != nil {
		err = b.handler(&f.Ctx, f)
	}
	b.running.Add(-1)
	f.Ctx.Cancel(context.Canceled)
	if b.freeEarly {
		b.queue.FreeSlot(f)
	}
	var msg *driver.Message
	if err != nil {
		msg = &driver.Message{ID: f.Job, Body: f.D.Body}
	}
	b.settleErrs <- f.Settle(b.backend, quietLog, err == nil, msg, nil)
}

// handBack returns a delivery uncounted, as the platform's handBack does.
func (b *testBundle) handBack(f *Delivery[string]) error {
	b.handedBack.Add(1)
	return f.Settle(b.backend, quietLog, false, &driver.Message{ID: string(f.D.Body), Body: f.D.Body}, nil)
}

// start runs the fetcher, the workers and the lease keeper, as
// Platform.Start does.
func (b *testBundle) start() {
	b.fetchDone = make(chan struct{})
	go func() {
		defer close(b.fetchDone)
		b.queue.Fetch(b.fetchCtx)
	}()
	for range b.queue.Workers() {
		b.workers.Add(1)
		go func() {
			defer b.workers.Done()
			b.queue.Work()
		}()
	}
	kctx, kcancel := context.WithCancel(context.Background())
	b.cancelKeep = kcancel
	b.keepDone = make(chan struct{})
	go func() {
		defer close(b.keepDone)
		KeepLeases(kctx, b.backend, b.lease, quietLog, []*Queue[string]{b.queue})
	}()
}

// stopFetching is the first half of Platform.Stop: the fetcher stops and
// the deliveries claimed ahead are handed back.
func (b *testBundle) stopFetching(t *testing.T) {
	t.Helper()
	b.cancelFetch()
	closed(t, "Fetch to return", b.fetchDone)
	b.queue.HandBackQueued(b.handBack)
}

// stop stops everything start started and waits for it, as Platform.Stop
// does when its handlers finish (idempotent; a test cleanup).
func (b *testBundle) stop(t *testing.T) {
	t.Helper()
	b.cancelFetch()
	if b.fetchDone == nil { // not started
		return
	}
	wait := func(what string, ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(patience):
			t.Errorf("stop: gave up waiting for %s", what)
			return false
		}
	}
	if !wait("Fetch to return", b.fetchDone) {
		return
	}
	b.queue.HandBackQueued(b.handBack)
	workersDone := make(chan struct{})
	go func() {
		b.workers.Wait()
		close(workersDone)
	}()
	if !wait("the workers to return", workersDone) {
		return
	}
	b.cancelKeep()
	wait("KeepLeases to return", b.keepDone)
}

// block waits for ch to close, or for the test to end (so that a failed
// test does not leave its handlers blocked for ever).
func (b *testBundle) block(ch <-chan struct{}) {
	select {
	case <-ch:
	case <-b.ended:
	}
}

func (b *testBundle) held() int {
	h, _ := b.queue.Quiet()
	return h
}

func (b *testBundle) outstanding() (n int) {
	b.backend.snapshot(func() { n = b.backend.outstanding })
	return n
}

func (b *testBundle) acked() (n int) {
	b.backend.snapshot(func() { n = len(b.backend.acked) })
	return n
}

func (b *testBundle) receives() (n int) {
	b.backend.snapshot(func() { n = b.backend.receives })
	return n
}

func TestQueue(t *testing.T) {
	t.Parallel()

	t.Run("WorksEveryJob", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 3, prefetch: 2})
		b.backend.push(testQueue, 50)
		b.start()
		waitFor(t, "every job acked", func() bool { return b.acked() == 50 })
		b.stop(t)
		if n := b.outstanding(); n != 0 {
			t.Errorf("%d deliveries left unsettled", n)
		}
		if h := b.held(); h != 0 {
			t.Errorf("%d deliveries still held after the stop", h)
		}
		close(b.settleErrs)
		for err := range b.settleErrs {
			if err != nil {
				t.Errorf("Settle: %v", err)
			}
		}
	})

	// BackendOverMax: a backend that hands out more than Receive asked
	// for breaks the driver contract; the runner still works every job and
	// stops, its claim slots all back (a job beyond the slots took none).
	t.Run("BackendOverMax", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 2, prefetch: 1, noLimit: true})
		b.backend.overMax = 1
		b.backend.push(testQueue, 40)
		b.start()
		waitFor(t, "every job acked", func() bool { return b.acked() == 40 })
		b.stop(t)
		if h := b.held(); h != 0 {
			t.Errorf("%d deliveries still held after the stop", h)
		}
		if n := len(b.queue.slots); n != b.queue.max {
			t.Errorf("%d claim slots free after the stop, want all %d", n, b.queue.max)
		}
	})

	// ClaimsBoundedByConcurrency: with handlers that block, the fetcher
	// claims exactly Concurrency+Prefetch deliveries and no more; the fake
	// also fails the test on any Receive that asks for more than the free
	// slots. Handlers running at once never exceed Concurrency.
	t.Run("ClaimsBoundedByConcurrency", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name                  string
			concurrency, prefetch int
		}{
			{"NoPrefetch", 2, 0},
			{"Prefetch", 2, 3},
			{"One", 1, 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, testOpts{concurrency: tc.concurrency, prefetch: tc.prefetch})
				limit := tc.concurrency + tc.prefetch
				release := make(chan struct{})
				b.handler = func(ctx context.Context, f *Delivery[string]) error {
					b.block(release)
					return nil
				}
				b.backend.push(testQueue, 4*limit)
				b.start()
				waitFor(t, "the claim slots to fill", func() bool { return b.outstanding() >= limit && b.running.Load() == int32(tc.concurrency) })
				// The fetcher now waits for a slot. Give it room to
				// misbehave: a claim over the bound would show here (this
				// wait can only hide a bug, never fail a correct runner).
				time.Sleep(50 * time.Millisecond)
				if n := b.outstanding(); n != limit {
					t.Errorf("%d deliveries claimed, want %d (Concurrency %d + Prefetch %d)", n, limit, tc.concurrency, tc.prefetch)
				}
				if h := b.held(); h != limit {
					t.Errorf("Quiet reports %d held, want %d", h, limit)
				}
				close(release)
				waitFor(t, "every job acked", func() bool { return b.acked() == 4*limit })
				b.stop(t)
				b.backend.snapshot(func() {
					if b.backend.maxOutstanding > limit {
						t.Errorf("at most %d deliveries held at once, want at most %d", b.backend.maxOutstanding, limit)
					}
				})
				if m := b.maxRunning.Load(); m > int32(tc.concurrency) {
					t.Errorf("%d handlers ran at once, want at most %d", m, tc.concurrency)
				}
			})
		}
	})

	// LeaseExtended: a handler that runs for several leases has its lease
	// extended, with the configured lease, and is never cancelled; so is a
	// delivery claimed ahead that waits for the busy worker.
	t.Run("LeaseExtended", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, prefetch: 1, lease: 90 * time.Millisecond})
		running := make(chan string, 2)
		release := make(chan struct{})
		var cancelled atomic.Bool
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			running <- f.Job
			select {
			case <-release:
			case <-b.ended:
			case <-ctx.Done():
				cancelled.Store(true)
			}
			return nil
		}
		b.backend.push(testQueue, 2)
		b.start()
		first := recv(t, "the first handler", running)
		waitFor(t, "both deliveries claimed", func() bool { return b.held() == 2 })
		// Three extensions of each: both leases outlived by far.
		waitExtends(t, b.backend, 3, "q-1", "q-2")
		close(release)
		second := recv(t, "the second handler", running)
		waitFor(t, "both jobs acked", func() bool { return b.acked() == 2 })
		b.stop(t)
		if first != "q-1" || second != "q-2" {
			t.Errorf("ran %s then %s, want q-1 then q-2", first, second)
		}
		if cancelled.Load() {
			t.Error("a handler whose lease was kept was cancelled")
		}
		b.backend.snapshot(func() {
			for _, l := range b.backend.extendLeases {
				if l != b.lease {
					t.Errorf("Extend asked for a lease of %v, want %v", l, b.lease)
				}
			}
		})
	})

	// LeaseLost: when Extend reports the lease lost, the handler's context
	// is cancelled and its outcome is not reported (Settle returns
	// ErrLeaseLost without calling the backend).
	t.Run("LeaseLost", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{lease: 60 * time.Millisecond, noLimit: true})
		b.backend.extendErr = func(*driver.Delivery) error { return driver.ErrLeaseLost }
		done := make(chan error, 1)
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(ctx.Done())
			done <- context.Cause(ctx)
			return nil
		}
		b.backend.push(testQueue, 1)
		b.start()
		if err := recv(t, "the handler to be cancelled", done); !errors.Is(err, context.Canceled) {
			t.Errorf("the handler's context ended with %v, want context.Canceled", err)
		}
		if err := recv(t, "the settle", b.settleErrs); !errors.Is(err, driver.ErrLeaseLost) {
			t.Errorf("Settle after a lost lease: %v, want ErrLeaseLost", err)
		}
		b.stop(t)
		b.backend.snapshot(func() {
			if b.backend.settleCalls != 0 {
				t.Errorf("the backend was asked to settle a lost delivery %d times", b.backend.settleCalls)
			}
		})
	})

	// ExtendFailsUntilLapsed: an Extend that keeps failing (not with
	// ErrLeaseLost) is retried until the lease has certainly lapsed; then
	// the handler is cancelled and the outcome not reported.
	t.Run("ExtendFailsUntilLapsed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{lease: 60 * time.Millisecond, noLimit: true})
		b.backend.extendErr = func(*driver.Delivery) error { return errors.New("broker unreachable") }
		done := make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(ctx.Done())
			close(done)
			return nil
		}
		b.backend.push(testQueue, 1)
		b.start()
		closed(t, "the handler to be cancelled", done)
		if err := recv(t, "the settle", b.settleErrs); !errors.Is(err, driver.ErrLeaseLost) {
			t.Errorf("Settle after a lapsed lease: %v, want ErrLeaseLost", err)
		}
		b.stop(t)
	})

	// SlowExtendHoldsNoOther: a renewal that does not answer holds up no
	// other delivery's: the keeper renews the others while it waits (the
	// lease of every delivery after a slow one lapsed when the renewals of
	// a sweep went out one after another: TestFaults/PoisonIsolation and
	// SigtermMidJob on a loaded machine).
	t.Run("SlowExtendHoldsNoOther", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 2, lease: 60 * time.Millisecond})
		stuck := make(chan struct{})
		var stuckOnce sync.Once
		var q1Waiting atomic.Bool
		var othersMeanwhile atomic.Int32
		b.backend.extendErr = func(d *driver.Delivery) error {
			if string(d.Body) == "q-1" {
				q1Waiting.Store(true)
				b.block(stuck) // a broker that does not answer, whatever the ctx says
				q1Waiting.Store(false)
				return nil
			}
			if q1Waiting.Load() {
				othersMeanwhile.Add(1)
			}
			return nil
		}
		t.Cleanup(func() { stuckOnce.Do(func() { close(stuck) }) })
		release := make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(release)
			return nil
		}
		b.backend.push(testQueue, 2)
		b.start()
		waitFor(t, "q-2 renewed twice while q-1's renewal waits", func() bool { return othersMeanwhile.Load() >= 2 })
		stuckOnce.Do(func() { close(stuck) })
		close(release)
		waitFor(t, "both jobs acked", func() bool { return b.acked() == 2 })
		b.stop(t)
	})

	// RenewalsBounded: a sweep of many held deliveries has at most
	// MaxRenewals renewals under way at once, and renews them all.
	t.Run("RenewalsBounded", func(t *testing.T) {
		t.Parallel()
		const n = 3 * MaxRenewals
		b := setup(t, testOpts{concurrency: n, lease: 90 * time.Millisecond})
		var now, peak, renewed atomic.Int32
		b.backend.extendErr = func(d *driver.Delivery) error {
			c := now.Add(1)
			for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
			}
			time.Sleep(5 * time.Millisecond) // a round trip
			now.Add(-1)
			renewed.Add(1)
			return nil
		}
		release := make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(release)
			return nil
		}
		b.backend.push(testQueue, n)
		b.start()
		waitFor(t, "every delivery renewed twice", func() bool { return renewed.Load() >= 2*n })
		close(release)
		waitFor(t, "every job acked", func() bool { return b.acked() == n })
		b.stop(t)
		if p := peak.Load(); p > MaxRenewals {
			t.Errorf("%d renewals under way at once; at most MaxRenewals (%d)", p, MaxRenewals)
		}
	})

	// LostBeforeStart: a delivery claimed ahead whose lease is lost while it
	// waits for a worker is not run (Start reports it lost).
	t.Run("LostBeforeStart", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, prefetch: 1, lease: 60 * time.Millisecond, noLimit: true})
		b.backend.extendErr = func(d *driver.Delivery) error {
			if string(d.Body) == "q-2" {
				return driver.ErrLeaseLost
			}
			return nil
		}
		release := make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(release)
			return nil
		}
		b.backend.push(testQueue, 2)
		b.start()
		waitFor(t, "q-2 to lose its lease", func() bool {
			for _, f := range b.queue.Held() {
				if string(f.D.Body) == "q-2" {
					f.mu.Lock()
					lost := f.lost
					f.mu.Unlock()
					return lost
				}
			}
			return false
		})
		close(release)
		waitFor(t, "q-2 let go", func() bool { return b.lostAtRun.Load() == 1 && b.held() == 0 })
		b.stop(t)
		if n := b.started.Load(); n != 1 {
			t.Errorf("%d handlers ran, want 1 (q-2 lost its lease before it started)", n)
		}
	})

	// StopHandsBackAndWaits: the stop of Platform.Stop. The fetcher returns
	// when its context ends and closes the work channel; HandBackQueued
	// hands back, unstarted, what was claimed ahead; the running handler is
	// not interrupted and its worker returns only once it is done.
	t.Run("StopHandsBackAndWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, prefetch: 2})
		release := make(chan struct{})
		var ctxEnded atomic.Bool
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(release)
			ctxEnded.Store(ctx.Err() != nil)
			return nil
		}
		b.backend.push(testQueue, 5)
		b.start()
		waitFor(t, "one running and two claimed ahead", func() bool { return b.running.Load() == 1 && b.held() >= 3 })
		b.stopFetching(t)
		if n := b.handedBack.Load(); n != 2 {
			t.Errorf("%d deliveries handed back, want the 2 claimed ahead", n)
		}
		if h := b.held(); h != 1 {
			t.Errorf("%d deliveries held after the hand-back, want the running one", h)
		}
		workersDone := make(chan struct{})
		go func() {
			b.workers.Wait()
			close(workersDone)
		}()
		select {
		case <-workersDone:
			t.Fatal("the workers returned while a handler was running")
		case <-time.After(20 * time.Millisecond): // may only hide a bug
		}
		close(release)
		closed(t, "the workers to return", workersDone)
		if ctxEnded.Load() {
			t.Error("the running handler's context was cancelled by the stop")
		}
		if n := b.started.Load(); n != 1 {
			t.Errorf("%d handlers started, want 1", n)
		}
		b.backend.snapshot(func() {
			if len(b.backend.acked) != 1 || len(b.backend.requeued) != 2 || b.backend.outstanding != 0 {
				t.Errorf("acked %v, requeued %v, %d outstanding: want 1 acked, 2 handed back, none outstanding",
					b.backend.acked, b.backend.requeued, b.backend.outstanding)
			}
			if r := len(b.backend.ready[testQueue]); r != 4 {
				t.Errorf("%d jobs ready after the stop, want 4", r)
			}
		})
		b.stop(t)
	})

	// StopGivesUp: the end of Platform.Stop when its context ends: the
	// running handler is cancelled and handed back; its own Settle then
	// finds it settled (ErrSettled) and the backend hears of it once.
	t.Run("StopGivesUp", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1})
		handedBack := make(chan struct{})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			b.block(ctx.Done()) // a handler that honours its context...
			b.block(handedBack) // ...and returns after the hand-back (else it may settle first)
			return nil
		}
		b.backend.push(testQueue, 1)
		b.start()
		waitFor(t, "the handler to run", func() bool { return b.running.Load() == 1 })
		b.stopFetching(t)
		for _, f := range b.queue.Held() {
			f.CancelHandler()
			if err := b.handBack(f); err != nil {
				t.Errorf("hand-back: %v", err)
			}
		}
		close(handedBack)
		if err := recv(t, "the handler's settle", b.settleErrs); !errors.Is(err, ErrSettled) {
			t.Errorf("the handler's Settle after the hand-back: %v, want ErrSettled", err)
		}
		b.stop(t)
		b.backend.snapshot(func() {
			if b.backend.settleCalls != 1 || len(b.backend.requeued) != 1 {
				t.Errorf("%d settles (requeued %v), want the hand-back alone", b.backend.settleCalls, b.backend.requeued)
			}
		})
	})

	// ReceiveErrorBacksOff: a failing Receive is tried again after a wait
	// that doubles from 50 ms: no busy loop. The gaps are lower bounds,
	// which load cannot break.
	t.Run("ReceiveErrorBacksOff", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{})
		const failures = 4
		b.backend.receiveErr = func(call int) error {
			if call <= failures {
				return errReceive
			}
			return nil
		}
		b.backend.push(testQueue, 1)
		b.start()
		waitFor(t, "the job acked after the failures", func() bool { return b.acked() == 1 })
		b.stop(t)
		b.backend.snapshot(func() {
			times := b.backend.receiveTimes
			if len(times) < failures+1 {
				t.Fatalf("%d Receive calls, want at least %d", len(times), failures+1)
			}
			want := 50 * time.Millisecond
			for i := 1; i <= failures; i++ {
				if gap := times[i].Sub(times[i-1]); gap < want {
					t.Errorf("Receive %d came %v after failure %d, want at least %v", i+1, gap, i, want)
				}
				want *= 2
			}
		})
	})

	// ReceiveClosed: a backend closed under the fetcher stops it (no
	// retry) and the workers end.
	t.Run("ReceiveClosed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 2})
		b.backend.receiveErr = func(int) error { return driver.ErrClosed }
		b.start()
		closed(t, "Fetch to return on ErrClosed", b.fetchDone)
		done := make(chan struct{})
		go func() {
			b.workers.Wait()
			close(done)
		}()
		closed(t, "the workers to return", done)
		if n := b.receives(); n != 1 {
			t.Errorf("%d Receive calls, want 1", n)
		}
	})

	// PauseStopsClaiming: holding the queue's pause gate ends a Receive
	// that waits and claims nothing until it is released.
	t.Run("PauseStopsClaiming", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 2, pause: true})
		b.start()
		waitFor(t, "Receive to wait", func() bool { return b.receives() == 1 })
		if b.queue.Paused(testQueue) {
			t.Error("Paused before the pause")
		}
		if !b.queue.Receiving(testQueue) || b.queue.Receiving("other") {
			t.Errorf("Receiving: %v, of another queue %v; want true, false", b.queue.Receiving(testQueue), b.queue.Receiving("other"))
		}
		b.pause.Hold()
		if err := recv(t, "the waiting Receive to end", b.backend.receiveEnded); !errors.Is(err, context.Canceled) {
			t.Errorf("the waiting Receive ended with %v, want context.Canceled", err)
		}
		waitFor(t, "the ended Receive uncounted", func() bool { return !b.queue.Receiving(testQueue) })
		if !b.queue.Paused(testQueue) {
			t.Error("not Paused while the pause gate is held")
		}
		b.backend.push(testQueue, 3)
		time.Sleep(50 * time.Millisecond) // may only hide a bug
		if n := b.receives(); n != 1 {
			t.Errorf("%d Receive calls while paused, want none after the first", n-1)
		}
		if n := b.outstanding(); n != 0 {
			t.Errorf("%d deliveries claimed while paused", n)
		}
		b.pause.Release()
		waitFor(t, "the jobs worked after the pause", func() bool { return b.acked() == 3 })
	})

	// GateClosedStopsClaiming: a failed health check (the gate closes)
	// ends a waiting Receive and claims nothing until health returns.
	t.Run("GateClosedStopsClaiming", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 2})
		b.start()
		waitFor(t, "Receive to wait", func() bool { return b.receives() == 1 })
		b.gate.Hold()
		if err := recv(t, "the waiting Receive to end", b.backend.receiveEnded); !errors.Is(err, context.Canceled) {
			t.Errorf("the waiting Receive ended with %v, want context.Canceled", err)
		}
		b.backend.push(testQueue, 3)
		time.Sleep(50 * time.Millisecond) // may only hide a bug
		if n := b.receives(); n != 1 {
			t.Errorf("%d Receive calls while the gate was closed, want none after the first", n-1)
		}
		b.gate.Release()
		waitFor(t, "the jobs worked after the gate opened", func() bool { return b.acked() == 3 })
	})

	// PanicInProcess: a panic outside the handler is recovered, the
	// delivery let go unsettled (its slot freed) and the worker goes on.
	t.Run("PanicInProcess", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, noLimit: true})
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			if f.Job == "q-1" {
				panic("boom")
			}
			return nil
		}
		b.backend.push(testQueue, 3)
		b.start()
		waitFor(t, "the other jobs acked", func() bool { return b.acked() == 2 })
		b.stop(t)
		if h := b.held(); h != 0 {
			t.Errorf("%d deliveries still held", h)
		}
		if n := b.outstanding(); n != 1 {
			t.Errorf("%d deliveries unsettled, want the one that panicked", n)
		}
	})

	// GoexitReplacesWorker: a handler that calls runtime.Goexit ends its
	// worker; a replacement is started (counted in Workers) and works the
	// rest.
	t.Run("GoexitReplacesWorker", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testOpts{concurrency: 1, noLimit: true})
		var cancelled atomic.Bool
		b.handler = func(ctx context.Context, f *Delivery[string]) error {
			if f.Job == "q-1" {
				context.AfterFunc(ctx, func() { cancelled.Store(true) })
				runtime.Goexit()
			}
			return nil
		}
		b.backend.push(testQueue, 3)
		b.start()
		waitFor(t, "the other jobs acked", func() bool { return b.acked() == 2 })
		b.stop(t) // waits on Workers: the replacement must end too
		if !cancelled.Load() {
			waitFor(t, "the Goexit handler's context cancelled", cancelled.Load)
		}
		if n := b.outstanding(); n != 1 {
			t.Errorf("%d deliveries unsettled, want the one whose handler exited", n)
		}
	})
}

// TestSettleOverlapsNextHandler: a worker gives its handler turn back when
// its handler returns, so while the first job's settle waits for the broker
// the next jobs run; still one handler at a time at Concurrency 1, and in
// the order claimed.
func TestSettleOverlapsNextHandler(t *testing.T) {
	b := setup(t, testOpts{concurrency: 1, prefetch: 1, noLimit: true, freeEarly: true})
	release := make(chan struct{})
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(let) // before the bundle's stop, which waits for the workers
	b.backend.ackHook = func(id string) {
		if id == testQueue+"-1" {
			<-release // the broker has not answered the first settle yet
		}
	}
	var mu sync.Mutex
	var order []string
	b.handler = func(_ context.Context, f *Delivery[string]) error {
		mu.Lock()
		order = append(order, f.Job)
		mu.Unlock()
		time.Sleep(5 * time.Millisecond) // room for a second handler, were one let in
		return nil
	}
	b.backend.push(testQueue, 3)
	b.start()
	waitFor(t, "the next jobs to run while the first's settle waits", func() bool { return b.started.Load() == 3 })
	let()
	waitFor(t, "every job to be acked", func() bool { return b.acked() == 3 })
	if m := b.maxRunning.Load(); m != 1 {
		t.Errorf("%d handlers ran at once at Concurrency 1", m)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"q-1", "q-2", "q-3"}; !slices.Equal(order, want) {
		t.Errorf("ran %q, want the claimed order %q", order, want)
	}
}

// TestDelivery covers Delivery's own rules.
func TestDelivery(t *testing.T) {
	t.Parallel()

	t.Run("SettleOnce", func(t *testing.T) {
		t.Parallel()
		be := newFakeBackend(t)
		be.push(testQueue, 1)
		ds, err := be.Receive(context.Background(), testQueue, 1, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		f := &Delivery[string]{D: ds[0]}
		if err := f.Settle(be, quietLog, true, nil, nil); err != nil {
			t.Fatalf("first Settle: %v", err)
		}
		if err := f.Settle(be, quietLog, true, nil, nil); !errors.Is(err, ErrSettled) {
			t.Errorf("second Settle: %v, want ErrSettled", err)
		}
		if be.settleCalls != 1 {
			t.Errorf("%d backend settles, want 1", be.settleCalls)
		}
	})

	t.Run("CancelHandlerOnlyOnceStarted", func(t *testing.T) {
		t.Parallel()
		f := &Delivery[string]{}
		f.Ctx.Parent = context.Background()
		f.CancelHandler()
		if f.Ctx.Err() != nil {
			t.Error("CancelHandler cancelled a handler that had not started")
		}
		if f.Start() {
			t.Error("Start reported a lost lease")
		}
		f.CancelHandler()
		if !errors.Is(f.Ctx.Err(), context.Canceled) {
			t.Errorf("after CancelHandler the context's error is %v", f.Ctx.Err())
		}
	})
}

// TestNoGoroutineLeft: once the fetcher's context ends, the hand-back is
// done and the workers have finished, no goroutine of the runner is left:
// not a fetcher, a worker (a Goexit replacement included), a pool's
// sentinel nor the lease keeper. Not parallel: it counts every goroutine in
// the runner's code.
func TestNoGoroutineLeft(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts testOpts
	}{
		{"Queue", testOpts{concurrency: 3, prefetch: 1, pause: true, noLimit: true}},
		{"Pool", testOpts{concurrency: 2, pool: []string{"a", "b", "c"}, noLimit: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			waitNoneLeft(t, "before the test") // an earlier test's may be on their way out
			b := setup(t, tc.opts)
			release := make(chan struct{})
			b.handler = func(ctx context.Context, f *Delivery[string]) error {
				if f.Job == "a-1" || f.Job == "q-1" {
					runtime.Goexit() // a replacement worker
				}
				b.block(release)
				return nil
			}
			names := b.queue.Names()
			for _, n := range names {
				b.backend.push(n, 2)
			}
			b.start()
			waitFor(t, "the jobs claimed", func() bool { return int(b.started.Load()) >= 2 })
			close(release)
			waitFor(t, "the jobs acked", func() bool { return b.acked() == 2*len(names)-1 })
			// A Receive waits on every queue (a pool's sentinels).
			waitFor(t, "a Receive waiting on every queue", func() bool {
				n := 0
				b.backend.snapshot(func() {
					for _, name := range names {
						if b.backend.blocked[name] > 0 {
							n++
						}
					}
				})
				return n == len(names)
			})
			b.stop(t)
			waitNoneLeft(t, "after the stop")
		})
	}
}

// waitNoneLeft waits until no goroutine runs the runner's code, failing the
// test after patience.
func waitNoneLeft(t *testing.T, when string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		left := leftGoroutines()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left in the runner %s:\n%s", len(left), when, strings.Join(left, "\n\n"))
		}
		time.Sleep(time.Millisecond)
	}
}
