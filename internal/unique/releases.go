package unique

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// MaxPendingReleases bounds the releases a Claims holds unwritten: a
// ReleaseLater that finds this many waits for the writer to take some.
const MaxPendingReleases = 4 * driver.MaxBatch

// releaseWorkers bounds the single releases made at once when a batch
// falls back to them.
const releaseWorkers = 16

// pendingRelease is a job's claim waiting to be released by the writer.
type pendingRelease struct {
	queue, id string
	cl        Claim
}

// releases is the writer of ReleaseLater: one goroutine releases the
// waiting claims a batch at a time, one compare-and-delete of many keys
// (driver.DeleteValueEach: one round trip on a store that batches), and
// exits when none is left.
type releases struct {
	mu      sync.Mutex
	room    *sync.Cond // signalled when the writer takes a batch
	waiting []pendingRelease
	idle    chan struct{} // closed when the writer exits; nil when none runs
}

// ReleaseLater is Release, written by a writer that batches: it hands the
// claim carried in header to the writer and returns (waiting only while
// MaxPendingReleases are waiting). The writer deletes each key as Release
// would, with the same rules (the header's token, at its revision, by
// the job that took it), a batch of up to driver.MaxBatch keys in one
// call; when the batch call fails, or for a claim a batch cannot release
// (made before tokens, or refused: the key is then read to say why), it
// releases that claim alone, as Release does. Flush waits for the
// releases handed over.
func (c *Claims) ReleaseLater(queue, id, header string, dead bool) {
	if header == "" { // no unique key: the common case, without a parse
		return
	}
	cl, ok := Parse(header)
	if !ok || !cl.ReleasedBy(dead) {
		return
	}
	if _, err := c.store(); err != nil {
		c.releaseOne(context.Background(), queue, id, cl) // logs why
		return
	}
	r := &c.rel
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.room == nil {
		r.room = sync.NewCond(&r.mu)
	}
	for len(r.waiting) >= MaxPendingReleases {
		r.room.Wait()
	}
	r.waiting = append(r.waiting, pendingRelease{queue: queue, id: id, cl: cl})
	if r.idle == nil {
		r.idle = make(chan struct{})
		go c.writeReleases(r.idle)
	}
}

// Flush returns when every release handed to ReleaseLater before the call
// is written (or given up), or when ctx ends, with its error.
func (c *Claims) Flush(ctx context.Context) error {
	r := &c.rel
	for {
		r.mu.Lock()
		idle := r.idle
		r.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// writeReleases releases the waiting claims a batch at a time until none
// is left, then closes idle. A batch holds one claim a key: another of the
// same key waits for the next.
func (c *Claims) writeReleases(idle chan struct{}) {
	r := &c.rel
	for {
		r.mu.Lock()
		if len(r.waiting) == 0 {
			r.idle = nil
			close(idle)
			r.mu.Unlock()
			return
		}
		var taken, left []pendingRelease
		keys := make(map[string]bool, min(len(r.waiting), driver.MaxBatch))
		for _, p := range r.waiting {
			if len(taken) == driver.MaxBatch || keys[p.cl.Key] {
				left = append(left, p)
				continue
			}
			keys[p.cl.Key] = true
			taken = append(taken, p)
		}
		r.waiting = left
		r.room.Broadcast()
		r.mu.Unlock()

		c.releaseBatch(taken)
	}
}

// releaseBatch releases the claims of batch (distinct keys): those with a
// token, released by a job ID, in one DeleteValueEach of the values they
// wrote; the others, those the batch refused at a revision of their own
// (to say why), and all of them when the batch call fails, one by one
// with Release. The batch call has ReleaseTimeout from the batch's start.
// When it ends with that timeout the store is stalled, and the releases one
// by one end by twice that, together; otherwise each has ReleaseTimeout of
// its own, and the first that ends with its timeout gives up those not yet
// started. So a stalled store holds a batch for about two ReleaseTimeouts,
// and a store that answers each release in time gets every one of them,
// however many there are (a release given up is logged, and its key held
// until its window ends).
func (c *Claims) releaseBatch(batch []pendingRelease) {
	st, err := c.store()
	if err != nil {
		return // ReleaseLater checked: never
	}
	start := time.Now()
	bctx, bcancel := context.WithCancel(context.Background())
	defer bcancel()
	var (
		items []driver.BatchItem
		at    []int // the claim of each item
		alone []int // the claims released one by one
	)
	for i, p := range batch {
		if p.cl.Token == "" || p.id == "" {
			alone = append(alone, i)
			continue
		}
		rev := p.cl.Rev
		if rev == AnyRev {
			rev = ""
		}
		items = append(items, driver.BatchItem{Key: p.cl.Key, Value: value(p.id, p.cl.Token), Rev: rev})
		at = append(at, i)
	}
	if len(items) > 0 {
		ctx, cancel := context.WithDeadline(bctx, start.Add(c.cfg.ReleaseTimeout))
		rs, err := st.DeleteValueEach(ctx, items)
		stalled := ctx.Err() != nil
		cancel()
		if stalled {
			var scancel context.CancelFunc
			bctx, scancel = context.WithDeadline(bctx, start.Add(2*c.cfg.ReleaseTimeout))
			defer scancel()
		}
		if err != nil {
			c.log.Warn("asyncplatform: releasing unique keys together failed; they are released one by one", "keys", len(items), "error", err)
			alone = append(alone, at...)
		} else {
			for k, res := range rs {
				// A claim at a revision of its own that the batch refused
				// is read again to say why (another holder, a forgery).
				if errors.Is(res.Err, driver.ErrRevision) && batch[at[k]].cl.Rev != AnyRev {
					alone = append(alone, at[k])
				}
			}
		}
	}
	if len(alone) == 0 {
		return
	}
	sem := make(chan struct{}, releaseWorkers)
	var wg sync.WaitGroup
	for _, i := range alone {
		sem <- struct{}{}
		p := batch[i]
		if bctx.Err() != nil {
			<-sem
			c.log.Warn("asyncplatform: the store did not answer a unique key's release in time; the batch's other releases are given up and their keys held until their windows end", "queue", p.queue, "id", p.id, "key", p.cl.Key)
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if c.releaseOne(bctx, p.queue, p.id, p.cl) {
				bcancel()
			}
		})
	}
	wg.Wait()
}
