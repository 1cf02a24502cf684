package admit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/flow"
)

// How a process takes the starts of a cluster-wide rate: it reserves them
// in batches (one store write each), each start due within rateWait: a
// start for each job waiting for one, and as many more as the jobs that
// came in the last demandWindow would take in half the time before the
// batch's starts go stale (the grace) or until the next batch could be
// back (a round trip), at most maxRateBatch. A job waits in its worker for its start, up to
// rateWait. While the rate holds jobs back (a batch had starts due later
// than at once, or none), a job that finds no start reserved reserves a
// batch while no more than half its queue's workers wait so, and is
// requeued otherwise: so at most about three quarters of a queue's workers
// wait for a type's starts. While it does not, every job waits for the
// batch being reserved: a round trip, not a requeue.
//
// While the rate holds no job back, the next batch is reserved ahead: once
// a job takes a start that leaves half its batch or less, or no more than
// the jobs of a round trip would take, a background reservation (one at a
// time, given the Admit's store timeout) reserves the next batch, kept
// behind the current one until it runs out, so that no job waits for the
// store. A batch reserved ahead is an ordinary batch: timed from when it
// is expected back, its starts handed out in order and dropped once late
// by more than the grace, so the limit is passed no more than without it.
// Its error is not reported: the next job that finds no start reserves a
// batch itself and meets the error then.
//
// A job requeued is offered again when its start is projected to come: the
// first refused after the next start the limit could give, each one after
// an interval after the one before, at most maxProjection ahead, so a
// backlog held back by the rate comes back at about the rate, whatever its
// size. The projection starts again from the limit's next start once a
// reserved start found no job to take it (the jobs projected are gone).
const (
	rateWait      = time.Second
	maxRateBatch  = 1024
	demandWindow  = 100 * time.Millisecond
	maxProjection = time.Hour
)

// rateLine is this process's share of a job type's cluster-wide rate:
// starts reserved in the store a batch at a time (flow.Rate.Reserve), and
// handed here, in order, to the jobs that come, each waiting for its
// start's time (or the batch's, for starts a burst had left). A start no
// job took within grace of that time is dropped (it is lost to every
// process); one taken late, up to grace, lets the limit be passed by at
// most grace/interval starts over any span of time.
type rateLine struct {
	rate       *flow.Rate
	grace      time.Duration
	waiting    atomic.Int32 // jobs waiting here for their starts' time
	pending    atomic.Int32 // jobs waiting for a batch to be reserved
	rtt        atomic.Int64 // ns: the expected round trip of a Reserve
	rttLow     atomic.Int64 // ns: the shortest recent round trip, rising towards longer ones
	lastExpect atomic.Int64 // Unix ns: the latest time a batch was timed from
	holding    atomic.Bool  // the last batch had starts not due at once, or none

	reserving chan struct{} // held by the worker reserving a batch, or by a reservation ahead
	stalls    atomic.Int64  // jobs that found no start reserved and waited for a batch

	bgMu     sync.Mutex      // orders bg.Add against stop's bg.Wait
	bg       sync.WaitGroup  // the reservation ahead running, if any
	bgCtx    context.Context // ends at stop: a reservation ahead running is cut short
	bgCancel context.CancelFunc
	stopped  bool // stop was called: no reservation ahead starts

	mu       sync.Mutex
	next     time.Time // the next unused start reserved
	reserved time.Time // when its batch was reserved
	left     int       // starts reserved and unused: next, next+interval, …
	size     int       // starts in the current batch when it came
	ahead    flow.Grant
	aheadAt  time.Time // when the batch reserved ahead was (expected) back
	window   time.Time // the start of the current demand window
	cur      int       // starts used in the current window
	prev     int       // starts used in the window before
	project  time.Time // the start projected for the last job requeued
}

func newRateLine(r *flow.Rate) *rateLine {
	ctx, cancel := context.WithCancel(context.Background())
	return &rateLine{
		rate:      r,
		grace:     max(r.Interval(), r.Interval()*time.Duration(r.Burst()-1)),
		reserving: make(chan struct{}, 1),
		bgCtx:     ctx,
		bgCancel:  cancel,
	}
}

