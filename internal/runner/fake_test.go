package runner

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// patience bounds every wait of these tests. It only stops a hang: no
// assertion depends on how soon an event comes (CONTRIBUTING: tests that
// hold on a busy machine).
const patience = 20 * time.Second

// fakeLease is the Handle of one delivery of the fake backend.
type fakeLease struct {
	id      string
	settled bool // acked, requeued or dead-lettered: the lease is gone
	lost    bool // the test took the lease away
	extends int  // successful and failed Extend calls on it
}

// fakeBackend is a small in-memory driver.Backend for the runner's unit
// tests: queues of bodies, a count of the deliveries handed out and not
// settled (outstanding), and hooks to make calls fail. Only the methods the
// runner uses do anything.
type fakeBackend struct {
	t *testing.T

	mu      sync.Mutex
	changed chan struct{} // closed and replaced when a queue gets a message
	ready   map[string][]string
	seq     int

	// limit, when positive, is the most deliveries the runner may hold at
	// once: a Receive asking for more than limit-outstanding is an error.
	limit          int
	overMax        int // a defect on purpose: Receive hands out up to max+overMax
	outstanding    int
	maxOutstanding int

	receives      int                  // Receive calls
	receiveTimes  []time.Time          // when each Receive was called
	receiveMax    []int                // the max argument of each Receive
	receiveErr    func(call int) error // non-nil: the error of Receive number call (1-based), nil for a normal Receive
	receiveEnded  chan error           // gets each Receive's error (buffered; dropped when full)
	extendErr     func(d *driver.Delivery) error
	extendWait    time.Duration // each Extend takes this long, or fails when its context ends first
	extendCalls   int
	extendLeases  []time.Duration
	extended      chan string // gets the id of each extended delivery (buffered; dropped when full)
	acked         []string
	ackHook       func(id string) // non-nil: called by Ack before it settles, outside the lock
	requeued      []string
	settleCalls   int
	byQueueClaims []string       // queue of each delivery handed out, in order
	blocked       map[string]int // Receive calls waiting for a message, by queue
}

func newFakeBackend(t *testing.T) *fakeBackend {
	return &fakeBackend{
		t:            t,
		changed:      make(chan struct{}),
		ready:        map[string][]string{},
		blocked:      map[string]int{},
		receiveEnded: make(chan error, 1000),
		extended:     make(chan string, 1000),
	}
}

