package status

import (
	"context"
	"maps"
	"strings"
	"sync"
	"time"
)

// marks is the set of cancel marks as last listed, which Begin consults
// instead of reading each job's record: the poll lists them every
// Config.Poll while jobs run here, and Begin lists them itself when the
// last listing began more than MarkAge polls ago.
type marks struct {
	mu   sync.Mutex
	set  map[string]bool // record keys with a cancel mark; replaced, never written, once handed out
	at   time.Time       // when the listing that gave set began; zero: none yet
	busy chan struct{}   // closed when the listing under way ends; nil: none
	err  error           // the listing's, for those waiting on busy
}

// MarkAge is, in poll intervals, how old a listing of the cancel marks
// Begin relies on may be: a Cancel that returned MarkAge*Config.Poll
// before Begin is seen by it.
const MarkAge = 2

// add records a cancel mark this process wrote.
func (m *marks) add(k string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.set != nil && !m.set[k] {
		set := maps.Clone(m.set) // a set handed out is never written
		set[k] = true
		m.set = set
	}
}

// drop forgets the cancel mark of key k, deleted.
func (m *marks) drop(k string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.set[k] {
		set := maps.Clone(m.set) // a set handed out is never written
		delete(set, k)
		m.set = set
	}
}

// marked reports whether the job of record key k had a cancel mark at the
// latest listing, listing them first when that one began more than
// MarkAge polls ago.
func (t *Tracker) marked(ctx context.Context, k string) (bool, error) {
	m := &t.marks
	m.mu.Lock()
	fresh := !m.at.IsZero() && time.Since(m.at) <= MarkAge*t.cfg.Poll
	marked := m.set[k]
	m.mu.Unlock()
	if fresh {
		return marked, nil
	}
	set, err := t.listMarks(ctx)
	return set[k], err
}

// listMarks lists the cancel marks, or waits for the listing under way
// (it began since the call's freshness was judged), and returns them.
func (t *Tracker) listMarks(ctx context.Context) (map[string]bool, error) {
	m := &t.marks
	m.mu.Lock()
	if busy := m.busy; busy != nil {
		m.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.set, m.err
	}
	busy := make(chan struct{})
	m.busy = busy
	m.mu.Unlock()

	began := time.Now()
	lctx, cancel := context.WithTimeout(ctx, max(t.cfg.Poll, time.Second))
	defer cancel()
	set := make(map[string]bool)
	err := t.cfg.Store.ListAll(lctx, "cancel/", func(k string) (bool, error) {
		set[strings.TrimPrefix(k, "cancel/")] = true
		return true, nil
	})

	m.mu.Lock()
	defer m.mu.Unlock()
	m.busy, m.err = nil, err
	close(busy)
	if err != nil {
		return nil, err
	}
	m.set, m.at = set, began
	return set, nil
}
