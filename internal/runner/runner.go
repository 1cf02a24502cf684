// Package runner is the platform's machinery for working a queue: a fetcher
// that claims deliveries while claim slots are free, workers that run them
// one at a time, the lease keeper, and settling a delivery exactly once; and
// the keeper of a dead letter's hold (KeepDead). It decides nothing about a
// job: the platform's Process function does.
package runner

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/health"
	"github.com/asyncplatform/asyncplatform/internal/jobctx"
)

// Delivery is one delivery held by this worker, with its decoded job J.
type Delivery[J any] struct {
	D   *driver.Delivery
	Job J // the worker's decoded job; the handler gets &Job

	Ctx jobctx.Context // the handler's context, set before Start

	mu      sync.Mutex // serialises backend calls on D
	renewed mono       // when the lease was last started or extended
	started bool       // Ctx is set: CancelHandler cancels it
	freed   bool       // its claim slot was given back before release (worker goroutine only)
	turn    bool       // its worker holds a handler turn (worker goroutine only)
	done    bool       // settled (or given up): no more backend calls on D
	lost    bool       // the lease was lost while held
}

// Start marks the handler's context as set (Ctx must be ready) and reports
// whether the lease was lost while the delivery waited: the job is then
// another worker's and must not run here.
func (f *Delivery[J]) Start() (lost bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = true
	return f.lost
}

// CancelHandler cancels the handler's context if it has started.
func (f *Delivery[J]) CancelHandler() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancelHandler()
}

func (f *Delivery[J]) cancelHandler() {
	if f.started {
		f.Ctx.Cancel(context.Canceled)
	}
}

// ErrSettled is returned by Settle for a delivery already settled (Stop
// handed it back first).
var ErrSettled = errors.New("delivery already settled")

// Settle reports an outcome for the delivery, once: an Ack, or else a
// Requeue of msg, or else (rec non-nil) a DeadLetter of rec. It takes no
// deadline of its own: backends bound their own network calls, and a per-job
// timer costs more than the rest of the hot path.
func (f *Delivery[J]) Settle(b driver.Backend, log *slog.Logger, ack bool, msg *driver.Message, rec *driver.DeadMessage) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return ErrSettled
	}
	f.done = true
	if f.lost {
		return driver.ErrLeaseLost
	}
	ctx := context.Background()
	var err error
	switch {
	case ack:
		err = b.Ack(ctx, f.D)
	case msg != nil:
		err = b.Requeue(ctx, f.D, *msg)
	default:
		err = b.DeadLetter(ctx, f.D, *rec)
	}
	switch {
	case err == nil:
	case errors.Is(err, driver.ErrLeaseLost):
		log.Warn("asyncplatform: lease lost before the outcome was reported; the job will be delivered again", "queue", f.D.Queue, "error", err)
	default:
		log.Error("asyncplatform: reporting an outcome failed; the job will come back after its lease", "queue", f.D.Queue, "error", err)
	}
	return err
}

// Config configures a Queue.
type Config[J any] struct {
	Name    string
	Backend driver.Backend
	Gate    *health.Gate
	// Pause, when set, is this queue's own gate (Platform.Pause): while it
	// is held the fetcher claims nothing, as while Gate is closed.
	Pause       *health.Gate
	Lease       time.Duration
	Concurrency int
	Prefetch    int
	// LocalSettle: the backend settles with no round trip to wait for
	// (driver.Capabilities.LocalSettle), so one worker a handler turn
	// runs its jobs one after another (see Queue).
	LocalSettle bool
	Log         *slog.Logger
	// Process decides and settles one delivery; Work calls it on a worker
	// goroutine with that goroutine's timer.
	Process func(t *jobctx.Timer, f *Delivery[J])
	// Pool, when set, makes this runner a pool of several queues (see
	// PoolConfig); Name and Pause are then unused but for logs.
	Pool *PoolConfig[J]
	// Workers counts worker goroutines; a worker whose handler called
	// runtime.Goexit is replaced under it.
	Workers *sync.WaitGroup
}

