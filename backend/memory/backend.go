// Package memory is an in-process asyncplatform backend: complete, fast and
// safe for concurrent use. It is the embedded default for demos and for
// users' own tests.
//
// # Layout
//
// A Broker holds the queues; a Backend is one connection to it. New returns a
// connection to a private broker. To model several worker processes sharing
// one broker, make a Broker with NewBroker and Connect once per "process":
// closing a connection is exactly a crash of that process. Its unsettled
// deliveries are returned at once with the delivery counted
// (Capabilities.RedeliversOnClose), so a test can exercise poison handling:
//
//	broker := memory.NewBroker()
//	worker := broker.Connect() // this one will "crash"
//	...
//	worker.Close()             // the job comes back with Crashes+1
//
// # Counting
//
// Deliveries are counted at claim time, under the broker's lock, together with
// the lease (a token and a deadline). Every settle checks the token, so a
// stale delivery gets driver.ErrLeaseLost. Leases that run out are returned
// by the next Receive (or the wake-up it sets for the earliest deadline).
//
// # Limits
//
// Nothing persists: a process exit loses everything. No message size limit.
package memory

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Broker is the in-memory store shared by its connections.
type Broker struct {
	mu     sync.Mutex
	queues map[string]*queue
	token  uint64 // last lease token handed out
	seq    uint64 // orders scheduled messages with equal due times
}

// NewBroker returns an empty broker.
func NewBroker() *Broker { return &Broker{queues: map[string]*queue{}} }

// Backend is one connection to a Broker. It implements driver.Backend.
type Backend struct {
	broker *Broker
	closed bool // guarded by broker.mu
	done   chan struct{}
	once   sync.Once
}

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.QueueDeleter = (*Backend)(nil)
)

// New returns a connection to a new private broker.
func New() *Backend { return NewBroker().Connect() }

// Connect opens a new connection to the broker.
func (br *Broker) Connect() *Backend { return &Backend{broker: br, done: make(chan struct{})} }

type message struct {
	id         string
	body       []byte
	notBefore  time.Time
	seq        uint64
	deliveries int
	// lease, when held
	token      uint64
	leaseUntil time.Time
	owner      *Backend
}

type delivery struct {
	d     driver.Delivery
	m     *message
	token uint64
	owner *Backend
}

type deadRecord struct {
	driver.DeadMessage
	token uint64 // non-zero while held by a NextDead caller
	owner *Backend
}

type deadHandle struct {
	rec   *deadRecord
	token uint64
}

type queue struct {
	ready     fifo
	scheduled schedHeap
	leases    leaseHeap // lazily cleaned: entries whose token moved on are skipped
	inflight  map[*message]struct{}
	dead      []*deadRecord
	wake      chan struct{} // closed to wake receivers; replaced when taken
	waiting   bool
}

func (br *Broker) queue(name string) *queue {
	q := br.queues[name]
	if q == nil {
		q = &queue{inflight: map[*message]struct{}{}, wake: make(chan struct{})}
		br.queues[name] = q
	}
	return q
}

// signal wakes the receivers waiting on q.
func (q *queue) signal() {
	if q.waiting {
		close(q.wake)
		q.wake = make(chan struct{})
		q.waiting = false
	}
}

// Capabilities implements driver.Backend.
func (b *Backend) Capabilities() driver.Capabilities {
	return driver.Capabilities{RedeliversOnClose: true}
}

func (b *Backend) lock() error {
	b.broker.mu.Lock()
	if b.closed {
		b.broker.mu.Unlock()
		return driver.ErrClosed
	}
	return nil
}

// Declare implements driver.Backend.
func (b *Backend) Declare(ctx context.Context, name string) error {
	if err := b.lock(); err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	b.broker.queue(name)
	return nil
}

// Enqueue implements driver.Backend.
func (b *Backend) Enqueue(ctx context.Context, name string, msgs []driver.Message) error {
	if err := b.lock(); err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	q := b.broker.queue(name)
	now := time.Now()
	for _, m := range msgs {
		b.broker.put(q, &message{id: m.ID, body: m.Body, notBefore: m.NotBefore}, now)
	}
	return nil
}

