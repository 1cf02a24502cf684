package runner

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/health"
)

// PoolConfig makes a Queue a pool: one fetcher and one set of workers for
// several queues, taken in priority order (strict) or by weight.
type PoolConfig[J any] struct {
	// Names are the queues, highest priority first.
	Names []string
	// Weights, one per name, make the choice weighted; nil: strict order.
	Weights []int
	// Pauses are the queues' own gates, one per name (nil: never paused).
	Pauses []*health.Gate
	// Probe is the least wait of a Receive that asks whether a queue that
	// just had work still has some; the wait is four times as long as the
	// queue's last answer with jobs when that is longer.
	Probe time.Duration
	// HandBack returns, uncounted, a delivery the fetcher claimed but could
	// not pass on because the pool stopped.
	HandBack func(*Delivery[J]) error
}

// firstProbe bounds a pool's first Receive on each queue, which may have
// to set up a consumer (RabbitMQ) before it can answer.
const firstProbe = 500 * time.Millisecond

// maxProbe bounds a probe's wait however slow the queue's last answer was.
const maxProbe = time.Second

// claimed is what one standing Receive of a pool claimed, held already
// (so its lease is kept) and handed to the fetcher.
type claimed[J any] struct {
	i  int
	fs []*Delivery[J]
}

// ended says a standing Receive is over: gen tells it from a newer one on
// the same queue.
type ended struct{ i, gen int }

// Names are the queues this runner works: its Name, or its pool's queues.
func (q *Queue[J]) Names() []string {
	if q.cfg.Pool != nil {
		return q.cfg.Pool.Names
	}
	return []string{q.cfg.Name}
}

