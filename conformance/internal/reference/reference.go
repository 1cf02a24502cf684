// Package reference is a small in-memory backend that the conformance
// suite runs against in its own tests: correct by default, and with a
// [Mutation] that breaks exactly one rule of the driver contract. The
// suite's mutation test (conformance/mutation_test.go) runs the cases of
// each rule against the backend broken in that rule, and requires a case to
// fail: that is how the suite proves it catches every rule it claims to.
//
// It is written for clarity, not speed: every method holds the broker's
// lock for its whole step and scans the queue. A Receive's answer takes a
// moment to arrive (Wire), as it would from a server, so that a context
// ending while a claim is on its way back is a real case here.
package reference

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// MaxBody is the largest body the backend stores (Capabilities.MaxBody).
const MaxBody = 1 << 20

// DeadHold is how long a NextDead hold lasts without ExtendDead
// (Capabilities.DeadHold).
const DeadHold = time.Second

// Wire is how long the answer of a Receive takes to reach its caller.
const Wire = time.Millisecond

// EarlyWindow is how far ahead of its NotBefore the NotBeforeWindow
// mutation hands a message out to a Receive that lands in the window.
const EarlyWindow = 30 * time.Millisecond

// pollEvery is the interval of the Polling mutation.
const pollEvery = time.Second

// IdleAfter is how long a Receive waits before the PollingAfterIdle
// mutation stops waking it.
const IdleAfter = 500 * time.Millisecond

// BatchCap is how many messages of a batch the BatchCapped mutation stores.
const BatchCap = 4

// purgePage is the page of the PurgeCountsLastPage mutation.
const purgePage = 2

// safetyNet is how often an idle Receive looks again under NoTimers, as a
// backend might that relies on a slow fallback poll instead of timers.
const safetyNet = 3 * time.Second

// Broker holds the queues that its connections share.
type Broker struct {
	mut Mutation
	kv  *memory.Broker // the store (driver.StoreProvider), never mutated

	mu     sync.Mutex
	queues map[string]*queue
	token  uint64   // the last lease or hold token handed out
	holder *Backend // the first connection that took a hold (CloseKeepsSecondHolder)
}

// NewBroker returns an empty broker whose connections are broken by m
// ("" for none).
func NewBroker(m Mutation) *Broker {
	return &Broker{mut: m, kv: memory.NewBroker(), queues: map[string]*queue{}}
}

// Connect opens a connection to the broker: one worker process.
func (br *Broker) Connect() *Backend {
	return &Backend{br: br, done: make(chan struct{})}
}

// Backend is one connection to a Broker.
type Backend struct {
	br     *Broker
	closed bool // guarded by br.mu
	done   chan struct{}
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.QueueDeleter  = (*Backend)(nil)
	_ driver.StoreProvider = (*Backend)(nil)
)

// Store implements driver.StoreProvider: the broker's store is the memory
// backend's, which the mutations leave alone (the store has a suite of its
// own, conformance/storetest).
func (b *Backend) Store() (driver.Store, error) { return b.br.kv.Connect(), nil }

type message struct {
	id         string
	body       []byte
	notBefore  time.Time
	readyAt    time.Time // its enqueue, or the lapse of its last lease
	deliveries int

	token uint64        // non-zero while leased
	until time.Time     // the lease's end
	lease time.Duration // the lease last given (by Receive or Extend)
	owner *Backend
}

type deadRecord struct {
	driver.DeadMessage
	token    uint64    // non-zero while held by a NextDead caller
	until    time.Time // when the hold lapses; zero: never (CloseKeepsHolds)
	owner    *Backend
	extended bool // ExtendDead renewed the present hold (KeepDeletesExtended)
}

// held reports whether a NextDead caller holds the record at now.
func (r *deadRecord) held(now time.Time) bool {
	return r.token != 0 && (r.until.IsZero() || now.Before(r.until))
}

// holdUntil is when a hold taken or renewed at now lapses.
func (br *Broker) holdUntil(now time.Time) time.Time {
	switch {
	case br.is(DeadHoldShort):
		return now.Add(DeadHold / 4)
	case br.is(DeadHoldEarly):
		return now.Add(DeadHold * 3 / 4)
	}
	return now.Add(DeadHold)
}

type queue struct {
	msgs     []*message    // every stored message, in arrival order
	dead     []*deadRecord // oldest first
	wake     chan struct{} // closed (and replaced) when a message may be ready
	received time.Time     // when a Receive last looked (StatsDueStale)
}