// put stores m as ready or scheduled. The broker lock is held.
func (br *Broker) put(q *queue, m *message, now time.Time) {
	if m.notBefore.After(now) {
		br.seq++
		m.seq = br.seq
		heap.Push(&q.scheduled, m)
		q.signal() // a waiter may need an earlier timer
		return
	}
	q.ready.push(m)
	q.signal()
}

// Receive implements driver.Backend.
func (b *Backend) Receive(ctx context.Context, name string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if max <= 0 {
		return nil, fmt.Errorf("memory: Receive max is %d, it must be positive", max)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := b.lock(); err != nil {
			return nil, err
		}
		q := b.broker.queue(name)
		now := time.Now()
		b.broker.tidy(q, now)
		if n := min(max, q.ready.len()); n > 0 {
			out := make([]*driver.Delivery, n)
			for i := range out {
				out[i] = b.claim(q, name, q.ready.pop(), now, lease)
			}
			if q.ready.len() > 0 {
				q.signal() // leave the rest to other receivers
			}
			b.broker.mu.Unlock()
			return out, nil
		}
		next := q.nextDue()
		q.waiting = true
		wake := q.wake
		b.broker.mu.Unlock()

		var due <-chan time.Time
		if !next.IsZero() {
			if timer == nil {
				timer = time.NewTimer(time.Until(next))
			} else {
				timer.Reset(time.Until(next))
			}
			due = timer.C
		}
		select {
		case <-wake:
		case <-due:
		case <-b.done:
			return nil, driver.ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// claim leases m to b. The broker lock is held.
func (b *Backend) claim(q *queue, name string, m *message, now time.Time, lease time.Duration) *driver.Delivery {
	b.broker.token++
	m.token = b.broker.token
	m.deliveries++
	m.leaseUntil = now.Add(lease)
	m.owner = b
	q.inflight[m] = struct{}{}
	q.compactLeases()
	q.leases.push(leaseEntry{m: m, token: m.token, until: m.leaseUntil})
	dl := &delivery{m: m, token: m.token, owner: b}
	dl.d = driver.Delivery{Queue: name, Body: m.body, Deliveries: m.deliveries, Handle: dl}
	return &dl.d
}

// tidy promotes due scheduled messages and returns expired leases. The broker
// lock is held.
func (br *Broker) tidy(q *queue, now time.Time) {
	for q.scheduled.Len() > 0 && !q.scheduled[0].notBefore.After(now) {
		q.ready.push(heap.Pop(&q.scheduled).(*message))
	}
	for q.leases.Len() > 0 && !q.leases[0].until.After(now) {
		e := q.leases.pop()
		if e.m.token == e.token && e.m.leaseUntil.Equal(e.until) {
			br.release(q, e.m)
		}
	}
}

// release returns a held message to ready, its delivery already counted.
func (br *Broker) release(q *queue, m *message) {
	delete(q.inflight, m)
	m.token, m.owner = 0, nil
	q.ready.push(m)
	q.signal()
}

// nextDue is the earliest time something may become ready.
func (q *queue) nextDue() time.Time {
	var t time.Time
	if q.scheduled.Len() > 0 {
		t = q.scheduled[0].notBefore
	}
	if q.leases.Len() > 0 && (t.IsZero() || q.leases[0].until.Before(t)) {
		t = q.leases[0].until
	}
	return t
}

// held checks that d still holds its message and returns its queue. On
// success the broker lock is held.
func (b *Backend) held(d *driver.Delivery) (*queue, *delivery, error) {
	dl, ok := d.Handle.(*delivery)
	if !ok || dl.owner != b {
		return nil, nil, fmt.Errorf("memory: delivery was not handed out by this backend")
	}
	if err := b.lock(); err != nil {
		return nil, nil, err
	}
	q := b.broker.queues[d.Queue]
	if q == nil || dl.m.token != dl.token || !time.Now().Before(dl.m.leaseUntil) {
		if q != nil && dl.m.token == dl.token {
			b.broker.release(q, dl.m) // expired: return it now
		}
		b.broker.mu.Unlock()
		return nil, nil, driver.ErrLeaseLost
	}
	return q, dl, nil
}

// settle ends d's lease and forgets its message. The broker lock is held.
func settle(q *queue, dl *delivery) {
	delete(q.inflight, dl.m)
	dl.m.token, dl.m.owner = 0, nil
}

// Ack implements driver.Backend.
func (b *Backend) Ack(ctx context.Context, d *driver.Delivery) error {
	q, dl, err := b.held(d)
	if err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	settle(q, dl)
	return nil
}

// Extend implements driver.Backend.
func (b *Backend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	q, dl, err := b.held(d)
	if err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	dl.m.leaseUntil = time.Now().Add(lease)
	q.leases.push(leaseEntry{m: dl.m, token: dl.token, until: dl.m.leaseUntil})
	return nil
}

// Requeue implements driver.Backend.
func (b *Backend) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	q, dl, err := b.held(d)
	if err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	settle(q, dl)
	b.broker.put(q, &message{id: msg.ID, body: msg.Body, notBefore: msg.NotBefore}, time.Now())
	return nil
}

// DeadLetter implements driver.Backend.
func (b *Backend) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	q, dl, err := b.held(d)
	if err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	settle(q, dl)
	q.dead = append(q.dead, &deadRecord{DeadMessage: rec})
	return nil
}

// NextDead implements driver.Backend.
func (b *Backend) NextDead(ctx context.Context, name string) (*driver.DeadDelivery, error) {
	if err := b.lock(); err != nil {
		return nil, err
	}
	defer b.broker.mu.Unlock()
	for _, r := range b.broker.queue(name).dead {
		if r.token == 0 {
			b.broker.token++
			r.token, r.owner = b.broker.token, b
			return &driver.DeadDelivery{DeadMessage: r.DeadMessage, Handle: deadHandle{rec: r, token: r.token}}, nil
		}
	}
	return nil, driver.ErrNoDeadLetters
}

// SettleDead implements driver.Backend.
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	h, ok := d.Handle.(deadHandle)
	if !ok {
		return fmt.Errorf("memory: dead letter was not handed out by this backend")
	}
	if err := b.lock(); err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	if h.rec.token != h.token {
		return driver.ErrLeaseLost
	}
	h.rec.token, h.rec.owner = 0, nil
	if remove {
		for _, q := range b.broker.queues {
			for i, r := range q.dead {
				if r == h.rec {
					if i == 0 { // the usual case: the head, in O(1)
						q.dead[0] = nil
						q.dead = q.dead[1:]
					} else {
						q.dead = slices.Delete(q.dead, i, i+1)
					}
					return nil
				}
			}
		}
		return driver.ErrLeaseLost
	}
	return nil
}

