package memory

import (
	"bytes"
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Broker is the in-memory store shared by its connections.
type Broker struct {
	mu     sync.Mutex
	queues map[string]*queue
	token  uint64  // last lease token handed out
	seq    uint64  // orders scheduled messages with equal due times
	kv     kvState // the store (store.go), with its own lock
}

// NewBroker returns an empty broker.
func NewBroker() *Broker { return &Broker{queues: map[string]*queue{}} }

// Backend is one connection to a Broker. It implements driver.Backend.
type Backend struct {
	broker   *Broker
	deadHold time.Duration // Config.DeadHold
	closed   bool          // guarded by broker.mu
	done     chan struct{}
	once     sync.Once
}

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.QueueDeleter = (*Backend)(nil)
)

// Config configures a Backend. The zero value is usable.
type Config struct {
	// Broker is the broker the Backend connects to. Backends of one Broker
	// share its queues, as worker processes share a server; closing one is
	// a crash of that "process". Defaults to nil: a new private broker.
	Broker *Broker

	// DeadHold is how long a dead letter handed out by NextDead stays held
	// without ExtendDead or SettleDead; the platform renews it every
	// DeadHold/3 while its caller works. Zero, the default, holds it until
	// SettleDead or Close. A test sets it to model a broker whose holds
	// lapse.
	DeadHold time.Duration
}

// New returns a connection to cfg.Broker, or to a new private broker. It
// fails only for a negative DeadHold, and ignores ctx: the signature is the
// one every backend's New has.
func New(_ context.Context, cfg Config) (*Backend, error) {
	br := cfg.Broker
	if br == nil {
		br = NewBroker()
	}
	if cfg.DeadHold < 0 {
		return nil, fmt.Errorf("memory: Config.DeadHold %v must not be negative", cfg.DeadHold)
	}
	b := br.Connect()
	b.deadHold = cfg.DeadHold
	return b, nil
}

// Connect opens a new connection to the broker: New with Config.Broker set
// to br.
func (br *Broker) Connect() *Backend { return &Backend{broker: br, done: make(chan struct{})} }

type message struct {
	id         string
	body       []byte
	notBefore  time.Time
	readyAt    time.Time // when it became deliverable, while ready
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
	token uint64    // non-zero while held by a NextDead caller
	until time.Time // when the hold lapses; zero: never
	owner *Backend
}

// held reports whether a NextDead caller holds the record at now.
func (r *deadRecord) held(now time.Time) bool {
	return r.token != 0 && (r.until.IsZero() || now.Before(r.until))
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
	return driver.Capabilities{RedeliversOnClose: true, DeadHold: b.deadHold, LocalSettle: true}
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
	b.broker.tidy(q, now) // due jobs go ahead of these in line
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
	m.readyAt = now
	q.ready.push(m)
	q.signal()
}

// Stats implements driver.Backend.
func (b *Backend) Stats(ctx context.Context, name string) (driver.Stats, error) {
	if err := b.lock(); err != nil {
		return driver.Stats{}, err
	}
	defer b.broker.mu.Unlock()
	q := b.broker.queue(name)
	b.broker.tidy(q, time.Now())
	s := driver.Stats{
		Ready:     int64(q.ready.len()),
		Scheduled: int64(q.scheduled.Len()),
		InFlight:  int64(len(q.inflight)),
		Dead:      int64(len(q.dead)),
	}
	if m := q.ready.first(); m != nil {
		s.OldestReady = m.readyAt
	}
	return s, nil
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

var _ driver.ClaimingEnqueuer = (*Backend)(nil)

// ClaimsWithEnqueue implements driver.ClaimingEnqueuer: always.
func (b *Backend) ClaimsWithEnqueue() bool { return true }

// EnqueueClaiming implements driver.ClaimingEnqueuer: under one hold of
// the broker's lock and the store's.
func (b *Backend) EnqueueClaiming(ctx context.Context, name string, msgs []driver.ClaimMessage) ([]driver.ClaimResult, error) {
	if err := b.lock(); err != nil {
		return nil, err
	}
	defer b.broker.mu.Unlock()
	kv, err := b.kv()
	if err != nil {
		return nil, err
	}
	defer kv.mu.Unlock()
	q := b.broker.queue(name)
	now := time.Now()
	out := make([]driver.ClaimResult, len(msgs))
	for i, m := range msgs {
		if c := m.Claim; c != nil {
			if e := kv.entries[c.Key]; e.live(now) {
				out[i] = driver.ClaimResult{Err: driver.ErrKeyExists, Value: bytes.Clone(e.value)}
				continue
			}
			kv.put(c.Key, c.Value, c.TTL, now)
		}
		b.broker.put(q, &message{id: m.ID, body: m.Body, notBefore: m.NotBefore}, now)
	}
	return out, nil
}