// stop ends the line's work in the background: a reservation ahead that is
// running is cancelled and waited for, and none starts after stop returns.
// Jobs may still take starts (a start they reserve themselves is theirs).
func (l *rateLine) stop() {
	l.bgMu.Lock()
	l.stopped = true
	l.bgMu.Unlock()
	l.bgCancel()
	l.bg.Wait()
}

// used counts a start handed out here. The lock is held.
func (l *rateLine) used(now time.Time) {
	l.roll(now)
	l.cur++
}

// roll moves the demand windows on to now. The lock is held.
func (l *rateLine) roll(now time.Time) {
	switch d := now.Sub(l.window); {
	case d >= 2*demandWindow:
		l.window, l.prev, l.cur = now, 0, 0
	case d >= demandWindow:
		l.window, l.prev, l.cur = l.window.Add(demandWindow), l.cur, 0
	}
}

// take hands out the next reserved start, if one is left (ok): its time.
// A start due after rateWait is not handed out; its time says when to
// come again.
func (l *rateLine) take(now time.Time) (at time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.takeLocked(now)
}

// takeAhead is take, and reports whether the next batch is to be
// reserved ahead (low): the rate holds no job back, no batch is reserved
// ahead yet, and the start taken left half its batch or less, or no more
// than the jobs of a round trip would take.
func (l *rateLine) takeAhead(now time.Time) (at time.Time, ok, low bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok = l.takeLocked(now)
	if !ok || l.holding.Load() || l.ahead.Count > 0 {
		return at, ok, false
	}
	trip := (int64(l.prev)*int64(l.roundTrip()) + int64(demandWindow) - 1) / int64(demandWindow)
	return at, ok, int64(l.left) <= max(int64(l.size/2), trip)
}

// reserveAhead reserves the next batch in the background, unless a batch
// is being reserved already; it is kept behind the current one (queue).
// The reservation is given timeout.
func (l *rateLine) reserveAhead(timeout time.Duration) {
	l.bgMu.Lock()
	defer l.bgMu.Unlock()
	if l.stopped {
		return
	}
	select {
	case l.reserving <- struct{}{}:
	default:
		return
	}
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		defer func() { <-l.reserving }()
		ctx, cancel := context.WithTimeout(l.bgCtx, timeout)
		defer cancel()
		start := time.Now()
		expect := l.expectBack(start)
		g, _, err := l.rate.Reserve(ctx, expect, l.want(), rateWait)
		l.took(time.Since(start))
		if err != nil {
			return // the next job that finds no start meets the error
		}
		l.holding.Store(l.heldBack(g, start, expect))
		if g.Count > 0 {
			l.queue(g, expect, time.Now())
		}
	}()
}

// queue keeps a batch reserved ahead for the time at and back at now: as
// the current batch if that has run out, behind it otherwise.
func (l *rateLine) queue(g flow.Grant, at, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(at) {
		at = now
	}
	if l.left == 0 {
		l.next, l.left, l.size, l.reserved = g.First, g.Count, g.Count, at
		return
	}
	l.ahead, l.aheadAt = g, at
}

// takeLocked is take with the lock held.
func (l *rateLine) takeLocked(now time.Time) (at time.Time, ok bool) {
	iv := l.rate.Interval()
	for {
		for l.left > 0 && now.Sub(l.due()) > l.grace {
			l.next, l.left = l.next.Add(iv), l.left-1
			l.project = time.Time{} // a start no job came for
		}
		if l.left > 0 || l.ahead.Count == 0 {
			break
		}
		l.next, l.left, l.size, l.reserved = l.ahead.First, l.ahead.Count, l.ahead.Count, l.aheadAt
		l.ahead = flow.Grant{}
	}
	if l.left == 0 {
		return time.Time{}, false
	}
	at = l.due()
	if at.Sub(now) <= rateWait {
		l.next, l.left = l.next.Add(iv), l.left-1
		l.used(now)
	}
	return at, true
}