// Queue works one queue: a fetcher claims up to Concurrency+Prefetch
// deliveries and Workers() workers run them, at most Concurrency handlers
// at once.
//
// A worker takes a handler turn before it takes a delivery, and gives it
// back when the handler returns (FreeSlot), before the outcome is reported:
// while one worker waits for the broker to confirm a settle, another runs
// the next job. So the settle's round trip does not bound a queue at
// Concurrency jobs a round trip. Deliveries still leave the work channel in
// the order they were claimed, taken by one turn holder at a time when
// Concurrency is 1. With Config.LocalSettle there is no round trip to
// overlap: one worker a turn, and no turns are taken.
type Queue[J any] struct {
	cfg   Config[J]
	max   int
	turns chan struct{}     // one token per handler that may start
	slots chan struct{}     // one token per free claim slot
	jobs  chan *Delivery[J] // claimed, waiting for a worker
	wake  chan struct{}     // a pool's pause gates changed

	receiving atomic.Int32   // the fetcher is in Receive or adding what it got to held
	poolRecv  []atomic.Int32 // per pool queue: a Receive of it runs, or passes on what it got

	mu   sync.Mutex
	held map[*Delivery[J]]struct{} // claimed and not yet released
}

// New returns a queue runner; Fetch and Work start it.
func New[J any](cfg Config[J]) *Queue[J] {
	q := &Queue[J]{cfg: cfg, max: cfg.Concurrency + cfg.Prefetch, held: map[*Delivery[J]]struct{}{}}
	q.slots = make(chan struct{}, q.max)
	for range q.max {
		q.slots <- struct{}{}
	}
	q.jobs = make(chan *Delivery[J], q.max)
	q.turns = make(chan struct{}, cfg.Concurrency)
	for range cfg.Concurrency {
		q.turns <- struct{}{}
	}
	q.wake = make(chan struct{}, 1)
	if cfg.Pool != nil {
		q.poolRecv = make([]atomic.Int32, len(cfg.Pool.Names))
	}
	return q
}

// Concurrency is how many handlers of the runner run at once at most.
func (q *Queue[J]) Concurrency() int { return q.cfg.Concurrency }

// Workers is how many goroutines must run Work: two a handler turn, so
// that one reports its job's outcome while the other runs the next job;
// one with Config.LocalSettle.
func (q *Queue[J]) Workers() int {
	if q.cfg.LocalSettle {
		return q.cfg.Concurrency
	}
	return 2 * q.cfg.Concurrency
}

// Name is the queue's name.
func (q *Queue[J]) Name() string { return q.cfg.Name }

// Fetch claims deliveries while there are free slots, until ctx ends; then
// it closes the work channel.
func (q *Queue[J]) Fetch(ctx context.Context) {
	if q.cfg.Pool != nil {
		q.fetchPool(ctx)
		return
	}
	defer close(q.jobs)
	log := q.cfg.Log
	retry := 50 * time.Millisecond
	var m merged
	defer m.stop()
	for {
		rctx := q.cfg.Gate.Wait(ctx)
		if rctx == nil {
			return
		}
		if q.cfg.Pause != nil {
			pctx := q.cfg.Pause.Wait(rctx)
			if pctx == nil {
				continue // health lost or ctx ended while paused
			}
			rctx = m.of(rctx, pctx)
		}
		select {
		case <-q.slots:
		case <-rctx.Done():
			continue
		}
		n := 1
	more:
		for n < q.max {
			select {
			case <-q.slots:
				n++
			default:
				break more
			}
		}
		q.receiving.Add(1)
		if rctx.Err() != nil || !q.cfg.Gate.OK() || !q.open() { // the gate closed meanwhile (a suspect runs alone, a pause): claim nothing
			for range n {
				q.slots <- struct{}{}
			}
			q.receiving.Add(-1)
			continue
		}
		ds, err := q.cfg.Backend.Receive(rctx, q.cfg.Name, n, q.cfg.Lease)
		for range n - len(ds) {
			q.slots <- struct{}{}
		}
		if len(ds) > n {
			log.Error("asyncplatform: the backend handed out more deliveries than Receive asked for (a driver defect); running them all", "queue", q.cfg.Name, "asked", n, "got", len(ds))
		}
		now := time.Now()
		for i, d := range ds {
			// A delivery beyond the n asked for took no claim slot, so it
			// gives none back.
			f := &Delivery[J]{D: d, renewed: monoOf(now), freed: i >= n}
			q.mu.Lock()
			q.held[f] = struct{}{}
			q.mu.Unlock()
			q.jobs <- f
		}
		q.receiving.Add(-1)
		switch {
		case err == nil:
			retry = 50 * time.Millisecond
		case ctx.Err() != nil:
			return
		case rctx.Err() != nil:
			continue // health lost: wait for it to return
		case errors.Is(err, driver.ErrClosed):
			log.Error("asyncplatform: backend closed; this queue stops taking jobs", "queue", q.cfg.Name, "error", err)
			return
		default:
			log.Warn("asyncplatform: receive failed; retrying", "queue", q.cfg.Name, "error", err, "in", retry)
			select {
			case <-time.After(retry):
			case <-ctx.Done():
				return
			}
			retry = min(retry*2, maxReceiveRetry)
		}
	}
}

