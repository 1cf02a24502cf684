package azure

import "sync"

const (
	// maxDeadNames bounds the record names a Backend remembers (about 150
	// bytes each, so about 15 MB at most).
	maxDeadNames = 100_000
	// maxDeadNameID bounds the length of an ID the index takes: a record's
	// ID is untrusted, and a delete of a longer one walks the queue.
	maxDeadNameID = 256
)

// deadNames remembers, by queue prefix and record ID, the blob names that
// listings of the queue's records showed (ListDead's pages, DeleteDead's
// walks), so that DeleteDead of IDs it knows deletes by name instead of
// walking the prefix again: a redrive in chunks lists the queue once, not
// once a chunk. A name is never reused (newKey: creation time, a sequence
// and random digits), so a remembered name holds the remembered ID's record
// or nothing. A name may be stale (the record popped or deleted since): its
// delete then finds nothing and counts nothing.
//
// A queue's names are used only once they are complete: learned from a
// listing of the whole prefix (a chain of ListDead pages from the empty
// cursor to the end, or a DeleteDead walk) with none dropped. Names from
// a partial listing would make a delete miss a record of a listed ID that
// the listing did not show (a duplicate record), which a later redrive
// would enqueue again.
type deadNames struct {
	mu     sync.Mutex
	queues map[string]*deadQueue // by prefix
	count  int
}

// deadQueue is one queue's remembered names.
type deadQueue struct {
	ids      map[string][]string // ID → names
	complete bool                // ids holds every record a whole listing showed
	chaining bool                // a ListDead chain from the empty cursor is under way
	chain    string              // the cursor that chain's next page starts from
	dropped  bool                // a name was not taken since the chain began
	walkLost bool                // a name was not taken since the entry was made
}

// queue returns prefix's entry, made if absent. d.mu is held.
func (d *deadNames) queue(prefix string) *deadQueue {
	if d.queues == nil {
		d.queues = make(map[string]*deadQueue)
	}
	q := d.queues[prefix]
	if q == nil {
		q = &deadQueue{ids: make(map[string][]string)}
		d.queues[prefix] = q
	}
	return q
}

// learn remembers that the record name under prefix has id. When the
// index is full it first forgets the other queues, then takes no more
// names of this one.
func (d *deadNames) learn(prefix, id, name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.learnLocked(prefix, id, name)
}

// learnLocked is learn with d.mu held.
func (d *deadNames) learnLocked(prefix, id, name string) {
	if d.count >= maxDeadNames {
		for p, q := range d.queues {
			if p != prefix {
				d.count -= countNames(q.ids)
				delete(d.queues, p)
			}
		}
	}
	q := d.queue(prefix)
	if d.count >= maxDeadNames || len(id) > maxDeadNameID {
		q.dropped, q.walkLost, q.complete = true, true, false
		return
	}
	ids := q.ids
	for _, n := range ids[id] {
		if n == name {
			return
		}
	}
	ids[id] = append(ids[id], name)
	d.count++
}

// page learns the records of a ListDead page read from cursor, whose next
// page starts from next (empty at the end): a chain of pages from the empty
// cursor to the end with nothing dropped makes the queue's names complete.
func (d *deadNames) page(prefix, cursor, next string, refs []deadRef) {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.queue(prefix)
	switch {
	case cursor == "":
		q.chaining, q.dropped = true, false
	case !q.chaining || cursor != q.chain:
		q.chaining = false // a page of another chain, or one begun before a reset
	}
	for _, r := range refs {
		d.learnLocked(prefix, r.id, r.name)
	}
	q = d.queue(prefix)
	if !q.chaining {
		return
	}
	q.chain = next
	if next == "" {
		q.chaining = false
		if !q.dropped {
			q.complete = true
		}
	}
}

// walk forgets every name of prefix before a DeleteDead walk of the whole
// prefix learns them again, and returns the entry that walk fills.
func (d *deadNames) walk(prefix string) *deadQueue {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resetLocked(prefix)
	return d.queue(prefix)
}

// walked marks q, the entry of a walk of the whole prefix, complete when
// it took every name. An entry a reset or an eviction replaced since is no
// longer prefix's, and marking it changes nothing.
func (d *deadNames) walked(q *deadQueue) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !q.walkLost {
		q.complete = true
	}
}

// deadRef is one remembered record: its ID and its blob name.
type deadRef struct{ id, name string }

// lookup returns the remembered records of every ID in ids, and whether
// the queue's names are complete and every ID had at least one.
func (d *deadNames) lookup(prefix string, ids []string) ([]deadRef, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.queues[prefix]
	if q == nil || !q.complete {
		return nil, false
	}
	known := q.ids
	var out []deadRef
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		ns, ok := known[id]
		if !ok {
			return nil, false
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		for _, n := range ns {
			out = append(out, deadRef{id: id, name: n})
		}
	}
	return out, true
}

// forget drops remembered records of prefix that are gone.
func (d *deadNames) forget(prefix string, gone []deadRef) {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.queues[prefix]
	if q == nil {
		return
	}
	ids := q.ids
	for _, g := range gone {
		ns := ids[g.id]
		for i, n := range ns {
			if n == g.name {
				ns = append(ns[:i], ns[i+1:]...)
				d.count--
				break
			}
		}
		if len(ns) == 0 {
			delete(ids, g.id)
		} else {
			ids[g.id] = ns
		}
	}
}

// reset forgets every name of prefix (after a purge).
func (d *deadNames) reset(prefix string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resetLocked(prefix)
}

// resetLocked is reset with d.mu held.
func (d *deadNames) resetLocked(prefix string) {
	if q := d.queues[prefix]; q != nil {
		d.count -= countNames(q.ids)
		delete(d.queues, prefix)
	}
}

func countNames(ids map[string][]string) int {
	n := 0
	for _, ns := range ids {
		n += len(ns)
	}
	return n
}