type handle struct {
	m     *message
	token uint64
}

type deadHandle struct {
	r     *deadRecord
	token uint64
}

// is reports whether the broker carries mutation m.
func (br *Broker) is(m Mutation) bool { return br.mut == m }

func (br *Broker) queue(name string) *queue {
	if br.is(SharedQueues) {
		name = ""
	}
	q := br.queues[name]
	if q == nil {
		q = &queue{wake: make(chan struct{})}
		br.queues[name] = q
	}
	return q
}

// deadOf returns the queue that keeps the dead letters of the queue name.
func (br *Broker) deadOf(name string) *queue {
	if br.is(SharedDeadLetters) {
		return br.queue("\x00dead")
	}
	return br.queue(name)
}

// signal wakes the receivers waiting on q.
func (q *queue) signal() {
	close(q.wake)
	q.wake = make(chan struct{})
}

// lock takes the broker's lock, or returns driver.ErrClosed.
func (b *Backend) lock() error {
	b.br.mu.Lock()
	if b.closed && !b.br.is(NoErrClosed) {
		b.br.mu.Unlock()
		return driver.ErrClosed
	}
	return nil
}

// Capabilities implements driver.Backend.
func (b *Backend) Capabilities() driver.Capabilities {
	return driver.Capabilities{MaxBody: MaxBody, RedeliversOnClose: true, DeadHold: DeadHold}
}

// Declare implements driver.Backend.
func (b *Backend) Declare(_ context.Context, name string) error {
	if err := b.lock(); err != nil {
		return err
	}
	defer b.br.mu.Unlock()
	if q, ok := b.br.queues[name]; ok && (b.br.is(DeclareOnce) || b.br.is(DeclareNonEmptyFails) && len(q.msgs) > 0) {
		return fmt.Errorf("reference: queue %q exists", name)
	}
	b.br.queue(name)
	return nil
}

// Enqueue implements driver.Backend.
func (b *Backend) Enqueue(_ context.Context, name string, msgs []driver.Message) error {
	for i, m := range msgs {
		if len(m.Body) > MaxBody && !b.br.is(NoTooLarge) && !(b.br.is(NoTooLargeInBatch) && i > 0) {
			return fmt.Errorf("reference: message %q is %d bytes, over %d: %w", m.ID, len(m.Body), MaxBody, driver.ErrTooLarge)
		}
	}
	if err := b.lock(); err != nil {
		return err
	}
	defer b.br.mu.Unlock()
	q := b.br.queue(name)
	for i, m := range msgs {
		if i > 0 && b.br.is(BatchKeepsFirst) || i >= BatchCap && b.br.is(BatchCapped) {
			break
		}
		nb := m.NotBefore
		if b.br.is(NotBeforeIgnored) {
			nb = time.Time{}
		}
		q.msgs = append(q.msgs, &message{id: m.ID, body: m.Body, notBefore: nb, readyAt: time.Now()})
	}
	q.signal()
	return nil
}

// tidy ends the leases that ran out. The lock is held.
func (br *Broker) tidy(q *queue, now time.Time) {
	for _, m := range q.msgs {
		if m.token != 0 && !now.Before(m.until) {
			m.token, m.owner = 0, nil
			if !br.is(OldestReadyEnqueued) {
				m.readyAt = m.until
			}
			if br.is(NoCountOnLapse) {
				m.deliveries--
			}
		}
	}
}

