package memory

import (
	"time"
)

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

// first returns the message first in line, or nil when f is empty.
func (f *fifo) first() *message {
	if f.len() == 0 {
		return nil
	}
	return f.items[f.head]
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

func (h *schedHeap) Push(x any) { *h = append(*h, x.(*message)) }

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
