package pause

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Held is a group of a queue's jobs that is paused, or whose jobs are held
// still (a resume that did not finish).
type Held struct {
	Group  string
	Paused bool  // false for a group resumed while jobs are left held
	Held   int64 // the ready jobs of its held queue; -1 when the backend cannot tell
}

// Held returns the groups of queue that are paused or whose jobs are held
// still, sorted: it reads the paused groups, and the held queues the
// backend lists (a driver.QueueLister), then HeldGroups.
func (e *Engine) Held(ctx context.Context, queue string) ([]Held, error) {
	paused, err := e.Groups(ctx, queue)
	if err != nil && !errors.Is(err, driver.ErrNoStore) {
		return nil, err
	}
	listed := map[string]bool{}
	if l, ok := e.cfg.Backend.(driver.QueueLister); ok {
		names, err := l.Queues(ctx)
		if err != nil {
			return nil, fmt.Errorf("asyncplatform: listing queues: %w", err)
		}
		for _, n := range names {
			if q, g, ok := SplitHeld(n); ok && q == queue {
				listed[g] = true
			}
		}
	}
	return e.HeldGroups(ctx, queue, paused, listed)
}

// HeldGroups returns the groups of queue that are paused or whose held
// queue is listed and holds jobs, sorted, with the jobs each holds (one
// Stats of the backend per listed held queue). A group not listed holds
// none where the backend lists its queues, and -1 (unknown) elsewhere.
func (e *Engine) HeldGroups(ctx context.Context, queue string, paused []string, listed map[string]bool) ([]Held, error) {
	var out []Held
	for _, g := range paused {
		out = append(out, Held{Group: g, Paused: true})
	}
	for g := range listed {
		if !slices.Contains(paused, g) {
			out = append(out, Held{Group: g})
		}
	}
	slices.SortFunc(out, func(a, b Held) int { return strings.Compare(a.Group, b.Group) })
	_, lists := e.cfg.Backend.(driver.QueueLister)
	kept := out[:0]
	for _, hg := range out {
		hg.Held = -1
		if listed[hg.Group] {
			s, err := e.cfg.Backend.Stats(ctx, HeldQueue(queue, hg.Group))
			if err != nil {
				return nil, fmt.Errorf("asyncplatform: the held jobs of group %q of queue %q: %w", hg.Group, queue, err)
			}
			hg.Held = s.Ready
		} else if lists {
			hg.Held = 0 // not listed: nothing was ever held, or the queue was deleted
		}
		if hg.Paused || hg.Held != 0 {
			kept = append(kept, hg)
		}
	}
	return kept, nil
}
