package rabbit

import (
	"cmp"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// settler is the part of *amqp.Channel an acker uses.
type settler interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// errSettledTag reports an ack of a tag the acker already settled. It
// never reaches the broker: acking a tag twice would close the channel.
var errSettledTag = errors.New("rabbit: delivery tag already settled")

// ackWait is how long a blocked ack waits for the tags below it.
const ackWait = 200 * time.Microsecond

// acker sends the basic.ack and basic.nack frames of one consumer channel,
// coalescing acks like a group commit: the first caller becomes the leader
// and writes the frames for every ack queued meanwhile, and callers
// arriving while it writes queue up for the next leader.
//
// A flush acks with one multiple ack up to the highest queued tag H such
// that every tag up to H is either queued or already settled (acked or
// nacked, by a frame already written). A tag the acker has not been told
// about (held by a handler, being moved by a delay hop, or still in the
// client's buffer) blocks the multiple ack. Delivery tags on a channel are
// consecutive from 1, and the broker applies the frames of a channel in
// order, so a multiple ack can only settle tags that were queued.
//
// A blocked ack stays queued for up to ackWait, for the tags below it to be
// acked too; then it is acked on its own. Once a wait has run out, blocked
// acks do not wait until the lowest unsettled tag is settled: a handler that
// runs long delays the acks above it by ackWait once, not each of them.
type acker struct {
	ch settler

	mu      sync.Mutex
	floor   uint64        // every tag up to floor is settled
	stalled bool          // a wait ran out, and floor has not moved since
	settled []span        // settled tags above floor+1: sorted, disjoint, not adjacent
	queue   []*ackReq     // acks not yet written
	leading bool          // a caller writes the queued acks
	kick    chan struct{} // wakes a leader that waits for blocked acks
	timer   *time.Timer   // the leader's, for the end of a wait
	wait    time.Duration // how long a blocked ack waits: ackWait (tests set it)
	holding bool          // hold: no frame is written until unhold
	writing int           // frames being written with mu released
	idle    *sync.Cond    // on mu: signalled when writing drops or holding ends

	acks, frames atomic.Int64 // acks asked for, ack frames written; for benchmarks
	settles      atomic.Int64 // ack and nack frames written; for settle barriers
}

func newAcker(ch settler) *acker {
	a := &acker{ch: ch, kick: make(chan struct{}, 1), wait: ackWait}
	a.idle = sync.NewCond(&a.mu)
	return a
}

// hold stops the acker writing frames, once the frames being written are
// written, until unhold: acks and nacks asked for meanwhile wait. A
// release holds the acker from its settle barrier to basic.cancel-ok, so
// that no settle opens the prefetch window while the cancel is on its way
// (see release): the channel's settles wait for the barrier's confirm and
// the cancel-ok, however long the broker takes. A hold is not re-entrant.
func (a *acker) hold() {
	a.mu.Lock()
	a.holding = true
	for a.writing > 0 {
		a.idle.Wait()
	}
	a.mu.Unlock()
}

// unhold undoes hold.
func (a *acker) unhold() {
	a.mu.Lock()
	a.holding = false
	a.idle.Broadcast()
	if a.leading {
		a.kickLocked()
	}
	a.mu.Unlock()
}

// waitHeldLocked waits, a.mu held, until no hold is in force.
func (a *acker) waitHeldLocked() {
	for a.holding {
		a.idle.Wait()
	}
}

// wroteLocked ends a write begun with a.writing++.
func (a *acker) wroteLocked() {
	a.writing--
	a.idle.Broadcast()
}

// span is the tags lo to hi, inclusive.
type span struct{ lo, hi uint64 }

// ackReq is one queued ack.
type ackReq struct {
	tag   uint64
	until time.Time // the end of its wait for the tags below it
	err   error
	done  bool          // the frame that acks tag is written (or failed)
	lead  bool          // the caller is to lead the next flush
	wake  chan struct{} // closed when done or lead is set
}

// ack acks tag and returns once a frame that acks it is written.
func (a *acker) ack(tag uint64) error {
	r := a.enqueue([]uint64{tag})[0]
	return a.await(r)
}

// ackAll acks tags together and returns once frames that ack them are
// written: they are queued before a flush sees any of them, so they go out
// in one multiple ack when every tag below them is settled, and in as few
// frames as the unsettled tags between them allow otherwise.
func (a *acker) ackAll(tags []uint64) error {
	if len(tags) == 0 {
		return nil
	}
	rs := a.enqueue(tags)
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		// Each may be handed the lead, and a leader flushes until its own
		// ack is written: they wait side by side.
		wg.Go(func() { errs[i] = a.await(r) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// enqueue queues an ack of each tag; the first leads the next flush when
// no caller leads one now.
func (a *acker) enqueue(tags []uint64) []*ackReq {
	rs := make([]*ackReq, len(tags))
	a.mu.Lock()
	until := time.Now().Add(a.wait)
	for i, tag := range tags {
		rs[i] = &ackReq{tag: tag, until: until, wake: make(chan struct{})}
	}
	a.queue = append(a.queue, rs...)
	if a.leading {
		a.kickLocked()
	} else {
		a.leading = true
		rs[0].lead = true
		close(rs[0].wake)
	}
	a.mu.Unlock()
	return rs
}

// await waits until r's frame is written, leading the flushes when r is
// handed the lead.
func (a *acker) await(r *ackReq) error {
	<-r.wake
	a.mu.Lock()
	if r.done && !r.lead {
		a.mu.Unlock()
		return r.err
	}
	for !r.done {
		a.waitHeldLocked()
		until := a.flushLocked()
		if r.done {
			break
		}
		// r is blocked: wait for more acks, or for the end of a wait.
		a.mu.Unlock()
		if a.timer == nil {
			a.timer = time.NewTimer(time.Until(until))
		} else {
			a.timer.Reset(time.Until(until))
		}
		select {
		case <-a.kick:
		case <-a.timer.C:
		}
		a.timer.Stop()
		a.mu.Lock()
	}
	// Hand the queue to the oldest waiter, if any.
	if len(a.queue) > 0 {
		next := a.queue[0]
		next.lead = true
		close(next.wake)
	} else {
		a.leading = false
	}
	a.mu.Unlock()
	return r.err
}

// kickLocked wakes a leader waiting for blocked acks.
func (a *acker) kickLocked() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// flushLocked writes the frames for the queued acks that are not blocked,
// or whose wait is over; the others stay queued, and it returns the end of
// the earliest wait among them. It releases a.mu while it writes.
func (a *acker) flushLocked() (until time.Time) {
	batch := a.queue
	a.queue = nil
	slices.SortFunc(batch, func(x, y *ackReq) int { return cmp.Compare(x.tag, y.tag) })
	// Refuse what would ack a tag twice (which closes the channel): a tag
	// settled already, or queued twice. Neither happens unless a caller
	// has a bug.
	var live, refused []*ackReq
	for i, r := range batch {
		if a.isSettled(r.tag) || i > 0 && batch[i-1].tag == r.tag {
			r.err = errSettledTag
			refused = append(refused, r)
			continue
		}
		live = append(live, r)
	}
	// Find the highest tag one multiple ack may cover: walk up from the
	// floor over queued and settled tags until a tag that is neither.
	var high uint64
	n := 0 // live[:n] are covered by the multiple ack
	next, j := a.floor+1, 0
	for {
		if n < len(live) && live[n].tag == next {
			high = next
			next++
			n++
		} else if j < len(a.settled) && a.settled[j].lo == next {
			next = a.settled[j].hi + 1
			j++
		} else {
			break
		}
	}
	covered := live[:n]
	var single []*ackReq
	now := time.Now()
	expired := false
	for _, r := range live[n:] {
		switch {
		case a.stalled && n == 0:
			single = append(single, r)
		case !now.Before(r.until):
			single = append(single, r)
			expired = true
		default:
			a.queue = append(a.queue, r)
			if until.IsZero() || r.until.Before(until) {
				until = r.until
			}
		}
	}
	if len(covered) == 0 && len(single) == 0 {
		a.finishLocked(refused)
		return until
	}
	a.writing++
	a.mu.Unlock()

	a.acks.Add(int64(n + len(single)))
	a.frames.Add(int64(min(n, 1) + len(single)))
	a.settles.Add(int64(min(n, 1) + len(single)))
	if n > 0 {
		err := a.ch.Ack(high, n > 1)
		for _, r := range covered {
			r.err = err
		}
	}
	for _, r := range single {
		r.err = a.ch.Ack(r.tag, false)
	}

	a.mu.Lock()
	a.wroteLocked()
	if n > 0 {
		a.floor = high
		a.stalled = false
		for len(a.settled) > 0 && a.settled[0].hi <= high {
			a.settled = a.settled[1:]
		}
		a.advanceLocked()
	}
	for _, r := range single {
		a.settleLocked(r.tag)
	}
	if expired {
		a.stalled = true
	}
	a.finishLocked(refused)
	a.finishLocked(covered)
	a.finishLocked(single)
	return until
}

// finishLocked marks rs done and wakes their callers.
func (a *acker) finishLocked(rs []*ackReq) {
	for _, r := range rs {
		r.done = true
		if r.wake != nil && !r.lead {
			close(r.wake)
		}
	}
}

// nack sends a basic.nack for tag and records the tag as settled.
func (a *acker) nack(tag uint64, requeue bool) error {
	a.mu.Lock()
	a.waitHeldLocked()
	if a.isSettled(tag) {
		a.mu.Unlock()
		return errSettledTag
	}
	a.writing++
	a.mu.Unlock()
	// The tag is not queued and not settled, so no multiple ack covers it
	// until the frame below is written and settleLocked runs.
	err := a.ch.Nack(tag, false, requeue)
	a.settles.Add(1)
	a.mu.Lock()
	a.wroteLocked()
	a.settleLocked(tag)
	if a.leading {
		a.kickLocked() // tag may have blocked a queued ack
	}
	a.mu.Unlock()
	return err
}

// isSettled reports whether tag was settled already.
func (a *acker) isSettled(tag uint64) bool {
	if tag <= a.floor {
		return true
	}
	_, found := slices.BinarySearchFunc(a.settled, tag, func(s span, t uint64) int {
		switch {
		case s.hi < t:
			return -1
		case s.lo > t:
			return 1
		}
		return 0
	})
	return found
}

// settleLocked records tag, above the floor and not yet settled, as settled.
func (a *acker) settleLocked(tag uint64) {
	if tag <= a.floor {
		return
	}
	// i is the first span that ends at or after tag-1: the one tag may
	// extend at its end, or the first one after tag.
	i, _ := slices.BinarySearchFunc(a.settled, tag-1, func(s span, t uint64) int {
		if s.hi < t {
			return -1
		}
		return 1
	})
	switch {
	case i < len(a.settled) && a.settled[i].hi == tag-1:
		a.settled[i].hi = tag
		if i+1 < len(a.settled) && a.settled[i+1].lo == tag+1 {
			a.settled[i].hi = a.settled[i+1].hi
			a.settled = slices.Delete(a.settled, i+1, i+2)
		}
	case i < len(a.settled) && a.settled[i].lo == tag+1:
		a.settled[i].lo = tag
	case i < len(a.settled) && a.settled[i].lo <= tag:
		return // already settled
	default:
		a.settled = slices.Insert(a.settled, i, span{tag, tag})
	}
	a.advanceLocked()
}

// advanceLocked moves the floor over the settled span just above it.
func (a *acker) advanceLocked() {
	if len(a.settled) > 0 && a.settled[0].lo == a.floor+1 {
		a.floor = a.settled[0].hi
		a.stalled = false
		a.settled = a.settled[1:]
	}
}
