package rabbit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// fakeChannel models the broker's side of basic.ack and basic.nack on one
// channel: the set of unacked tags, and PRECONDITION_FAILED (which closes
// the channel) for a tag that is not unacked. It also fails when an ack
// settles a tag that nobody asked to settle: one still held by a handler.
type fakeChannel struct {
	mu      sync.Mutex
	unacked map[uint64]bool // tag → settle asked for
	frames  int
	multi   int // multiple acks that settled more than one tag
	err     error
	gate    chan struct{} // when set, the next Ack waits for it to close
	slow    bool          // yield in every Ack, as a write would
}

func newFakeChannel(n int) *fakeChannel {
	f := &fakeChannel{unacked: map[uint64]bool{}}
	for t := uint64(1); t <= uint64(n); t++ {
		f.unacked[t] = false
	}
	return f
}

// asked records that a settle of tag is about to be requested.
func (f *fakeChannel) asked(tag uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.unacked[tag]; ok {
		f.unacked[tag] = true
	}
}

func (f *fakeChannel) failLocked(format string, args ...any) error {
	if f.err == nil {
		f.err = fmt.Errorf(format, args...)
	}
	return f.err
}

func (f *fakeChannel) Ack(tag uint64, multiple bool) error {
	f.mu.Lock()
	gate := f.gate
	f.gate = nil
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if f.slow {
		runtime.Gosched()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frames++
	if f.err != nil {
		return f.err
	}
	if _, ok := f.unacked[tag]; !ok {
		return f.failLocked("PRECONDITION_FAILED: ack of unknown delivery tag %d", tag)
	}
	if !multiple {
		delete(f.unacked, tag)
		return nil
	}
	n := 0
	for t, asked := range f.unacked {
		if t > tag {
			continue
		}
		if !asked {
			return f.failLocked("multiple ack up to %d settled tag %d, still held", tag, t)
		}
		delete(f.unacked, t)
		n++
	}
	if n > 1 {
		f.multi++
	}
	return nil
}

func (f *fakeChannel) Nack(tag uint64, multiple, requeue bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frames++
	if f.err != nil {
		return f.err
	}
	if _, ok := f.unacked[tag]; !ok || multiple {
		return f.failLocked("PRECONDITION_FAILED: nack of unknown delivery tag %d", tag)
	}
	delete(f.unacked, tag)
	return nil
}

// waitQueued waits until the acker has n acks queued behind its leader.
func waitQueued(t *testing.T, a *acker, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.mu.Lock()
		k := len(a.queue)
		a.mu.Unlock()
		if k == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d acks queued, want %d", k, n)
		}
		runtime.Gosched()
	}
}

// waitLeading waits until a caller leads a flush.
func waitLeading(t *testing.T, a *acker) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.mu.Lock()
		leading := a.leading
		a.mu.Unlock()
		if leading {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
		runtime.Gosched()
	}
}

// TestAckerCoalesces checks that acks queued behind a leader go out as one
// multiple ack when every tag below them is settled or queued.
func TestAckerCoalesces(t *testing.T) {
	f := newFakeChannel(6)
	a := newAcker(f)
	gate := make(chan struct{})
	f.gate = gate
	for _, tag := range []uint64{1, 2, 3, 4, 5} {
		f.asked(tag)
	}
	var wg sync.WaitGroup
	ack := func(tag uint64) {
		wg.Go(func() {
			if err := a.ack(tag); err != nil {
				t.Errorf("ack %d: %v", tag, err)
			}
		})
	}
	ack(1) // leads, and waits at the gate
	waitLeading(t, a)
	if err := a.nack(3, true); err != nil {
		t.Fatal(err)
	}
	ack(5)
	ack(2)
	ack(4)
	waitQueued(t, a, 3)
	close(gate)
	wg.Wait()
	if f.err != nil {
		t.Fatal(f.err)
	}
	// ack 1, nack 3, ack 5 multiple (covering 2 and 4).
	if f.frames != 3 || f.multi != 1 {
		t.Errorf("%d frames, %d multiple acks; want 3 and 1", f.frames, f.multi)
	}
	if len(f.unacked) != 1 || !contains(f.unacked, 6) {
		t.Errorf("unacked %v, want only 6", f.unacked)
	}
	if a.floor != 5 || len(a.settled) != 0 {
		t.Errorf("floor %d, settled %v; want 5 and none", a.floor, a.settled)
	}
}

