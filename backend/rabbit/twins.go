package rabbit

import "sync"

// Twins: two stored messages of one publish. A publish whose confirm was
// lost with its connection is sent again under the same instance (see
// publishFor), and the broker may have stored the first one: the queue
// then holds two messages with one instance. When one of them reaches the
// Backend while the other is held by a Receive of the same Backend on a
// live channel, the newcomer is a twin (one stored message is never handed
// out twice while a live channel holds it), and it is acked without being
// handed out. Dropping it loses nothing: the held sibling ends only by an
// ack (its job ran), a replacement whose successor is stored, or the loss
// of its channel, which brings the sibling back. A twin that arrives after
// its sibling was acked is dropped by the recent acks (see lostack.go).
// Twins reaching two processes, or one Backend after its sibling's ack
// has left the recent acks, both run.

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

// take makes r the holder of its instance and reports true, unless a live
// receipt holds that instance already: r's delivery is then a twin.
func (h *holders) take(r *receipt) bool {
	if r.inst == "" {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if o, ok := h.by[r.inst]; ok && o.live() {
		return false
	}
	if h.by == nil {
		h.by = map[string]*receipt{}
	}
	h.by[r.inst] = r
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
	if r.inst == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.by[r.inst] == r {
		delete(h.by, r.inst)
	}
}