// maxReceiveRetry bounds the wait before a failed Receive is tried again
// (from 50 ms, doubling): a broker back from a failover is used again
// within it.
const maxReceiveRetry = 2 * time.Second

// Paused reports whether the named queue of this runner is paused (its
// gate, Config.Pause or the pool's, is held).
func (q *Queue[J]) Paused(name string) bool {
	if pc := q.cfg.Pool; pc != nil {
		for i, n := range pc.Names {
			if n == name {
				return !pc.open(i)
			}
		}
		return false
	}
	return !q.open()
}

func (q *Queue[J]) open() bool { return q.cfg.Pause == nil || q.cfg.Pause.OK() }

// merged is a context that ends when either of two others does, kept while
// both stay the same so the fetch loop allocates nothing per claim.
type merged struct {
	a, b   context.Context
	ctx    context.Context
	cancel func()
}

func (m *merged) of(a, b context.Context) context.Context {
	if a == m.a && b == m.b {
		return m.ctx
	}
	m.stop()
	ctx, cancel := context.WithCancel(a)
	stop := context.AfterFunc(b, cancel)
	m.a, m.b, m.ctx = a, b, ctx
	m.cancel = func() { stop(); cancel() }
	return ctx
}

func (m *merged) stop() {
	if m.cancel != nil {
		m.cancel()
		m.cancel = nil
	}
}

// Work runs deliveries until the fetcher closes the work channel: it
// takes a handler turn, then the next delivery (see Queue).
func (q *Queue[J]) Work() {
	t := &jobctx.Timer{}
	defer t.Stop()
	if q.cfg.LocalSettle { // as many workers as turns: each always holds one
		for f := range q.jobs {
			q.runOne(t, f)
		}
		return
	}
	for {
		<-q.turns
		f, ok := <-q.jobs
		if !ok {
			q.turns <- struct{}{} // for the next worker to see the close
			return
		}
		f.turn = true
		q.runOne(t, f)
	}
}

// runOne processes one delivery. A panic outside the handler (a hook, or a
// bug) is logged and the worker goes on; a handler that calls
// runtime.Goexit ends this goroutine, so a replacement is started. Either
// way the delivery is let go unsettled: its lease lapses and it comes back
// with a crash counted, so a job that does this every time ends poisoned.
func (q *Queue[J]) runOne(t *jobctx.Timer, f *Delivery[J]) {
	normal := false
	defer func() {
		v := recover()
		if v != nil {
			q.cfg.Log.Error("asyncplatform: panic while processing a job; it comes back after its lease", "queue", q.cfg.Name, "panic", v, "stack", string(debug.Stack()))
		}
		if !normal { // the handler's context must not outlive its attempt
			t.End()
			f.CancelHandler()
		}
		q.release(f)
		if v == nil && !normal { // runtime.Goexit
			q.cfg.Log.Error("asyncplatform: a handler called runtime.Goexit; its job comes back after its lease", "queue", q.cfg.Name)
			q.cfg.Workers.Add(1)
			go func() {
				defer q.cfg.Workers.Done()
				q.Work()
			}()
		}
	}()
	q.cfg.Process(t, f)
	normal = true
}

// release forgets a delivery and frees its claim slot.
func (q *Queue[J]) release(f *Delivery[J]) {
	q.mu.Lock()
	delete(q.held, f)
	q.mu.Unlock()
	q.FreeSlot(f)
}

// FreeSlot gives f's claim slot back, once, and its worker's handler turn.
// The worker calls it as soon as the handler returns, so that the fetcher
// claims the next jobs, and another worker runs the next one, while the
// outcome is reported instead of after: a claim, a handler and a settle
// overlap rather than follow each other. The deliveries held at once are
// then at most Concurrency + Prefetch, plus up to 2 × Concurrency being
// settled (Concurrency with Config.LocalSettle). Only the goroutine that owns f (its worker, or whoever took it
// off the work channel to hand it back) may call it.
func (q *Queue[J]) FreeSlot(f *Delivery[J]) {
	if !f.freed {
		f.freed = true
		q.slots <- struct{}{}
	}
	if f.turn {
		f.turn = false
		q.turns <- struct{}{}
	}
}

// HandBackQueued hands back, at once, the deliveries claimed ahead and not
// started: those waiting in the work channel, which whoever takes one off
// the channel owns. Stop calls it after Fetch has returned; a suspect's
// isolation calls it while the gate is held.
func (q *Queue[J]) HandBackQueued(handBack func(*Delivery[J]) error) {
	for {
		select {
		case f, ok := <-q.jobs:
			if !ok {
				return
			}
			_ = handBack(f)
			q.release(f)
		default:
			return
		}
	}
}