// due returns when the next reserved start is due: its time, or when it
// was reserved if that is later (the starts a burst had left are due at
// once). The lock is held.
func (l *rateLine) due() time.Time {
	if l.next.Before(l.reserved) {
		return l.reserved
	}
	return l.next
}

// add keeps a batch reserved for the time at and back at now, the starts
// before it being gone, and hands out its first start to the job that
// reserved it, as take would at now (ok false: every start of the batch
// came too late). The starts due by the time the batch is back are due
// then: the limit allows each start from its time on, and a batch back
// sooner than expected makes no job wait for the expected time.
func (l *rateLine) add(g flow.Grant, at, now time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next, l.left, l.size, l.reserved = g.First, g.Count, g.Count, at
	if now.Before(at) {
		l.reserved = now
	}
	if late := now.Sub(l.due()); late > l.grace && late <= rateWait {
		// Slower than expected: the reserver's start is its own (late by
		// the store's delay), the others are dropped by take as late.
		first := l.due()
		l.next, l.left = l.next.Add(l.rate.Interval()), l.left-1
		l.used(now)
		return first, true
	}
	return l.takeLocked(now)
}

// crowded reports whether maxWaiting jobs of the type already wait here,
// for their starts' time or for a batch, while the rate holds jobs back.
func (l *rateLine) crowded(maxWaiting int) bool {
	return l.holding.Load() && int(l.waiting.Load()+l.pending.Load()) >= maxWaiting
}

// requeue returns how long a job refused at now waits before it is offered
// again: until its projected start, the first after the later of now+wait
// and the one projected for the job refused before it.
func (l *rateLine) requeue(now time.Time, wait time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := now.Add(max(wait, demandWindow))
	if next := l.project.Add(l.rate.Interval()); next.After(at) {
		at = next
	}
	if limit := now.Add(maxProjection); at.After(limit) {
		at = limit
	}
	l.project = at
	return at.Sub(now)
}

// nextStart is how long until the start after the last one reserved here,
// from now: the wait of a job refused while others wait for those. The
// lock is held.
func (l *rateLine) nextStart(now time.Time) time.Duration {
	if l.left == 0 {
		return 0
	}
	return l.next.Add(time.Duration(l.left) * l.rate.Interval()).Sub(now)
}

// expectBack returns when a batch whose Reserve starts at start is
// expected back: the longest recent round trip later, at most the grace,
// or, when even the shortest recent round trips are longer than the
// grace, the shortest (at most rateWait). The batch is timed from then
// (Reserve's now). Within the grace, a batch back sooner than expected
// hands out its burst's starts at once; a store slower than the grace
// would make every batch late by more than the grace: its starts but the
// reserver's dropped, and the jobs reserving one start per round trip,
// one after another. So a store that is always that slow gets its batches
// timed from its usual round trip: on time, and, when one is back sooner,
// its starts due no earlier than their time (see add).
func (l *rateLine) expectBack(start time.Time) time.Time {
	ahead := min(l.roundTrip(), l.grace)
	if low := time.Duration(l.rttLow.Load()); low > l.grace {
		ahead = min(low, rateWait)
	}
	return start.Add(ahead)
}

// heldBack reports whether the rate holds jobs back, judged by a batch
// reserved at start for the time expect: it has no start, or its last one
// is due more than a round trip (expect−start) after the later of expect
// and the latest time a batch before it was timed from. Starts due before
// that are this process's own timing (a batch timed from further ahead
// moved the limit's state ahead by as much), not the limit's.
func (l *rateLine) heldBack(g flow.Grant, start, expect time.Time) bool {
	from := expect
	for {
		last := l.lastExpect.Load()
		if last >= expect.UnixNano() {
			from = time.Unix(0, last)
			break
		}
		if l.lastExpect.CompareAndSwap(last, expect.UnixNano()) {
			break
		}
	}
	return g.Count == 0 || g.At(g.Count-1).After(from.Add(expect.Sub(start)))
}

