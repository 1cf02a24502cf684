package status

import (
	"context"
	"errors"
	"sync"

	"github.com/asyncplatform/asyncplatform/driver"
)

// MaxPendingEnds bounds the ends a Tracker holds unwritten: a Settled that
// finds this many waits for the writer to take some.
const MaxPendingEnds = 4 * driver.MaxBatch

// endWriters bounds the single record writes made at once, over every
// batch being written (the ends a batch call could not write).
const endWriters = 16

// batchWriters bounds the batches written at once. One writer runs while
// ends come; another starts while a full batch for each writer running
// waits behind the batches being written, so that one batch's round trips
// (or, on an in-process store, its records' decoding) overlap the next
// one's. No two batches written at once hold the same key.
const batchWriters = 4

// end is a delivery's end (Settled) waiting to be written, or being written.
type end struct {
	key      string
	r        Record // the state to write; the writer merges its record into it
	base     Record // r as Settled gave it (see writeEnd)
	rev      string // the record's revision when this delivery wrote it (its running state); empty: read it
	deferred bool   // a limit's refusal: not written over running, nor over scheduled with the same counters
	taken    bool   // in the batch being written
	skip     bool   // decided against its record: nothing to write
	// prev is the end of the same key before this one when that one is of
	// another enqueue (another nonce): the two are not merged, as only
	// the record tells which is its enqueue's (see addEnd).
	prev *end
}

// ends is the Tracker's writer of the deliveries' ends: Settled hands it the
// state to write and returns; writer goroutines (batchWriters at most)
// write them a batch at a time (the records read in one round trip where
// the store batches, then written, endWriters at once), and exit when none
// is left. A job's later end replaces its earlier one still waiting, so a
// job costs one write per batch at most.
type ends struct {
	mu       sync.Mutex
	room     *sync.Cond      // signalled when a writer takes a batch
	waiting  []*end          // not taken yet, in order; one per key
	byKey    map[string]*end // the latest end of each key, waiting or taken
	inflight map[string]bool // the keys of the batches being written
	writers  int             // writer goroutines running
	single   chan struct{}   // a place for each single write made at once (endWriters)
	idle     chan struct{}   // closed when the last writer exits; nil when none runs
}

// pendingEnds returns the ends of key k not written yet, the latest
// first: more than one when ends of other enqueues wait (see addEnd).
func (t *Tracker) pendingEnds(k string) []Record {
	e := &t.ends
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Record
	for p := e.byKey[k]; p != nil; p = p.prev {
		out = append(out, p.r)
	}
	return out
}

// pendingEnd returns the latest of ends (see pendingEnds) that may be
// written over the record r (found: r was read), if any.
func pendingEnd(ends []Record, r *Record, found bool) (Record, bool) {
	for i := range ends {
		if !found || refuse(r, &ends[i]) == nil {
			return ends[i], true
		}
	}
	return Record{}, false
}

// addEnd hands p to the writer, waiting while MaxPendingEnds are waiting.
func (t *Tracker) addEnd(p *end) {
	e := &t.ends
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byKey == nil {
		e.byKey = make(map[string]*end)
		e.inflight = make(map[string]bool)
		e.single = make(chan struct{}, endWriters)
		e.room = sync.NewCond(&e.mu)
	}
	if old, ok := e.byKey[p.key]; ok {
		switch {
		case old.r.Nonce != p.r.Nonce:
			// Another enqueue's (a copy from before a redrive, or a
			// forgery): both are written, and the record refuses the end
			// that is not its enqueue's.
			p.prev = old
		case old.taken:
		case newer(&old.r, &p.r): // a later attempt's end waits already: it takes this one's changes, before its own
			old.r.follow(&p.r)
			if old.r.Error == "" {
				old.r.Error = p.r.Error // the last error, as a write over it would keep
			}
			return
		default:
			prev := old.prev
			p.r.follow(&old.r) // both ends' changes, old's first
			if p.r.Error == "" {
				p.r.Error = old.r.Error // the last error, as a write over it would keep
			}
			*old = *p // the same place in the order: one write for both
			old.prev = prev
			return
		}
	}
	for len(e.waiting) >= MaxPendingEnds {
		e.room.Wait()
	}
	e.waiting = append(e.waiting, p)
	e.byKey[p.key] = p
	if e.writers == 0 || e.writers < batchWriters && len(e.waiting) >= driver.MaxBatch*e.writers {
		if e.idle == nil {
			e.idle = make(chan struct{})
		}
		e.writers++
		go t.writeEnds()
	}
}

