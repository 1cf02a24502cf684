package azure

import "sync"

// maxDeadNames bounds the record names a Backend remembers (about 150 bytes
// each, so about 15 MB at most).
const maxDeadNames = 100_000

// deadNames remembers, by queue prefix and record ID, the blob names that
// listings of the queue's records showed (ListDead's pages, DeleteDead's
// walks), so that DeleteDead of IDs it knows deletes by name instead of
// walking the prefix again: a redrive in chunks lists the queue once, not
// once a chunk. A name is never reused (newKey: creation time, a sequence
// and random digits), so a remembered name holds the remembered ID's record
// or nothing. A name may be stale (the record popped or deleted since): its
// delete then finds nothing and counts nothing.
type deadNames struct {
	mu     sync.Mutex
	queues map[string]map[string][]string // prefix → ID → names
	count  int
}

// learn remembers that the record name under prefix has id. When the
// index is full it first forgets the other queues, then takes no more
// names of this one.
func (d *deadNames) learn(prefix, id, name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.queues == nil {
		d.queues = make(map[string]map[string][]string)
	}
	if d.count >= maxDeadNames {
		for p, ids := range d.queues {
			if p != prefix {
				d.count -= countNames(ids)
				delete(d.queues, p)
			}
		}
		if d.count >= maxDeadNames {
			return
		}
	}
	ids := d.queues[prefix]
	if ids == nil {
		ids = make(map[string][]string)
		d.queues[prefix] = ids
	}
	for _, n := range ids[id] {
		if n == name {
			return
		}
	}
	ids[id] = append(ids[id], name)
	d.count++
}

// deadRef is one remembered record: its ID and its blob name.
type deadRef struct{ id, name string }

// lookup returns the remembered records of every ID in ids, and whether
// every ID had at least one.
func (d *deadNames) lookup(prefix string, ids []string) ([]deadRef, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	known := d.queues[prefix]
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
	ids := d.queues[prefix]
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

// reset forgets every name of prefix: before a walk of the whole prefix
// learns them again, and after a purge.
func (d *deadNames) reset(prefix string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.count -= countNames(d.queues[prefix])
	delete(d.queues, prefix)
}

func countNames(ids map[string][]string) int {
	n := 0
	for _, ns := range ids {
		n += len(ns)
	}
	return n
}