// push makes n messages ready on the queue.
func (b *fakeBackend) push(queue string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range n {
		b.seq++
		b.ready[queue] = append(b.ready[queue], fmt.Sprintf("%s-%d", queue, b.seq))
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *fakeBackend) lease(d *driver.Delivery) *fakeLease { return d.Handle.(*fakeLease) }

// snapshot runs fn under the backend's lock.
func (b *fakeBackend) snapshot(fn func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fn()
}

func (b *fakeBackend) Capabilities() driver.Capabilities { return driver.Capabilities{} }

func (b *fakeBackend) Declare(context.Context, string) error { return nil }

func (b *fakeBackend) Enqueue(_ context.Context, queue string, msgs []driver.Message) error {
	b.push(queue, len(msgs))
	return nil
}

func (b *fakeBackend) Receive(ctx context.Context, queue string, max int, _ time.Duration) (ds []*driver.Delivery, err error) {
	defer func() {
		select {
		case b.receiveEnded <- err:
		default:
		}
	}()
	b.mu.Lock()
	b.receives++
	call := b.receives
	b.receiveTimes = append(b.receiveTimes, time.Now())
	b.receiveMax = append(b.receiveMax, max)
	if max < 1 {
		b.t.Errorf("Receive asked for %d messages", max)
	}
	if b.limit > 0 && b.outstanding+max > b.limit {
		b.t.Errorf("Receive asked for %d messages with %d held: more than the limit of %d", max, b.outstanding, b.limit)
	}
	hook := b.receiveErr
	b.mu.Unlock()
	if hook != nil {
		if err := hook(call); err != nil {
			return nil, err
		}
	}
	for {
		b.mu.Lock()
		if q := b.ready[queue]; len(q) > 0 {
			n := min(max+b.overMax, len(q))
			for _, id := range q[:n] {
				ds = append(ds, &driver.Delivery{Queue: queue, Body: []byte(id), Deliveries: 1, Handle: &fakeLease{id: id}})
				b.byQueueClaims = append(b.byQueueClaims, queue)
			}
			b.ready[queue] = q[n:]
			b.outstanding += n
			b.maxOutstanding = maxInt(b.maxOutstanding, b.outstanding)
			b.mu.Unlock()
			return ds, nil
		}
		changed := b.changed
		b.blocked[queue]++
		b.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
		}
		b.mu.Lock()
		b.blocked[queue]--
		b.mu.Unlock()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// settle ends d's lease; it returns ErrLeaseLost when it was already gone.
func (b *fakeBackend) settle(d *driver.Delivery) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.settleCalls++
	l := b.lease(d)
	if l.settled {
		b.t.Errorf("delivery %s settled twice", l.id)
		return driver.ErrLeaseLost
	}
	if l.lost {
		return driver.ErrLeaseLost
	}
	l.settled = true
	b.outstanding--
	return nil
}

func (b *fakeBackend) Ack(_ context.Context, d *driver.Delivery) error {
	b.mu.Lock()
	hook := b.ackHook
	b.mu.Unlock()
	if hook != nil {
		hook(b.lease(d).id)
	}
	if err := b.settle(d); err != nil {
		return err
	}
	b.mu.Lock()
	b.acked = append(b.acked, b.lease(d).id)
	b.mu.Unlock()
	return nil
}

func (b *fakeBackend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	b.mu.Lock()
	wait := b.extendWait
	b.mu.Unlock()
	if wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.mu.Lock()
	l := b.lease(d)
	b.extendCalls++
	l.extends++
	b.extendLeases = append(b.extendLeases, lease)
	if l.settled {
		b.t.Errorf("Extend on %s after it was settled", l.id)
	}
	hook := b.extendErr
	b.mu.Unlock()
	select {
	case b.extended <- l.id:
	default:
	}
	if hook != nil {
		return hook(d)
	}
	return nil
}

// Requeue puts the message back at the end of its queue, as the runner's
// hand-back does.
func (b *fakeBackend) Requeue(_ context.Context, d *driver.Delivery, _ driver.Message) error {
	if err := b.settle(d); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.lease(d).id
	b.requeued = append(b.requeued, id)
	b.ready[d.Queue] = append(b.ready[d.Queue], id)
	close(b.changed)
	b.changed = make(chan struct{})
	return nil
}

func (b *fakeBackend) DeadLetter(_ context.Context, d *driver.Delivery, _ driver.DeadMessage) error {
	return b.settle(d)
}

func (b *fakeBackend) NextDead(context.Context, string) (*driver.DeadDelivery, error) {
	return nil, driver.ErrNoDeadLetters
}

func (b *fakeBackend) ExtendDead(context.Context, *driver.DeadDelivery) error {
	return driver.ErrLeaseLost
}

func (b *fakeBackend) SettleDead(context.Context, *driver.DeadDelivery, bool) error {
	return driver.ErrLeaseLost
}

func (b *fakeBackend) ListDead(context.Context, string, string, int) ([]driver.DeadMessage, string, error) {
	return nil, "", nil
}

func (b *fakeBackend) DeleteDead(context.Context, string, []string) (int, error) { return 0, nil }

func (b *fakeBackend) PurgeDead(context.Context, string) (int, error) { return 0, nil }

func (b *fakeBackend) Stats(_ context.Context, queue string) (driver.Stats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return driver.Stats{Ready: int64(len(b.ready[queue])), Scheduled: 0, InFlight: int64(b.outstanding), Dead: 0}, nil
}

func (b *fakeBackend) Close() error { return nil }

var _ driver.Backend = (*fakeBackend)(nil)

var errReceive = errors.New("fake receive failure")

// waitFor polls cond until it holds, failing the test after patience.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// recv takes a value from ch, failing the test after patience.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("gave up waiting for %s", what)
	}
	panic("unreachable")
}

// waitExtends waits until each delivery of the ids was extended n times,
// failing the test after patience.
func waitExtends(t *testing.T, b *fakeBackend, n int, ids ...string) {
	t.Helper()
	deadline := time.After(patience)
	seen := map[string]int{}
	for {
		done := true
		for _, id := range ids {
			done = done && seen[id] >= n
		}
		if done {
			return
		}
		select {
		case id := <-b.extended:
			seen[id]++
		case <-deadline:
			t.Fatalf("gave up waiting for %d Extends of each of %v: saw %v", n, ids, seen)
		}
	}
}

// closed waits for ch to close, failing the test after patience.
func closed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	recv(t, what, ch)
}

// leftGoroutines returns the stacks of the goroutines in code of the
// runner's or the health gate's non-test files. Only a test that is not
// parallel may use it: the goroutines of other tests would count.
func leftGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, file := range []string{"/internal/runner/runner.go:", "/internal/runner/pool.go:", "/internal/health/health.go:"} {
			if strings.Contains(g, file) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}