// Receive implements driver.Backend.
func (b *Backend) Receive(ctx context.Context, name string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if max <= 0 {
		return nil, fmt.Errorf("reference: Receive max is %d, it must be positive", max)
	}
	start, woken := time.Now(), false
	for {
		if err := b.lock(); err != nil {
			return nil, err
		}
		q := b.br.queue(name)
		now := time.Now()
		b.br.tidy(q, now)
		var out []*driver.Delivery
		var claimed []handle
		q.received = now
		var next time.Time // when something may become ready
		for _, m := range q.msgs {
			switch {
			case m.token != 0 && b.br.is(NoLapseTimer):
				next = earliest(next, now.Add(safetyNet)) // wakes for a lapse only by chance
			case m.token != 0:
				next = earliest(next, m.until)
			case m.notBefore.After(now) && !(b.br.is(NotBeforeWindow) && m.notBefore.Sub(now) < EarlyWindow):
				next = earliest(next, m.notBefore)
			case len(out) < max || b.br.is(OverMax) || b.br.is(OverMaxByOne) && len(out) == max:
				b.br.token++
				m.token, m.owner = b.br.token, b
				m.until, m.lease = now.Add(lease), lease
				if b.br.is(ShortLease) || b.br.is(ShortLeaseInBatch) && len(out) > 0 {
					m.until = now.Add(lease / 4)
				}
				m.deliveries++
				n := m.deliveries
				switch {
				case b.br.is(NoCount):
					n = 1
				case b.br.is(CountFromZero):
					n--
				}
				body := m.body
				switch {
				case b.br.is(BodyAltered) && len(body) > 0:
					body = body[:len(body)-1]
				case b.br.is(BodyAlteredBinary):
					body = []byte(strings.ToValidUTF8(string(body), "\uFFFD"))
				}
				h := handle{m: m, token: m.token}
				claimed = append(claimed, h)
				out = append(out, &driver.Delivery{Queue: name, Body: body, Deliveries: n, Handle: h})
			}
		}
		if len(out) > 0 {
			b.br.mu.Unlock()
			return b.travel(ctx, claimed, out)
		}
		if b.br.is(EmptyAtOnce) || b.br.is(EmptyAfterWake) && woken {
			b.br.mu.Unlock()
			return nil, nil
		}
		wake := q.wake
		b.br.mu.Unlock()
		var due <-chan time.Time
		var t *time.Timer
		switch {
		case b.br.is(Polling):
			wake = nil
			t = time.NewTimer(pollEvery)
		case b.br.is(NoTimers):
			t = time.NewTimer(safetyNet) // wakes for work that became due only by chance
		case b.br.is(PollingAfterIdle):
			d := IdleAfter - time.Since(start) // woken until then
			if d <= 0 {
				wake, d = nil, pollEvery
			}
			if !next.IsZero() {
				d = min(d, time.Until(next))
			}
			t = time.NewTimer(d)
		case !next.IsZero():
			t = time.NewTimer(time.Until(next))
		}
		if t != nil {
			due = t.C
		}
		done := b.done
		if b.br.is(NoErrClosed) {
			done = nil
		}
		var err error
		select {
		case <-wake:
			woken = true
		case <-due:
		case <-done:
			err = driver.ErrClosed
		case <-ctx.Done():
			err = ctx.Err()
		}
		if t != nil {
			t.Stop()
		}
		if err != nil {
			return nil, err
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// travel brings a Receive's answer to its caller, which takes Wire (and,
// with SlowBodies, a second per MiB). When ctx ends first, the caller never
// sees the deliveries: they are put back uncounted.
func (b *Backend) travel(ctx context.Context, claimed []handle, out []*driver.Delivery) ([]*driver.Delivery, error) {
	d := Wire
	for _, o := range out {
		if b.br.is(SlowBodies) || b.br.is(SlowLargeBodies) && len(o.Body) >= MaxBody/2 {
			d += time.Duration(len(o.Body)) * time.Second / (1 << 20)
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return out, nil
	case <-ctx.Done():
	}
	if b.br.is(CancelledClaimsLost) {
		return nil, ctx.Err() // left leased: they come back after the lease, counted
	}
	b.br.mu.Lock()
	defer b.br.mu.Unlock()
	for i, h := range claimed {
		if i > 0 && b.br.is(CancelledClaimsLostInBatch) {
			break // left leased
		}
		if h.m.token == h.token {
			h.m.token, h.m.owner = 0, nil
			if !b.br.is(CancelledClaimsCounted) && !(b.br.is(CancelledClaimsCountedInBatch) && i > 0) {
				h.m.deliveries--
			}
		}
	}
	for _, q := range b.br.queues {
		q.signal()
	}
	return nil, ctx.Err()
}

// held checks that d still holds its message for the settling call op
// ("Ack", "Extend", "Requeue", "DeadLetter"), and returns the message's
// queue with the lock held.
func (b *Backend) held(d *driver.Delivery, op string) (*queue, *message, error) {
	h, ok := d.Handle.(handle)
	if !ok {
		return nil, nil, fmt.Errorf("reference: delivery %T was not handed out by this backend", d.Handle)
	}
	if err := b.lock(); err != nil {
		return nil, nil, err
	}
	q := b.br.queue(d.Queue)
	if !slices.Contains(q.msgs, h.m) {
		b.br.mu.Unlock()
		return nil, nil, driver.ErrLeaseLost
	}
	switch {
	case b.br.is(StaleSettle), b.br.is(StaleExtendOnly) && op == "Extend":
		// any receipt of the message acts on it, a newer delivery's too
	case h.m.token != h.token:
		b.br.mu.Unlock()
		return nil, nil, driver.ErrLeaseLost
	case !time.Now().Before(h.m.until) && !b.br.is(LateSettle) && !(b.br.is(LateAckOnly) && op == "Ack"):
		b.br.mu.Unlock()
		return nil, nil, driver.ErrLeaseLost
	}
	return q, h.m, nil
}

func (q *queue) remove(m *message) {
	q.msgs = slices.DeleteFunc(q.msgs, func(x *message) bool { return x == m })
}

// Ack implements driver.Backend.
func (b *Backend) Ack(_ context.Context, d *driver.Delivery) error {
	q, m, err := b.held(d, "Ack")
	if err != nil {
		return err
	}
	defer b.br.mu.Unlock()
	if !b.br.is(AckKeeps) && !(b.br.is(AckKeepsRedelivered) && m.deliveries > 1) {
		q.remove(m)
	}
	return nil
}

// Extend implements driver.Backend.
func (b *Backend) Extend(_ context.Context, d *driver.Delivery, lease time.Duration) error {
	_, m, err := b.held(d, "Extend")
	if err != nil {
		return err
	}
	defer b.br.mu.Unlock()
	now := time.Now()
	late := m.until.Sub(now) < m.lease/10 // the last tenth of the lease
	if !b.br.is(ExtendNoop) && !(b.br.is(ExtendLateNoop) && late) {
		m.until, m.lease = now.Add(lease), lease
	}
	return nil
}

// Requeue implements driver.Backend.
func (b *Backend) Requeue(_ context.Context, d *driver.Delivery, msg driver.Message) error {
	if len(msg.Body) > MaxBody && !b.br.is(NoTooLarge) {
		return fmt.Errorf("reference: requeue %q: %d bytes, over %d: %w", msg.ID, len(msg.Body), MaxBody, driver.ErrTooLarge)
	}
	q, m, err := b.held(d, "Requeue")
	if err != nil {
		return err
	}
	defer b.br.mu.Unlock()
	q.remove(m)
	now := time.Now()
	if b.br.is(RequeueDrops) || b.br.is(RequeueDropsDelayed) && msg.NotBefore.After(now) {
		return nil
	}
	nm := &message{id: msg.ID, body: msg.Body, notBefore: msg.NotBefore, readyAt: now}
	switch {
	case b.br.is(RequeueKeepsCount), b.br.is(RequeueNowKeepsCount) && !msg.NotBefore.After(now):
		nm.deliveries = m.deliveries
	case b.br.is(RequeueCountsFromZero):
		nm.deliveries = -1
	}
	if b.br.is(RequeueNow) || b.br.is(NotBeforeIgnored) || b.br.is(RequeueShortNow) && msg.NotBefore.Sub(now) < time.Second {
		nm.notBefore = time.Time{}
	}
	q.msgs = append(q.msgs, nm)
	q.signal()
	return nil
}

// DeadLetter implements driver.Backend.
func (b *Backend) DeadLetter(_ context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	q, m, err := b.held(d, "DeadLetter")
	if err != nil {
		return err
	}
	defer b.br.mu.Unlock()
	if !b.br.is(DeadLetterKeeps) && !(b.br.is(DeadLetterKeepsRedelivered) && m.deliveries > 1) {
		q.remove(m)
	}
	dq := b.br.deadOf(d.Queue)
	dq.dead = append(dq.dead, &deadRecord{DeadMessage: rec})
	return nil
}

// NextDead implements driver.Backend.
func (b *Backend) NextDead(_ context.Context, name string) (*driver.DeadDelivery, error) {
	if err := b.lock(); err != nil {
		return nil, err
	}
	defer b.br.mu.Unlock()
	now := time.Now()
	dead := b.br.deadOf(name).dead
	newest := b.br.is(NextDeadNewest) || b.br.is(NextDeadSkipsToNewest) && len(dead) > 0 && dead[0].held(now)
	for i := range dead {
		r := dead[i]
		if newest {
			r = dead[len(dead)-1-i]
		}
		if !r.held(now) || b.br.is(NextDeadShares) || b.br.is(NextDeadSharesSameConn) && r.owner == b {
			b.br.token++
			r.token, r.owner, r.until, r.extended = b.br.token, b, b.br.holdUntil(now), false
			if b.br.holder == nil {
				b.br.holder = b
			}
			return &driver.DeadDelivery{DeadMessage: r.DeadMessage, Handle: deadHandle{r: r, token: r.token}}, nil
		}
	}
	return nil, driver.ErrNoDeadLetters
}

// ExtendDead implements driver.Backend.
func (b *Backend) ExtendDead(_ context.Context, d *driver.DeadDelivery) error {
	h, ok := d.Handle.(deadHandle)
	if !ok {
		return fmt.Errorf("reference: dead letter %T was not handed out by this backend", d.Handle)
	}
	if err := b.lock(); err != nil {
		return err
	}
	defer b.br.mu.Unlock()
	now := time.Now()
	if h.r.token != h.token || !h.r.held(now) {
		return driver.ErrLeaseLost
	}
	late := h.r.until.Sub(now) < DeadHold/10 // the last tenth of the hold
	if !b.br.is(ExtendDeadNoop) && !(b.br.is(ExtendDeadLateNoop) && late) {
		h.r.until = b.br.holdUntil(now)
	}
	h.r.extended = true
	return nil
}

// SettleDead implements driver.Backend.
func (b *Backend) SettleDead(_ context.Context, d *driver.DeadDelivery, remove bool) error {
	h, ok := d.Handle.(deadHandle)
	if !ok {
		return fmt.Errorf("reference: dead letter %T was not handed out by this backend", d.Handle)
	}
	if err := b.lock(); err != nil {
		return err
	}
	defer b.br.mu.Unlock()
	if h.r.token != h.token {
		return driver.ErrLeaseLost
	}
	lapsed, extended := !h.r.held(time.Now()), h.r.extended
	h.r.token, h.r.owner, h.r.extended = 0, nil, false
	if lapsed {
		return driver.ErrLeaseLost
	}
	for _, q := range b.br.queues {
		i := slices.Index(q.dead, h.r)
		if i < 0 {
			continue
		}
		switch {
		case remove || b.br.is(KeepDeletes) || b.br.is(KeepDeletesExtended) && extended:
			q.dead = slices.Delete(q.dead, i, i+1)
		case b.br.is(KeepMovesToBack):
			q.dead = append(slices.Delete(q.dead, i, i+1), h.r)
		case b.br.is(KeepMovesBackOne) && i+1 < len(q.dead):
			q.dead[i], q.dead[i+1] = q.dead[i+1], q.dead[i]
		}
		return nil
	}
	return driver.ErrLeaseLost
}

// ListDead implements driver.Backend. The cursor is an index.
func (b *Backend) ListDead(_ context.Context, name, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	start := 0
	if cursor != "" && !b.br.is(ListNoCursor) {
		n, err := strconv.Atoi(cursor)
		if err != nil || n < 0 {
			return nil, "", fmt.Errorf("reference: bad dead-letter cursor %q", cursor)
		}
		start = n
		if b.br.is(ListCursorSkips) {
			start++
		}
	}
	switch {
	case b.br.is(ListOverLimit):
		limit *= 2
	case b.br.is(ListOverLimitByOne):
		limit++
	}
	if err := b.lock(); err != nil {
		return nil, "", err
	}
	defer b.br.mu.Unlock()
	q := b.br.deadOf(name)
	if start >= len(q.dead) {
		return nil, "", nil
	}
	end := min(start+limit, len(q.dead))
	var out []driver.DeadMessage
	for _, r := range q.dead[start:end] {
		out = append(out, r.DeadMessage)
	}
	if b.br.is(ListReorders) && end-start > 1 {
		// a listing that "touches" what it lists: the page goes to the back
		page := slices.Clone(q.dead[start:end])
		q.dead = append(slices.Delete(q.dead, start, end), page...)
	}
	if b.br.is(ListReordersWhole) && start == 0 && end == len(q.dead) && end > 1 {
		q.dead = append(q.dead[1:], q.dead[0])
	}
	next := ""
	if end < len(q.dead) {
		next = strconv.Itoa(end)
	}
	return out, next, nil
}

// DeleteDead implements driver.Backend. Held records are left alone.
func (b *Backend) DeleteDead(_ context.Context, name string, ids []string) (int, error) {
	if err := b.lock(); err != nil {
		return 0, err
	}
	defer b.br.mu.Unlock()
	q := b.br.deadOf(name)
	n, now := 0, time.Now()
	if b.br.is(DeleteCountsAbsent) {
		for _, id := range ids {
			if !slices.ContainsFunc(q.dead, func(r *deadRecord) bool { return r.ID == id }) {
				n++
			}
		}
	}
	q.dead = slices.DeleteFunc(q.dead, func(r *deadRecord) bool {
		named := slices.Contains(ids, r.ID)
		del := named && (!r.held(now) || b.br.is(DeleteHeld))
		if del || named && b.br.is(DeleteHeldCounted) {
			n++
		}
		return del
	})
	if b.br.is(DeleteMiscounts) {
		n = 0
	}
	return n, nil
}

// PurgeDead implements driver.Backend.
func (b *Backend) PurgeDead(_ context.Context, name string) (int, error) {
	if err := b.lock(); err != nil {
		return 0, err
	}
	defer b.br.mu.Unlock()
	q := b.br.deadOf(name)
	n := len(q.dead)
	for _, r := range q.dead {
		r.token = 0 // a holder's SettleDead now fails
	}
	q.dead = nil
	switch {
	case b.br.is(PurgeMiscounts):
		n = 0
	case b.br.is(PurgeCountsLastPage) && n > 0:
		n -= (n - 1) / purgePage * purgePage
	}
	return n, nil
}

// Stats implements driver.Backend.
func (b *Backend) Stats(_ context.Context, name string) (driver.Stats, error) {
	if b.br.is(NoErrClosedStats) {
		b.br.mu.Lock()
	} else if err := b.lock(); err != nil {
		return driver.Stats{}, err
	}
	defer b.br.mu.Unlock()
	if b.br.is(StatsZero) {
		return driver.Stats{}, nil
	}
	q := b.br.queue(name)
	now := time.Now()
	if !b.br.is(StatsLapseStale) {
		b.br.tidy(q, now)
	}
	scheduledFrom := now
	if b.br.is(StatsDueStale) {
		scheduledFrom = q.received // a message is due only once a Receive saw it so
	}
	st := driver.Stats{Dead: int64(len(b.br.deadOf(name).dead))}
	for _, m := range q.msgs {
		switch {
		case m.token != 0:
			st.InFlight++
		case m.notBefore.After(scheduledFrom):
			st.Scheduled++
		default:
			st.Ready++
			at := m.readyAt
			if m.notBefore.After(at) && !b.br.is(OldestReadyEnqueued) {
				at = m.notBefore
			}
			if st.OldestReady.IsZero() || at.Before(st.OldestReady) {
				st.OldestReady = at
			}
		}
	}
	return st, nil
}

// DeleteQueue implements driver.QueueDeleter.
func (b *Backend) DeleteQueue(_ context.Context, name string) error {
	if err := b.lock(); err != nil {
		return err
	}
	defer b.br.mu.Unlock()
	if q := b.br.queues[name]; q != nil {
		q.signal()
		delete(b.br.queues, name)
	}
	return nil
}

// Close implements driver.Backend: the connection's unsettled deliveries
// come back at once, counted, and its dead-letter holds are released, as
// when a process dies.
func (b *Backend) Close() error {
	b.br.mu.Lock()
	defer b.br.mu.Unlock()
	if b.closed {
		switch {
		case b.br.is(CloseTwiceFails):
			return fmt.Errorf("reference: closed already")
		case b.br.is(CloseTwiceErrClosed):
			return driver.ErrClosed
		}
		return nil
	}
	b.closed = true
	close(b.done)
	abandoned, released := 0, 0
	for _, q := range b.br.queues {
		for _, m := range slices.Clone(q.msgs) {
			if m.owner == b {
				abandoned++
				switch {
				case b.br.is(CloseLosesDeliveries), b.br.is(CloseLosesLater) && abandoned > 1:
					q.remove(m)
				case b.br.is(CloseKeepsLaterLeases) && abandoned > 1:
					// left leased until its lease runs out
				case !b.br.is(CloseKeepsLeases):
					m.token, m.owner = 0, nil
				}
			}
		}
		for _, r := range q.dead {
			if r.owner != b {
				continue
			}
			released++
			switch {
			case b.br.is(CloseKeepsHolds),
				b.br.is(CloseKeepsLaterHolds) && released > 1,
				b.br.is(CloseKeepsSecondHolder) && b != b.br.holder:
				r.until = time.Time{} // held for good
			default:
				r.token, r.owner = 0, nil
			}
		}
		q.signal()
	}
	return nil
}
