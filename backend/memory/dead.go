package memory

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// NextDead implements driver.Backend.
func (b *Backend) NextDead(ctx context.Context, name string) (*driver.DeadDelivery, error) {
	if err := b.lock(); err != nil {
		return nil, err
	}
	defer b.broker.mu.Unlock()
	now := time.Now()
	for _, r := range b.broker.queue(name).dead {
		if !r.held(now) {
			b.broker.token++
			r.token, r.owner = b.broker.token, b
			r.until = b.holdUntil(now)
			return &driver.DeadDelivery{DeadMessage: r.DeadMessage, Handle: deadHandle{rec: r, token: r.token}}, nil
		}
	}
	return nil, driver.ErrNoDeadLetters
}

// holdUntil is when a hold taken or renewed at now lapses; zero: never.
func (b *Backend) holdUntil(now time.Time) time.Time {
	if b.deadHold == 0 {
		return time.Time{}
	}
	return now.Add(b.deadHold)
}

// ExtendDead implements driver.Backend: it renews the hold for another
// Config.DeadHold.
func (b *Backend) ExtendDead(ctx context.Context, d *driver.DeadDelivery) error {
	h, ok := d.Handle.(deadHandle)
	if !ok {
		return fmt.Errorf("memory: dead letter was not handed out by this backend")
	}
	if err := b.lock(); err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	now := time.Now()
	if h.rec.token != h.token || !h.rec.held(now) {
		return driver.ErrLeaseLost
	}
	h.rec.until = b.holdUntil(now)
	return nil
}

// SettleDead implements driver.Backend.
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	h, ok := d.Handle.(deadHandle)
	if !ok {
		return fmt.Errorf("memory: dead letter was not handed out by this backend")
	}
	if err := b.lock(); err != nil {
		return err
	}
	defer b.broker.mu.Unlock()
	if h.rec.token != h.token {
		return driver.ErrLeaseLost
	}
	lapsed := !h.rec.held(time.Now())
	h.rec.token, h.rec.owner = 0, nil
	if lapsed {
		return driver.ErrLeaseLost // released in place, as the lapse did
	}
	if remove {
		for _, q := range b.broker.queues {
			for i, r := range q.dead {
				if r == h.rec {
					if i == 0 { // the usual case: the head, in O(1)
						q.dead[0] = nil
						q.dead = q.dead[1:]
					} else {
						q.dead = slices.Delete(q.dead, i, i+1)
					}
					return nil
				}
			}
		}
		return driver.ErrLeaseLost
	}
	return nil
}

// ListDead implements driver.Backend. The cursor is an index.
func (b *Backend) ListDead(ctx context.Context, name, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	start := 0
	if cursor != "" {
		n, err := strconv.Atoi(cursor)
		if err != nil || n < 0 {
			return nil, "", fmt.Errorf("memory: bad dead-letter cursor %q", cursor)
		}
		start = n
	}
	if err := b.lock(); err != nil {
		return nil, "", err
	}
	defer b.broker.mu.Unlock()
	dead := b.broker.queue(name).dead
	if start >= len(dead) {
		return nil, "", nil
	}
	end := min(start+limit, len(dead))
	out := make([]driver.DeadMessage, 0, end-start)
	for _, r := range dead[start:end] {
		out = append(out, r.DeadMessage)
	}
	next := ""
	if end < len(dead) {
		next = strconv.Itoa(end)
	}
	return out, next, nil
}

// DeleteDead implements driver.Backend. Held records are left alone.
func (b *Backend) DeleteDead(ctx context.Context, name string, ids []string) (int, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	if err := b.lock(); err != nil {
		return 0, err
	}
	defer b.broker.mu.Unlock()
	q := b.broker.queue(name)
	kept := q.dead[:0:0]
	now := time.Now()
	for _, r := range q.dead {
		if !r.held(now) && want[r.ID] {
			continue
		}
		kept = append(kept, r)
	}
	n := len(q.dead) - len(kept)
	q.dead = kept
	return n, nil
}

// PurgeDead implements driver.Backend.
func (b *Backend) PurgeDead(ctx context.Context, name string) (int, error) {
	if err := b.lock(); err != nil {
		return 0, err
	}
	defer b.broker.mu.Unlock()
	q := b.broker.queue(name)
	n := len(q.dead)
	for _, r := range q.dead {
		r.token = 0 // a holder's SettleDead now fails
	}
	q.dead = nil
	return n, nil
}
