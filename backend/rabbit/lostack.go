package rabbit

import (
	"context"
	"sync"
	"time"
)

// Acks lost with their connection. AMQP acks are not confirmed: an ack
// written just before its connection died (a killed node, a cut) may never
// have been applied, and the queue then hands its message out again,
// counted, although the platform had settled it: a job that succeeded runs
// twice (TestCluster/NodeKill: 1 duplicate in 3 of 6 runs). So a Backend
// remembers the instances (see instanceHeader) its consumer channels
// acked during the last ackDoubt, at most recentMax; when its connection
// is lost (the supervisor sees it closed), those become doubtful for
// doubtTTL, at most doubtMax of them, and a
// redelivery (x-delivery-count or the redelivered flag) of a doubtful
// instance is acked and never handed out, by this Backend alone, with no
// store. A delivery of an instance among the last recentMax acks of the
// live connection is dropped too, first delivery or not: that is a second
// stored message of one publish (an Enqueue whose confirm was lost with a
// killed node is published again, and both copies are stored), whose
// sibling this Backend already ran to its end. With Config.Store, the
// doubtful ones are also written as gone marks (see
// gone.go), so that a redelivery to another process is dropped too. An
// ack that fails to be written is not remembered (the platform sees
// ErrLeaseLost and the message comes back as a crash), and neither is an
// ack of a message without an instance (written by an older version or
// another writer). Dropping such a redelivery is right whatever the ack
// was for: every ack this backend sends ends its message for good (a
// success, or a replacement whose successor is stored).
const (
	// ackDoubt is how long before a channel's loss an ack may have been
	// written and not applied: an ack frame is applied within a Raft
	// round trip of the queue, far less than this under any load seen.
	ackDoubt = 10 * time.Second

	// recentMax bounds the acks a Backend remembers.
	recentMax = 8192

	// doubtTTL is how long a doubtful ack is remembered: a lost channel's
	// deliveries go back to the queue at once, but may be handed out
	// again only behind the queue's backlog.
	doubtTTL = 10 * time.Minute

	// doubtMax bounds the doubtful acks a Backend remembers; the oldest go
	// first.
	doubtMax = 1 << 16
)

// recentAcks is what the consumer channels of a Backend's connection
// acked lately.
type recentAcks struct {
	mu   sync.Mutex
	ring []ackedAt            // oldest first from head, once full
	head int                  // the oldest, once the ring is full
	seen map[string]time.Time // the ring's instances, with their last ack
}

// has reports whether inst is among the recent acks.
func (r *recentAcks) has(inst string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.seen[inst]
	return ok
}

type ackedAt struct {
	inst string
	at   time.Time
}

// acked remembers the instances insts, just acked on q's channel. When
// q's connection is closed already they are doubtful at once: the ack
// frame may have been written to a dead socket. (amqp091 marks a
// connection closed before it tells the supervisor, which then makes the
// recent acks doubtful under the same lock: every ack is in one or the
// other.)
func (b *Backend) acked(q *qchan, insts ...string) {
	r := &b.recent
	now := time.Now()
	r.mu.Lock()
	if q.conn != nil && q.conn.IsClosed() {
		r.mu.Unlock()
		b.doubt.add(now, insts)
		return
	}
	if r.seen == nil {
		r.seen = map[string]time.Time{}
	}
	for _, inst := range insts {
		if inst == "" {
			continue
		}
		r.seen[inst] = now
		if len(r.ring) < recentMax {
			r.ring = append(r.ring, ackedAt{inst, now})
			continue
		}
		if old := r.ring[r.head]; r.seen[old.inst].Equal(old.at) {
			delete(r.seen, old.inst)
		}
		r.ring[r.head] = ackedAt{inst, now}
		r.head = (r.head + 1) % recentMax
	}
	r.mu.Unlock()
}

// lostAcks makes the acks sent on the Backend's lost connection during
// its last ackDoubt doubtful, and writes their gone marks when there is a
// store. The supervisor calls it once the connection is lost, before it
// dials the next one.
func (b *Backend) lostAcks() {
	r := &b.recent
	now := time.Now()
	r.mu.Lock()
	var insts []string
	for _, a := range r.ring {
		if now.Sub(a.at) <= ackDoubt {
			insts = append(insts, a.inst)
		}
	}
	r.ring, r.head, r.seen = nil, 0, nil
	r.mu.Unlock()
	if len(insts) == 0 {
		return
	}
	b.doubt.add(now, insts)
	b.log.Debug("acks sent just before the connection was lost are doubtful; their redeliveries are dropped", "acks", len(insts))
	if b.cfg.Store == nil {
		return
	}
	b.later(func() {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.PublishTimeout)
		defer cancel()
		if err := b.markEach(ctx, insts, b.goneKey, goneValue, goneTTL); err != nil {
			b.log.Debug("gone marks of doubtful acks not written; another process may run their redeliveries", "acks", len(insts), "err", err)
		}
	})
}

// doubtSet holds the doubtful acks of a Backend: instances whose ack may
// have been lost with its channel.
type doubtSet struct {
	mu    sync.Mutex
	until map[string]time.Time
	order []ackedAt // in the order added; at is the expiry
}

// add makes insts doubtful from now for doubtTTL.
func (s *doubtSet) add(now time.Time, insts []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = map[string]time.Time{}
	}
	exp := now.Add(doubtTTL)
	for _, inst := range insts {
		if inst == "" {
			continue
		}
		s.until[inst] = exp
		s.order = append(s.order, ackedAt{inst, exp})
	}
	// Drop the expired and the oldest beyond doubtMax.
	n := 0
	for n < len(s.order) && (len(s.order)-n > doubtMax || now.After(s.order[n].at)) {
		if e := s.order[n]; s.until[e.inst] == e.at {
			delete(s.until, e.inst)
		}
		n++
	}
	s.order = s.order[n:]
}

// has reports whether inst is doubtful at now.
func (s *doubtSet) has(now time.Time, inst string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.until[inst]
	return ok && !now.After(exp)
}