// fetchPool is Fetch for a pool. A queue that just had work is asked with
// a Receive bounded by Probe; a queue found empty gets a standing Receive
// of one job, a sentinel, that waits on the broker's own signal and is
// kept across claims. While a queue's sentinel waits, the queue is known
// empty and is skipped at no cost; when it returns a job, the queue is
// asked again. So in strict order a lower queue is asked only while every
// higher one has a sentinel waiting, and in weighted order the queues with
// work are asked in a weighted random order on each claim.
func (q *Queue[J]) fetchPool(ctx context.Context) {
	pc := q.cfg.Pool
	k := len(pc.Names)
	standing := make([]context.CancelFunc, k) // non-nil: a sentinel waits on queue i
	gens := make([]int, k)                    // the generation of queue i's newest sentinel
	// A sentinel holds what it claims (the lease keeper extends it) until
	// the fetcher takes it on claims, or hands it back itself when its
	// context ends first (the gate closed, a pause, Stop): claims is
	// unbuffered so nothing claimed waits unowned in a channel.
	claims := make(chan claimed[J])
	over := make(chan ended, k)
	waiting := 0
	defer func() {
		for i, cancel := range standing {
			if cancel != nil {
				cancel()
				standing[i] = nil
			}
		}
		for ; waiting > 0; waiting-- {
			<-over
		}
		close(q.jobs)
	}()
	order := make([]int, k)
	lat := make([]time.Duration, k) // how long queue i took to answer with jobs, last time
	retry := 50 * time.Millisecond
	for {
		rctx := q.cfg.Gate.Wait(ctx)
		if rctx == nil {
			return
		}
		for i, cancel := range standing { // a paused queue's sentinel claims nothing
			if cancel != nil && !pc.open(i) {
				cancel()
				standing[i] = nil
			}
		}
		askable := false // an open queue without a sentinel: one that may have work
		for i := range k {
			askable = askable || (standing[i] == nil && pc.open(i))
		}
		slots := q.slots
		if !askable {
			slots = nil // wait for a sentinel, a pause change or the gate
		}
		var c claimed[J]
		gotClaim := false
		select { // a sentinel's job first: its queue comes before any it would be weighed against
		case c = <-claims:
			gotClaim = true
		default:
			select {
			case <-slots:
			case c = <-claims:
				gotClaim = true
			case e := <-over:
				q.sentinelOver(e, standing, gens, &waiting)
				continue
			case <-rctx.Done():
				continue
			case <-q.wake:
				continue
			}
		}
		if gotClaim {
			if !q.passHeld(ctx, c.fs) {
				return
			}
			continue
		}
		n := 1
	more:
		for n < q.max {
			select {
			case <-q.slots:
				n++
			default:
				break more
			}
		}
		q.receiving.Add(1)
		got, failed := 0, false
		if rctx.Err() == nil && q.cfg.Gate.OK() {
			for _, i := range pc.order(order) {
				if standing[i] != nil {
					continue
				}
				q.poolRecv[i].Add(1) // before the gate is read: see Receiving
				if !pc.open(i) {
					q.poolRecv[i].Add(-1)
					continue
				}
				wait := firstProbe // a first Receive may set up a consumer
				if lat[i] > 0 {
					wait = min(max(pc.Probe, 4*lat[i]), maxProbe)
				}
				var ds []*driver.Delivery
				var err error
				var began time.Time
				for try := 0; ; try++ {
					began = time.Now()
					pctx, cancel := context.WithTimeout(rctx, wait)
					ds, err = q.cfg.Backend.Receive(pctx, pc.Names[i], n, q.cfg.Lease)
					cancel()
					// No answer in time is not proof of an empty queue on a
					// slow broker: ask its depth before going lower.
					if len(ds) > 0 || !errors.Is(err, context.DeadlineExceeded) || rctx.Err() != nil || try == 3 || !q.ready(rctx, pc.Names[i]) {
						break
					}
					wait *= 2
				}
				got = len(ds)
				if got > 0 || lat[i] == 0 {
					lat[i] = max(time.Since(began), time.Millisecond)
				}
				passed := q.passOn(ctx, ds, n)
				q.poolRecv[i].Add(-1)
				if !passed {
					q.receiving.Add(-1)
					return
				}
				if err != nil && !errors.Is(err, context.DeadlineExceeded) && rctx.Err() == nil {
					if errors.Is(err, driver.ErrClosed) {
						q.receiving.Add(-1)
						q.cfg.Log.Error("asyncplatform: backend closed; this pool stops taking jobs", "queue", pc.Names[i], "error", err)
						return
					}
					q.cfg.Log.Warn("asyncplatform: receive failed; retrying", "queue", pc.Names[i], "error", err, "in", retry)
					failed = true
				}
				if got > 0 || failed {
					break
				}
			}
		}
		for range n - got {
			q.slots <- struct{}{}
		}
		q.receiving.Add(-1)
		switch {
		case failed:
			select {
			case <-time.After(retry):
			case <-ctx.Done():
				return
			}
			retry = min(retry*2, maxReceiveRetry)
			continue
		case got > 0:
			retry = 50 * time.Millisecond
			continue
		case rctx.Err() != nil:
			continue
		}
		// Every open queue is empty: a sentinel waits on each.
		for i := range k {
			if standing[i] != nil {
				continue
			}
			q.poolRecv[i].Add(1) // before the gate is read: see Receiving
			if !pc.open(i) {
				q.poolRecv[i].Add(-1)
				continue
			}
			sctx, cancel := context.WithCancel(rctx)
			standing[i] = cancel
			gens[i]++
			waiting++
			go func(gen int) {
				defer func() { over <- ended{i: i, gen: gen} }()
				defer q.poolRecv[i].Add(-1)
				ds, _ := q.cfg.Backend.Receive(sctx, pc.Names[i], 1, q.cfg.Lease)
				if len(ds) == 0 {
					return
				}
				fs := q.hold(ds)
				select {
				case claims <- claimed[J]{i: i, fs: fs}:
				case <-sctx.Done():
					for _, f := range fs {
						q.handBackHeld(f)
					}
				}
			}(gens[i])
		}
	}
}