// Flush returns when every end handed to the writer before the call is
// written (or given up), or when ctx ends, with its error.
func (t *Tracker) Flush(ctx context.Context) error {
	e := &t.ends
	for {
		e.mu.Lock()
		idle := e.idle
		e.mu.Unlock()
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

// writeEnds is one writer: it writes the waiting ends a batch at a time
// until none is left that no other writer's batch holds the key of, then
// exits; the last writer to exit closes idle.
func (t *Tracker) writeEnds() {
	e := &t.ends
	for {
		e.mu.Lock()
		// A batch holds one end a key, and no key of a batch another
		// writer is writing: one of another enqueue, or one that came
		// while its key's batch was being written, waits for a later
		// batch (see addEnd).
		var taken, left []*end
		for _, p := range e.waiting {
			if len(taken) == driver.MaxBatch || e.inflight[p.key] {
				left = append(left, p)
				continue
			}
			e.inflight[p.key] = true
			taken = append(taken, p)
		}
		e.waiting = left
		if len(taken) == 0 {
			// Nothing left, or only keys another writer's batch holds:
			// that writer takes them once its batch is written.
			e.writers--
			if e.writers == 0 {
				close(e.idle)
				e.idle = nil
			}
			e.mu.Unlock()
			return
		}
		n := len(taken)
		batch := make([]end, n) // the writer's copies: Get reads the originals
		for i, p := range taken {
			p.taken = true
			batch[i] = *p
			batch[i].base = p.r
		}
		e.room.Broadcast()
		e.mu.Unlock()

		t.writeBatch(batch)

		e.mu.Lock()
		for _, p := range taken {
			delete(e.inflight, p.key)
			if e.byKey[p.key] == p {
				delete(e.byKey, p.key)
			}
		}
		e.mu.Unlock()
	}
}

// writeBatch writes the ends of batch (distinct keys): the records of those
// without a revision read in one call, each end decided against its record,
// then written in one CreateEach and one UpdateEach (see writeEach), and
// those the batch calls could not write one by one, endWriters at once.
// Config.Timeout bounds each call, not the batch.
func (t *Tracker) writeBatch(batch []end) {
	var keys []string
	var read []*end
	for i := range batch {
		if p := &batch[i]; p.rev == "" {
			keys = append(keys, "job/"+p.key)
			read = append(read, p)
		}
	}
	if len(keys) > 0 {
		ctx, cancel := t.bound(context.Background())
		rs, err := t.cfg.Store.GetEach(ctx, keys)
		cancel()
		if err != nil {
			t.cfg.Logger.Warn("asyncplatform: reading jobs' statuses failed; their ends are written one by one", "jobs", len(keys), "error", err)
		}
		for i, p := range read {
			if err == nil {
				p.rev = t.decideEnd(p, rs[i])
			}
		}
	}
	retry := t.writeEach(batch)
	var wg sync.WaitGroup
	sem := t.ends.single
	for _, p := range retry {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := t.bound(context.Background())
			defer cancel()
			t.writeEnd(ctx, p)
		})
	}
	wg.Wait()
}

