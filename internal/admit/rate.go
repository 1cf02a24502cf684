package admit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/flow"
)

// How a process takes the starts of a cluster-wide rate: it reserves them
// in batches (one store write each), the first due within rateWait: a
// start for each job waiting for one, and as many more as it used in the
// last demandWindow, at most maxRateBatch and a quarter of the queue's
// workers. A job waits in its worker for its start, up to rateWait; one
// that finds no start reserved reserves a batch while no more than half
// its queue's workers wait so, and is requeued otherwise. So at most about
// three quarters of a queue's workers wait for a type's starts.
const (
	rateWait     = time.Second
	maxRateBatch = 16
	demandWindow = 100 * time.Millisecond
)

// rateLine is this process's share of a job type's cluster-wide rate:
// starts reserved in the store a batch at a time (flow.Rate.Reserve), and
// handed here, in order, to the jobs that come, each waiting for its
// start's time (or the batch's, for starts a burst had left). A start no
// job took within grace of that time is dropped (it is lost to every
// process); one taken late, up to grace, lets the limit be passed by at
// most grace/interval starts over any span of time.
type rateLine struct {
	rate    *flow.Rate
	grace   time.Duration
	waiting atomic.Int32 // jobs waiting here for their starts' time
	pending atomic.Int32 // jobs waiting for a batch to be reserved
	rtt     atomic.Int64 // ns: the expected round trip of a Reserve

	reserving chan struct{} // held by the worker reserving a batch

	mu       sync.Mutex
	next     time.Time // the next unused start reserved
	reserved time.Time // when its batch was reserved
	left     int       // starts reserved and unused: next, next+interval, …
	window   time.Time // the start of the current demand window
	cur      int       // starts used in the current window
	prev     int       // starts used in the window before
}

func newRateLine(r *flow.Rate) *rateLine {
	return &rateLine{
		rate:      r,
		grace:     max(r.Interval(), r.Interval()*time.Duration(r.Burst()-1)),
		reserving: make(chan struct{}, 1),
	}
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

// takeLocked is take with the lock held.
func (l *rateLine) takeLocked(now time.Time) (at time.Time, ok bool) {
	iv := l.rate.Interval()
	for l.left > 0 && now.Sub(l.due()) > l.grace {
		l.next, l.left = l.next.Add(iv), l.left-1
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

// add keeps a batch reserved for the time at, the starts before it being
// gone, and hands out its first start to the job that reserved it, as take
// would at now (ok false: every start of the batch came too late).
func (l *rateLine) add(g flow.Grant, at, now time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next, l.left, l.reserved = g.First, g.Count, at
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
// for their starts' time or for a batch.
func (l *rateLine) crowded(maxWaiting int) bool {
	return int(l.waiting.Load()+l.pending.Load()) >= maxWaiting
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
}

// want is the size of the next batch: a start for each job waiting for
// one, and as many more as were used here in the last demand window; at
// most maxWaiting/2.
func (l *rateLine) want(maxWaiting int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(time.Now())
	n := 1 + int(l.pending.Load()) + l.prev
	return max(min(n, maxRateBatch, maxWaiting/2), 1)
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
	at, ok := l.take(time.Now())
	if !ok {
		if l.crowded(maxWaiting) { // enough wait for starts already
			return demandWindow, nil
		}
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
			return demandWindow, nil
		}
		if !ok {
			// The batch is timed from when it is expected back: the starts
			// due at once are due then, not dropped as late on arrival.
			start := time.Now()
			expect := start.Add(l.roundTrip())
			g, wait, err := l.rate.Reserve(rctx, expect, l.want(maxWaiting), rateWait)
			l.took(time.Since(start))
			if err != nil || g.Count == 0 {
				<-l.reserving
				return max(wait, time.Millisecond), err
			}
			at, ok = l.add(g, expect, time.Now())
		}
		<-l.reserving
		if !ok {
			return demandWindow, nil
		}
	}
	d := time.Until(at)
	if d > rateWait {
		return d, nil
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