func contains(m map[uint64]bool, tag uint64) bool {
	_, ok := m[tag]
	return ok
}

// TestAckerHeldBlocks checks that a held tag stops a multiple ack: acks
// queued above it go out one by one, and the held tag stays unacked.
func TestAckerHeldBlocks(t *testing.T) {
	f := newFakeChannel(6)
	a := newAcker(f)
	// Blocked acks wait until the test ends their wait: a slow moment of
	// the machine must not end it (at ackWait) before they are counted.
	a.wait = time.Hour
	gate := make(chan struct{})
	f.gate = gate
	var wg sync.WaitGroup
	ack := func(tag uint64) {
		f.asked(tag)
		wg.Go(func() {
			if err := a.ack(tag); err != nil {
				t.Errorf("ack %d: %v", tag, err)
			}
		})
	}
	ack(1)
	waitLeading(t, a)
	// 2 is held by a handler; 3 to 6 are acked out of order.
	ack(6)
	ack(4)
	ack(3)
	ack(5)
	waitQueued(t, a, 4)
	a.mu.Lock()
	for _, r := range a.queue {
		r.until = time.Now()
	}
	a.wait = ackWait
	a.mu.Unlock()
	close(gate)
	wg.Wait()
	if f.err != nil {
		t.Fatal(f.err)
	}
	if len(f.unacked) != 1 || !contains(f.unacked, 2) {
		t.Errorf("unacked %v, want only the held tag 2", f.unacked)
	}
	if f.multi != 0 {
		t.Errorf("%d multiple acks past a held tag", f.multi)
	}
	// Settling 2 now moves the floor over everything.
	f.asked(2)
	if err := a.ack(2); err != nil {
		t.Fatal(err)
	}
	if a.floor != 6 || len(a.settled) != 0 {
		t.Errorf("floor %d, settled %v; want 6 and none", a.floor, a.settled)
	}
	if err := a.ack(2); err != errSettledTag {
		t.Errorf("second ack of 2: %v, want errSettledTag", err)
	}
	if err := a.nack(4, true); err != errSettledTag {
		t.Errorf("nack of acked 4: %v, want errSettledTag", err)
	}
	if f.err != nil {
		t.Fatal(f.err)
	}
}

// TestAckerRandom settles tags from many goroutines in random order, with
// nacks, late settles and tags held for good mixed in, and checks the
// broker's view: no tag acked twice or unknown, no held tag settled, every
// other tag settled.
func TestAckerRandom(t *testing.T) {
	for round := range 20 {
		const n = 3000
		f := newFakeChannel(n)
		f.slow = true
		a := newAcker(f)
		held := map[uint64]bool{}
		tags := make(chan uint64, n)
		var late []uint64
		for tag := uint64(1); tag <= n; tag++ {
			// Every third round settles everything in about the order
			// of delivery.
			switch k := rand.IntN(1000); {
			case round%3 == 2 || k > 10:
				tags <- tag
			case k == 0 && round%3 == 0:
				held[tag] = true
			default:
				late = append(late, tag)
			}
		}
		for _, tag := range late {
			tags <- tag
		}
		close(tags)
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for tag := range tags {
					if rand.IntN(4) == 0 {
						runtime.Gosched()
					}
					f.asked(tag)
					var err error
					if rand.IntN(10) == 0 {
						err = a.nack(tag, true)
					} else {
						err = a.ack(tag)
					}
					if err != nil {
						t.Errorf("settle %d: %v", tag, err)
					}
				}
			})
		}
		wg.Wait()
		if f.err != nil {
			t.Fatalf("round %d: %v", round, f.err)
		}
		if len(f.unacked) != len(held) {
			t.Fatalf("round %d: %d unacked, want the %d held", round, len(f.unacked), len(held))
		}
		for tag := range held {
			if !contains(f.unacked, tag) {
				t.Fatalf("round %d: held tag %d settled", round, tag)
			}
		}
		if round < 3 {
			t.Logf("%d frames for %d settles, %d multiple acks", f.frames, n-len(held), f.multi)
		}
	}
}