// writeEach writes the ends of batch not skipped in two calls at most: one
// CreateEach of those without a revision, one UpdateEach of the others at
// theirs. It returns the ends left to write one by one (writeEnd, which
// reads the record again and decides): those whose key was written or
// created since it was read, and all of a call that failed.
func (t *Tracker) writeEach(batch []end) (retry []*end) {
	var creates, updates []driver.BatchItem
	var created, updated []*end
	for i := range batch {
		p := &batch[i]
		if p.skip {
			continue
		}
		b := encode(&p.r)
		it := driver.BatchItem{Key: "job/" + p.key, Value: b, TTL: t.cfg.Retention, Rev: p.rev}
		if p.rev == "" {
			creates, created = append(creates, it), append(created, p)
		} else {
			updates, updated = append(updates, it), append(updated, p)
		}
	}
	for _, c := range []struct {
		op    string
		items []driver.BatchItem
		ends  []*end
		call  func(context.Context, []driver.BatchItem) ([]driver.BatchResult, error)
	}{
		{"creating", creates, created, t.cfg.Store.CreateEach},
		{"updating", updates, updated, t.cfg.Store.UpdateEach},
	} {
		if len(c.items) == 0 {
			continue
		}
		ctx, cancel := t.bound(context.Background())
		rs, err := c.call(ctx, c.items)
		cancel()
		if err != nil {
			t.cfg.Logger.Warn("asyncplatform: "+c.op+" jobs' statuses failed; their ends are written one by one", "jobs", len(c.items), "error", err)
			retry = append(retry, c.ends...)
			continue
		}
		for i, r := range rs {
			p := c.ends[i]
			if r.Err != nil {
				retry = append(retry, p)
				continue
			}
			t.ended(p)
		}
	}
	return retry
}

// ended does what follows the write of p's end: the cancel mark of a job
// it ends is deleted.
func (t *Tracker) ended(p *end) {
	if !p.r.CancelRequested || !p.r.State.Terminal() {
		return
	}
	ctx, cancel := t.bound(context.Background())
	defer cancel()
	_ = t.cfg.Store.Delete(ctx, "cancel/"+p.key, "")
	t.marks.drop(p.key)
}

// decideEnd decides p against its record as read (res): it sets p.skip
// when p is not to be written (a later attempt's record, another enqueue's,
// a refusal that changes nothing), and merges into p.r what the record
// keeps. It returns the revision to write at: empty, create.
func (t *Tracker) decideEnd(p *end, res driver.BatchResult) string {
	if errors.Is(res.Err, driver.ErrKeyNotFound) {
		p.skip = p.deferred && t.runningHere(p.key)
		return ""
	}
	cur, err := decode(res.Value)
	if err != nil {
		return "" // written one by one: the write reads it again, and says why
	}
	view := cur
	t.local(p.key, &view, true)
	if refuse(&cur, &p.r) != nil || p.deferred && (view.State == Running || view.State == Scheduled && sameCounts(&p.r, &view)) {
		p.skip = true
		return ""
	}
	merge(&cur, &p.r)
	return res.Rev
}

// runningHere reports whether a delivery of the job of key k runs here with
// its running state not written.
func (t *Tracker) runningHere(k string) bool {
	v, ok := t.running.Load(k)
	if !ok {
		return false
	}
	_, ok = v.(*Track).view()
	return ok
}

// writeEnd writes p alone: its record read again and p decided against it
// (see decideEnd), then written (see write); the cancel mark of a job it
// ends is deleted.
func (t *Tracker) writeEnd(ctx context.Context, p *end) {
	v, rev, err := t.cfg.Store.Get(ctx, "job/"+p.key)
	if err != nil && !errors.Is(err, driver.ErrKeyNotFound) {
		t.cfg.Logger.Warn("asyncplatform: reading a job's status failed", "queue", p.r.Queue, "id", p.r.ID, "state", p.r.State, "error", err)
		return
	}
	p.r, p.skip = p.base, false
	if p.rev = t.decideEnd(p, driver.BatchResult{Value: v, Rev: rev, Err: err}); p.skip {
		return
	}
	r := p.r
	_, err = t.write(ctx, &r, p.rev)
	if errors.Is(err, errStale) { // a later copy ran (and may have ended) first, or another enqueue's record
		return
	}
	if err != nil {
		t.cfg.Logger.Warn("asyncplatform: writing a job's status failed", "queue", r.Queue, "id", r.ID, "state", r.State, "error", err)
		return
	}
	p.r = r
	t.ended(p)
}