// ListDead implements driver.Backend. The cursor is an index.
func (b *Backend) ListDead(ctx context.Context, name, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	start := 0
	if cursor != "" {
		n, err := strconv.Atoi(cursor)
		if err != nil || n < 0 {
			return nil, "", fmt.Errorf("memory: bad dead-letter cursor %q", cursor)
		}
		start = n
	}
	if err := b.lock(); err != nil {
		return nil, "", err
	}
	defer b.broker.mu.Unlock()
	dead := b.broker.queue(name).dead
	if start >= len(dead) {
		return nil, "", nil
	}
	end := min(start+limit, len(dead))
	out := make([]driver.DeadMessage, 0, end-start)
	for _, r := range dead[start:end] {
		out = append(out, r.DeadMessage)
	}
	next := ""
	if end < len(dead) {
		next = strconv.Itoa(end)
	}
	return out, next, nil
}

// DeleteDead implements driver.Backend. Held records are left alone.
func (b *Backend) DeleteDead(ctx context.Context, name string, ids []string) (int, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	if err := b.lock(); err != nil {
		return 0, err
	}
	defer b.broker.mu.Unlock()
	q := b.broker.queue(name)
	kept := q.dead[:0:0]
	for _, r := range q.dead {
		if r.token == 0 && want[r.ID] {
			continue
		}
		kept = append(kept, r)
	}
	n := len(q.dead) - len(kept)
	q.dead = kept
	return n, nil
}