// TestAckAroundHeld acks deliveries on the broker out of order and
// concurrently around two that stay held: no ack may settle a held one
// (a multiple ack past it would), so exactly the held ones come back,
// counted, when their backend closes.
func TestAckAroundHeld(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := testCtx(t)
	q := queueName(t, b)
	const n = 12
	var msgs []driver.Message
	for i := range n {
		msgs = append(msgs, driver.Message{ID: fmt.Sprint(i), Body: []byte{byte(i)}})
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	b2 := newBackend(t, Config{Prefetch: n})
	var ds []*driver.Delivery
	for len(ds) < n {
		got, err := b2.Receive(ctx, q, n-len(ds), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, got...)
	}
	held := map[byte]bool{2: true, 7: true}
	// The highest first, alone, so that it finds the tags below it
	// unsettled; then the rest at once, highest first.
	if err := b2.Ack(ctx, ds[n-1]); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := n - 2; i >= 0; i-- {
		if held[ds[i].Body[0]] {
			continue
		}
		wg.Go(func() {
			if err := b2.Ack(ctx, ds[i]); err != nil {
				t.Errorf("ack of message %d: %v", ds[i].Body[0], err)
			}
		})
	}
	wg.Wait()
	b2.Close()

	back := map[byte]bool{}
	for len(back) < len(held) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := b.Receive(rctx, q, n, time.Second)
		cancel()
		if err != nil {
			t.Fatalf("held messages back: %v; want %v: %v", back, held, err)
		}
		for _, d := range got {
			back[d.Body[0]] = true
			if !held[d.Body[0]] || d.Deliveries != 2 {
				t.Errorf("message %d came back with Deliveries %d; only the held ones should, with 2", d.Body[0], d.Deliveries)
			}
			if err := b.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st, err := b.Stats(ctx, q); err != nil || st.Ready != 0 {
		t.Fatalf("Stats after: %+v, %v; want nothing ready", st, err)
	}
}

// TestAckerHold checks that hold waits for a frame being written, that no
// ack or nack frame is written while it holds, and that the ones asked for
// meanwhile go out after unhold.
func TestAckerHold(t *testing.T) {
	f := newFakeChannel(3)
	gate := make(chan struct{})
	f.gate = gate
	a := newAcker(f)
	f.asked(1)
	first := make(chan error, 1)
	go func() { first <- a.ack(1) }() // its frame waits for gate
	for {
		a.mu.Lock()
		w := a.writing
		a.mu.Unlock()
		if w == 1 {
			break
		}
		runtime.Gosched()
	}
	held := make(chan struct{})
	go func() {
		a.hold()
		close(held)
	}()
	select {
	case <-held:
		t.Fatal("hold returned while a frame was being written")
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	<-held
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	before := f.frames
	f.mu.Unlock()
	f.asked(2)
	f.asked(3)
	done := make(chan error, 2)
	go func() { done <- a.ack(2) }()
	go func() { done <- a.nack(3, true) }()
	select {
	case err := <-done:
		t.Fatalf("a settle returned during the hold (err %v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	f.mu.Lock()
	during := f.frames
	f.mu.Unlock()
	if during != before {
		t.Fatalf("%d frames written during the hold", during-before)
	}
	a.unhold()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a settle asked for during the hold was not written after unhold")
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.unacked) != 0 || f.err != nil {
		t.Fatalf("unacked %v, err %v", f.unacked, f.err)
	}
}