// sentinelOver notes that a standing Receive ended: its queue may be asked
// again (unless a newer sentinel already waits on it).
func (q *Queue[J]) sentinelOver(e ended, standing []context.CancelFunc, gens []int, waiting *int) {
	*waiting--
	if e.gen == gens[e.i] && standing[e.i] != nil {
		standing[e.i]()
		standing[e.i] = nil
	}
}

// hold records deliveries as held, so the lease keeper extends them.
func (q *Queue[J]) hold(ds []*driver.Delivery) []*Delivery[J] {
	now := time.Now()
	fs := make([]*Delivery[J], len(ds))
	q.mu.Lock()
	for i, d := range ds {
		fs[i] = &Delivery[J]{D: d, renewed: monoOf(now)}
		q.held[fs[i]] = struct{}{}
	}
	q.mu.Unlock()
	return fs
}

// passHeld hands held deliveries to the workers, each on a claim slot it
// waits for. It returns false, having handed back what it could not pass
// on, when ctx ends.
func (q *Queue[J]) passHeld(ctx context.Context, fs []*Delivery[J]) bool {
	for i, f := range fs {
		select {
		case <-q.slots:
		case <-ctx.Done():
			for _, f := range fs[i:] {
				q.handBackHeld(f)
			}
			return false
		}
		q.jobs <- f
	}
	return true
}

// passOn hands deliveries to the workers: the first `tokens` on claim
// slots the fetcher already holds, the rest each on a slot it waits for
// (a sentinel's job, claimed with no slot held). It returns false, having
// handed back what it could not pass on, when ctx ends.
func (q *Queue[J]) passOn(ctx context.Context, ds []*driver.Delivery, tokens int) bool {
	now := time.Now()
	for i, d := range ds {
		f := &Delivery[J]{D: d, renewed: monoOf(now)}
		q.mu.Lock()
		q.held[f] = struct{}{}
		q.mu.Unlock()
		if i >= tokens {
			select {
			case <-q.slots:
			case <-ctx.Done():
				q.handBackHeld(f)
				for _, d := range ds[i+1:] {
					q.handBackNew(d)
				}
				return false
			}
		}
		q.jobs <- f
	}
	return true
}

// handBackNew hands back a delivery the fetcher claimed and never passed on.
func (q *Queue[J]) handBackNew(d *driver.Delivery) {
	f := &Delivery[J]{D: d, renewed: monoOf(time.Now())}
	q.mu.Lock()
	q.held[f] = struct{}{}
	q.mu.Unlock()
	q.handBackHeld(f)
}

func (q *Queue[J]) handBackHeld(f *Delivery[J]) {
	if q.cfg.Pool != nil && q.cfg.Pool.HandBack != nil {
		_ = q.cfg.Pool.HandBack(f)
	}
	q.mu.Lock()
	delete(q.held, f)
	q.mu.Unlock()
}

// ready reports whether the backend says the queue has jobs ready (false
// when it cannot tell).
func (q *Queue[J]) ready(ctx context.Context, name string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	s, err := q.cfg.Backend.Stats(ctx, name)
	return err == nil && s.Ready > 0
}

// Wake makes a pool's fetcher look at its queues' pause gates again.
func (q *Queue[J]) Wake() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (pc *PoolConfig[J]) open(i int) bool { return pc.Pauses[i] == nil || pc.Pauses[i].OK() }

// order fills o with the order to ask the queues in: strict, or a weighted
// random permutation.
func (pc *PoolConfig[J]) order(o []int) []int {
	for i := range o {
		o[i] = i
	}
	if pc.Weights == nil {
		return o
	}
	total := 0
	for _, w := range pc.Weights {
		total += w
	}
	for n := 0; n < len(o)-1; n++ { // pick o[n] among o[n:] by weight
		r := rand.IntN(total)
		j := n
		for ; j < len(o)-1; j++ {
			r -= pc.Weights[o[j]]
			if r < 0 {
				break
			}
		}
		total -= pc.Weights[o[j]]
		o[n], o[j] = o[j], o[n]
	}
	return o
}