// PurgeDead implements driver.Backend.
func (b *Backend) PurgeDead(ctx context.Context, name string) (int, error) {
	if err := b.lock(); err != nil {
		return 0, err
	}
	defer b.broker.mu.Unlock()
	q := b.broker.queue(name)
	n := len(q.dead)
	for _, r := range q.dead {
		r.token = 0 // a holder's SettleDead now fails
	}
	q.dead = nil
	return n, nil
}

// Stats implements driver.Backend.
func (b *Backend) Stats(ctx context.Context, name string) (driver.Stats, error) {
	if err := b.lock(); err != nil {
		return driver.Stats{}, err
	}
	defer b.broker.mu.Unlock()
	q := b.broker.queue(name)
	b.broker.tidy(q, time.Now())
	return driver.Stats{
		Ready:     int64(q.ready.len()),
		Scheduled: int64(q.scheduled.Len()),
		InFlight:  int64(len(q.inflight)),
		Dead:      int64(len(q.dead)),
	}, nil
}

// DeleteQueue implements driver.QueueDeleter.
func (b *Backend) DeleteQueue(ctx context.Context, name string) error {
	if err := b.lock(); err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	if q := b.broker.queues[name]; q != nil {
		for m := range q.inflight {
			m.token = 0
		}
		q.signal()
		delete(b.broker.queues, name)
	}
	return nil
}

// Close implements driver.Backend: the connection's unsettled deliveries and
// held dead letters are returned at once, as when a process dies.
func (b *Backend) Close() error {
	b.once.Do(func() {
		b.broker.mu.Lock()
		defer b.broker.mu.Unlock()
		b.closed = true
		close(b.done)
		for _, q := range b.broker.queues {
			for m := range q.inflight {
				if m.owner == b {
					b.broker.release(q, m)
				}
			}
			for _, r := range q.dead {
				if r.owner == b {
					r.token, r.owner = 0, nil
				}
			}
		}
	})
	return nil
}

// fifo is a slice-backed queue.
type fifo struct {
	items []*message
	head  int
}

func (f *fifo) len() int { return len(f.items) - f.head }

func (f *fifo) push(m *message) {
	if f.head > 0 && f.head == len(f.items) {
		f.items, f.head = f.items[:0], 0
	} else if f.head > 1024 && f.head*2 > len(f.items) {
		n := copy(f.items, f.items[f.head:])
		clear(f.items[n:])
		f.items, f.head = f.items[:n], 0
	}
	f.items = append(f.items, m)
}

func (f *fifo) pop() *message {
	m := f.items[f.head]
	f.items[f.head] = nil
	f.head++
	return m
}

type schedHeap []*message

func (h schedHeap) Len() int { return len(h) }
func (h schedHeap) Less(i, j int) bool {
	if h[i].notBefore.Equal(h[j].notBefore) {
		return h[i].seq < h[j].seq
	}
	return h[i].notBefore.Before(h[j].notBefore)
}
func (h schedHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *schedHeap) Push(x any)   { *h = append(*h, x.(*message)) }
func (h *schedHeap) Pop() any {
	old := *h
	m := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return m
}

type leaseEntry struct {
	m     *message
	token uint64
	until time.Time
}

// leaseHeap is a min-heap on until, typed to avoid boxing each entry.
type leaseHeap []leaseEntry

func (h leaseHeap) Len() int { return len(h) }

func (h *leaseHeap) push(e leaseEntry) {
	*h = append(*h, e)
	a := *h
	for i := len(a) - 1; i > 0; {
		p := (i - 1) / 2
		if !a[i].until.Before(a[p].until) {
			break
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func (h *leaseHeap) pop() leaseEntry {
	a := *h
	e := a[0]
	n := len(a) - 1
	a[0] = a[n]
	a[n] = leaseEntry{}
	a = a[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && a[l].until.Before(a[m].until) {
			m = l
		}
		if r < n && a[r].until.Before(a[m].until) {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return e
}

// rebuild drops the stale entries, once they outnumber the live ones.
func (q *queue) compactLeases() {
	if len(q.leases) < 1024 || len(q.leases) < 4*len(q.inflight) {
		return
	}
	old := q.leases
	q.leases = make(leaseHeap, 0, 2*len(q.inflight))
	for _, e := range old {
		if e.m.token == e.token && e.m.leaseUntil.Equal(e.until) {
			q.leases.push(e)
		}
	}
}
