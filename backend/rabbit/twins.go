package rabbit

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Twins: two stored messages of one publish. A publish whose confirm was
// lost with its connection is sent again under the same instance (see
// publishFor), and the broker may have stored the first one: the queue
// then holds two messages with one instance. When one of them reaches the
// Backend while the other is held by a Receive of the same Backend on a
// live channel, the newcomer is a twin (one stored message is never handed
// out twice while a live channel holds it), and it is acked without being
// handed out. Dropping it loses nothing: the held sibling ends only by an
// ack (its job ran), a replacement whose successor is stored, or the loss
// of its channel, which brings the sibling back.
//
// A release hands back the deliveries its consumer buffered as copies
// with new instances (see handBack), and a twin can be among them: each
// copy (copyOf: a release, a delay hop or sweep, never a Requeue's
// successor) carries in originHeader the publish it stores, the origin of
// what it copies or else that message's instance. Twins are matched by
// origin (or instance, without one).
//
// A Backend also remembers, for doubtTTL and doubtMax of them, the origins
// of the deliveries it handed out and settled (an Ack, or a replacement
// whose successor is stored; Backend.ran), across its connections: a later
// delivery of one of them is a twin, or the message itself back after a
// lost ack, and is dropped. (The recent acks cannot serve: a copy of a
// twin has an instance of its own, and a release's acks of the originals
// it handed back must not drop their copies.)
//
// Twins reaching two processes, or one Backend more than doubtTTL after
// its sibling's settle, both run.

// heldMax is how many holders a Backend keeps before it drops those no
// longer live; past twice the live ones after the last drop, it drops
// again.
const heldMax = 1024

// holders maps the instances a Backend handed out, and not yet settled, to
// their receipts.
type holders struct {
	mu   sync.Mutex
	by   map[string]*receipt
	live int // holders left by the last prune
}

// live reports whether r is still held: not settled, on a live channel.
func (r *receipt) live() bool { return !r.settled.Load() && r.c.alive() == nil }

// take makes r the holder of its publish (see twinKey) and reports true,
// unless a live receipt holds that publish already: r's delivery is then a
// twin.
func (h *holders) take(r *receipt) bool {
	k := r.twinKey()
	if k == "" {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if o, ok := h.by[k]; ok && o.live() {
		return false
	}
	if h.by == nil {
		h.by = map[string]*receipt{}
	}
	h.by[k] = r
	if len(h.by) > max(heldMax, 2*h.live) {
		for inst, o := range h.by {
			if !o.live() {
				delete(h.by, inst)
			}
		}
		h.live = len(h.by)
	}
	return true
}

// drop forgets r as its instance's holder, once it is settled.
func (h *holders) drop(r *receipt) {
	k := r.twinKey()
	if k == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.by[k] == r {
		delete(h.by, k)
	}
}

// originHeader carries, on a copy, the publish it stores: 32 hex digits,
// the instance of the first message of the line of copies.
const originHeader = "x-asyncplatform-origin"

// originOf returns the publish a delivery stores: its origin, or else its
// instance; "" when it has neither (the headers are untrusted).
func originOf(h amqp.Table) string {
	if s, ok := h[originHeader].(string); ok && len(s) == 32 {
		if _, err := hex.DecodeString(s); err == nil {
			return s
		}
	}
	return instanceOf(h)
}

// twinKey is what r's twins share: its origin.
func (r *receipt) twinKey() string { return r.origin }

// Enqueues tried again. An Enqueue that fails after its publish went out
// (a confirm lost with a killed node, then nacks on the next one until the
// caller's ctx ended) may have stored its message, and the caller, told it
// failed, enqueues the job again: a second stored message that no twin
// check could match, since it had a new instance. So a Backend remembers,
// for unsureTTL, the instance of each message of a failed Enqueue, by
// queue and message ID, and an Enqueue of the same ID and body to the
// same queue publishes under that instance again: the two, if both are
// stored, are twins (see above). An Enqueue that succeeds forgets its
// messages. Another body under the ID is a new job (or a job signed anew),
// published under an instance of its own: taken for a twin it would be
// dropped once the failed Enqueue's message ran. A job ID enqueued again
// on purpose with the same body after a failed Enqueue of it, within
// unsureTTL, is taken as the same job.
const (
	// unsureTTL is how long an instance of a failed Enqueue is kept.
	unsureTTL = 10 * time.Minute

	// unsureMax bounds the instances kept; past it, the expired are
	// dropped, and a new one is not kept while none has expired.
	unsureMax = 1 << 14
)

// unsureSends maps queue and message ID to the instance of a failed
// Enqueue's publish.
type unsureSends struct {
	mu sync.Mutex
	by map[unsureKey]unsureSend
}

type unsureKey struct{ queue, id string }

type unsureSend struct {
	inst  string
	sum   [sha256.Size]byte // the body's: a new job under the same ID is no retry
	until time.Time
}

// get returns the instance a failed Enqueue of id to queue published with
// the same body, or "". A body of its own is a new job under a reused ID,
// not a retry: taken for a twin, it would be dropped when the failed
// Enqueue's message ran.
func (u *unsureSends) get(now time.Time, queue, id string, body []byte) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	s, ok := u.by[unsureKey{queue, id}]
	if !ok || now.After(s.until) || s.sum != sha256.Sum256(body) {
		return ""
	}
	return s.inst
}

// failed remembers the instances of msgs, whose Enqueue to queue failed.
func (u *unsureSends) failed(now time.Time, queue string, msgs []outMsg, ids []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.by == nil {
		u.by = map[unsureKey]unsureSend{}
	}
	for i, m := range msgs {
		inst := instanceOf(m.pub.Headers)
		if ids[i] == "" || inst == "" {
			continue
		}
		if len(u.by) >= unsureMax {
			for k, s := range u.by {
				if now.After(s.until) {
					delete(u.by, k)
				}
			}
			if len(u.by) >= unsureMax {
				return
			}
		}
		u.by[unsureKey{queue, ids[i]}] = unsureSend{inst: inst, sum: sha256.Sum256(m.pub.Body), until: now.Add(unsureTTL)}
	}
}

// stored forgets the messages ids of queue: their Enqueue succeeded.
func (u *unsureSends) stored(queue string, ids []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.by) == 0 {
		return
	}
	for _, id := range ids {
		delete(u.by, unsureKey{queue, id})
	}
}