// Quiet reports how many deliveries are held and whether the fetcher is
// taking more.
func (q *Queue[J]) Quiet() (held int, receiving bool) {
	q.mu.Lock()
	held = len(q.held)
	q.mu.Unlock()
	return held, q.receiving.Load() > 0
}

// Receiving reports whether a Receive of the named queue may be running, or
// passing on what it got. Counted before the queue's pause gate is read, so
// a caller that held the gate and then sees false knows that no Receive of
// the queue runs until the gate opens again.
func (q *Queue[J]) Receiving(name string) bool {
	if pc := q.cfg.Pool; pc != nil {
		for i, n := range pc.Names {
			if n == name {
				return q.poolRecv[i].Load() > 0
			}
		}
		return false
	}
	return name == q.cfg.Name && q.receiving.Load() > 0
}

// Held returns the deliveries claimed and not yet released.
func (q *Queue[J]) Held() []*Delivery[J] {
	q.mu.Lock()
	defer q.mu.Unlock()
	fs := make([]*Delivery[J], 0, len(q.held))
	for f := range q.held {
		fs = append(fs, f)
	}
	return fs
}

// KeepLeases extends the lease of every held delivery whose lease is more
// than a third spent, until ctx ends. Renewals run side by side, at most
// MaxRenewals at once, so that a sweep costs a few broker round trips, not
// one per held delivery (in turn, 20 deliveries under a 1 s lease lapse once
// a round trip takes 30 ms), and a slow one holds up no other; the bound
// keeps a sweep of many deliveries from reaching the broker as one burst.
// A delivery whose renewal is still under way is left to it. KeepLeases
// returns once the renewals it started have ended (each is bounded by a
// third of the lease).
func KeepLeases[J any](ctx context.Context, b driver.Backend, lease time.Duration, log *slog.Logger, queues []*Queue[J]) {
	every := lease / 3
	t := time.NewTicker(max(every/2, time.Millisecond))
	defer t.Stop()
	var renewing sync.WaitGroup
	defer renewing.Wait()
	slots := make(chan struct{}, MaxRenewals)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, q := range queues {
				for _, f := range q.Held() {
					if !f.due(now, every) {
						continue
					}
					select {
					case slots <- struct{}{}:
					case <-ctx.Done():
						f.mu.Unlock() // due left it locked for extend
						return
					}
					renewing.Go(func() {
						defer func() { <-slots }()
						f.extend(b, lease, log, now, every)
					})
				}
			}
		}
	}
}

// MaxRenewals is how many lease renewals KeepLeases has under way at once.
const MaxRenewals = 8

// due reports whether f's lease needs renewing at now. When it does, f.mu
// is left locked for extend, which unlocks it; a delivery being settled or
// renewed (f.mu held) is not due.
func (f *Delivery[J]) due(now time.Time, every time.Duration) bool {
	if !f.mu.TryLock() {
		return false // busy settling or renewing; never wait for one slow call
	}
	if f.done || f.lost || now.Sub(f.renewed.time()) < every {
		f.mu.Unlock()
		return false
	}
	return true
}

// extend renews f's lease; f.mu is held (see due) and is unlocked on return.
func (f *Delivery[J]) extend(b driver.Backend, lease time.Duration, log *slog.Logger, now time.Time, every time.Duration) {
	defer f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), every)
	defer cancel()
	err := b.Extend(ctx, f.D, lease)
	switch {
	case err == nil:
		f.renewed = monoOf(now)
	case errors.Is(err, driver.ErrLeaseLost):
		f.lost = true
		f.cancelHandler()
		log.Warn("asyncplatform: lease lost; the handler is cancelled and the job will be delivered again", "queue", f.D.Queue, "error", err)
	case now.Sub(f.renewed.time()) >= lease:
		// The lease has certainly lapsed: the job may be running elsewhere.
		f.lost = true
		f.cancelHandler()
		log.Warn("asyncplatform: could not extend a lease before it lapsed; the handler is cancelled and the job will be delivered again", "queue", f.D.Queue, "error", err)
	default:
		log.Warn("asyncplatform: extending a lease failed; will retry", "queue", f.D.Queue, "error", err)
	}
}

// mono is a time as the monotonic clock's nanoseconds since epoch: 8 bytes
// where a time.Time takes 24, so a Delivery stays in its size class.
type mono int64

// epoch is the runner's origin of mono times, set once at start-up.
var epoch = time.Now()

func monoOf(t time.Time) mono { return mono(t.Sub(epoch)) }

func (m mono) time() time.Time { return epoch.Add(time.Duration(m)) }