// roundTrip is the expected time of a Reserve: the longest of the last
// ones, decaying (better a start waited for a little than one dropped).
func (l *rateLine) roundTrip() time.Duration {
	return time.Duration(l.rtt.Load())
}

// took adds the time of a Reserve to the estimate.
func (l *rateLine) took(d time.Duration) {
	old := l.rtt.Load()
	l.rtt.Store(max(int64(d), old-old/8))
	low := l.rttLow.Load()
	if int64(d) < low {
		l.rttLow.Store(int64(d))
	} else {
		l.rttLow.Store(low + (int64(d)-low)/8)
	}
}

// want is the size of the next batch: a start for each job waiting for
// one, and as many more as the jobs that came in the last demand window
// would take within half the grace or a round trip (the longer, and at
// most the grace: the starts of a batch not taken within the grace are
// dropped); at most maxRateBatch.
func (l *rateLine) want() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(time.Now())
	span := min(l.grace, max(l.grace/2, l.roundTrip()))
	more := (int64(l.prev)*int64(span) + int64(demandWindow) - 1) / int64(demandWindow)
	n := 1 + int64(l.pending.Load()) + min(more, maxRateBatch)
	return int(min(n, maxRateBatch))
}

// start finds a job a start under the rate and waits for its time: the
// next start reserved here, or the first of a batch it reserves (one worker
// at a time; the others wait for that batch). A job that finds no start
// reserved while more than maxWaiting jobs of the type are here already
// reserves none: so at most about 1.5 × maxWaiting wait (those, and the
// jobs that take the starts they reserved). It returns 0 once the start's
// time has come, or, when the job is to be requeued, how long until this
// process's or the limit's next start.
//
// ctx ends the wait for the start's time (the start is lost, and the job
// is requeued). The wait for another worker's batch and the store round
// trip go on when it ends, for up to timeout (then the error is theirs):
// a batch reserved halfway would be lost.
func (l *rateLine) start(ctx context.Context, timeout time.Duration, maxWaiting int) (time.Duration, error) {
	at, ok, low := l.takeAhead(time.Now())
	if low {
		l.reserveAhead(timeout)
	}
	if !ok {
		if l.crowded(maxWaiting) { // enough wait for starts already
			return l.refuse(), nil
		}
		l.stalls.Add(1)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		l.pending.Add(1)
		select {
		case l.reserving <- struct{}{}:
			l.pending.Add(-1)
		case <-rctx.Done():
			l.pending.Add(-1)
			return 0, rctx.Err()
		}
		at, ok = l.take(time.Now()) // a batch reserved while this one waited
		if !ok && l.crowded(maxWaiting) {
			<-l.reserving
			return l.refuse(), nil
		}
		if !ok {
			// The batch is timed from when it is expected back: the starts
			// due at once are due then, not dropped as late on arrival.
			start := time.Now()
			expect := l.expectBack(start)
			g, wait, err := l.rate.Reserve(rctx, expect, l.want(), rateWait)
			l.took(time.Since(start))
			if err != nil {
				<-l.reserving
				return max(wait, time.Millisecond), err
			}
			l.holding.Store(l.heldBack(g, start, expect))
			if g.Count == 0 {
				<-l.reserving
				return l.requeue(time.Now(), wait), nil
			}
			at, ok = l.add(g, expect, time.Now())
		}
		<-l.reserving
		if !ok {
			return l.refuse(), nil
		}
	}
	d := time.Until(at)
	if d > rateWait {
		return l.requeue(time.Now(), d), nil
	}
	if d > 0 {
		l.waiting.Add(1)
		defer l.waiting.Add(-1)
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done(): // stopping: the start is lost, the job is handed back
			return d, nil
		}
	}
	return 0, nil
}

// refuse returns how long a job that found no start for it here waits:
// until its projected start, after the starts reserved here.
func (l *rateLine) refuse() time.Duration {
	now := time.Now()
	l.mu.Lock()
	wait := l.nextStart(now)
	l.mu.Unlock()
	return l.requeue(now, wait)
}
