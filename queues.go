package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/pause"
)

// QueueInfo is one queue found by Queues.
type QueueInfo struct {
	// Name is the queue's name.
	Name string

	// QueueStats are its depths; -1 where the backend cannot tell.
	QueueStats

	// OldestDead is when its oldest dead letter was dead-lettered; zero
	// when it has none (or that record is not a job).
	OldestDead time.Time

	// Groups are its paused groups and the groups whose jobs are still
	// held (a resume that did not finish), by name: a group's held queue
	// (HeldQueue) is reported here, on its queue, and not as a queue of
	// its own.
	Groups []HeldGroup

	// Err is why the depths or OldestDead could not be read (the queue
	// was deleted meanwhile, say); nil when they were.
	Err error
}

// HeldGroup is a group of a queue's jobs that is paused (PauseGroup), or
// whose jobs are held still.
type HeldGroup struct {
	// Group is the group's name.
	Group string
	// Paused says whether the group is paused: false for a group resumed
	// while jobs are left on its held queue (call ResumeGroup again).
	Paused bool
	// Held is how many of its jobs wait on its held queue (the held
	// queue's ready jobs); -1 when the backend cannot tell.
	Held int64
}

// queueStatsParallel bounds the queues whose depths Queues reads at once.
const queueStatsParallel = 8

// QueueNames returns the name of every queue the backend holds, sorted:
// every queue that holds a job or a dead letter, and every queue declared
// since it was last deleted (on NATS, only once a worker received from it).
// The backend must implement driver.QueueLister (all of this module's do);
// with one that does not, the error matches errors.ErrUnsupported. Names
// come from the broker, which others can write to, so a name that is not a
// valid queue name is left out.
func (p *Platform) QueueNames(ctx context.Context) ([]string, error) {
	if p.backend == nil {
		return nil, ErrNotNew
	}
	l, ok := p.backend.(driver.QueueLister)
	if !ok {
		return nil, fmt.Errorf("asyncplatform: listing queues: %T does not implement driver.QueueLister: %w", p.backend, errors.ErrUnsupported)
	}
	names, err := l.Queues(ctx)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: listing queues: %w", err)
	}
	out := names[:0:0]
	for i, q := range names {
		if validQueue(q) == nil && (i == 0 || q != names[i-1]) {
			out = append(out, q)
		}
	}
	return out, nil
}

// Queues returns every queue of QueueNames with its depths and the age of
// its oldest dead letter, read a few queues at a time. A paused group's held
// queue (HeldQueue) is not listed as a queue: it is one of its queue's
// Groups, with how many jobs it holds; once the group is resumed and its
// held queue is empty, it is not listed at all. A queue whose figures
// could not be read is listed with Err set; the error is for the listing
// itself. It costs one Stats per queue and per held queue, one listing of
// the paused groups, and one page of one dead letter per queue that has
// dead letters: a live view may call it every second or so.
func (p *Platform) Queues(ctx context.Context) ([]QueueInfo, error) {
	names, err := p.QueueNames(ctx)
	if err != nil {
		return nil, err
	}
	var paused map[string][]string
	if p.pz != nil {
		if paused, err = p.pz.AllGroups(ctx); err != nil {
			return nil, err
		}
	}
	// held[q][g]: the held queue of group g of queue q is listed.
	held := map[string]map[string]bool{}
	var queues []string
	for _, q := range names {
		if parent, g, ok := pause.SplitHeld(q); ok {
			if held[parent] == nil {
				held[parent] = map[string]bool{}
			}
			held[parent][g] = true
			continue
		}
		queues = append(queues, q)
	}
	listed := len(queues) // queues[:listed] is sorted: the search reads only those
	for q := range held {
		if _, found := slices.BinarySearch(queues[:listed], q); !found && validQueue(q) == nil {
			queues = append(queues, q) // only its held jobs are left
		}
	}
	slices.Sort(queues)
	out := make([]QueueInfo, len(queues))
	sem := make(chan struct{}, queueStatsParallel)
	var wg sync.WaitGroup
	for i, q := range queues {
		out[i].Name = q
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i].Groups, out[i].Err = heldGroups(p.pz.HeldGroups(ctx, q, paused[q], held[q]))
			if out[i].Err != nil {
				return
			}
			out[i].QueueStats, out[i].Err = p.Stats(ctx, q)
			if out[i].Err != nil || out[i].Dead == 0 {
				return
			}
			page, err := p.DeadLetters(ctx, q, "", 1)
			switch {
			case err != nil:
				out[i].Err = err
			case len(page.Letters) > 0:
				out[i].OldestDead = page.Letters[0].DeadAt
			}
		}()
	}
	wg.Wait()
	return out, nil
}

// HeldGroups returns the groups of queue that are paused or whose jobs are
// held still, as Queues reports them in QueueInfo.Groups.
func (p *Platform) HeldGroups(ctx context.Context, queue string) ([]HeldGroup, error) {
	if err := validQueue(queue); err != nil {
		return nil, err
	}
	if p == nil || p.pz == nil {
		return nil, ErrNotNew
	}
	return heldGroups(p.pz.Held(ctx, queue))
}

// heldGroups is the public form of the pause engine's held groups.
func heldGroups(hs []pause.Held, err error) ([]HeldGroup, error) {
	if err != nil || len(hs) == 0 {
		return nil, err
	}
	out := make([]HeldGroup, len(hs))
	for i, h := range hs {
		out[i] = HeldGroup(h)
	}
	return out, nil
}

// UnknownQueueError is the error of CheckKnownQueue for a queue the
// backend does not hold: a typo, or a queue nothing has declared yet.
type UnknownQueueError struct {
	// Queue is the name asked for.
	Queue string
}

func (e *UnknownQueueError) Error() string {
	return fmt.Sprintf("asyncplatform: unknown queue %q: the backend holds no such queue (none of its jobs, dead letters or declarations), and it is not paused", e.Queue)
}

// CheckKnownQueue returns nil when the backend holds the queue (QueueNames
// lists it), it is paused, or one of its groups is paused; an
// *UnknownQueueError when none of these holds. An operator's tool calls it
// before it acts on or reports a queue named by hand, so that a typo is
// not taken for an empty queue. With a backend that cannot list its
// queues the error matches errors.ErrUnsupported: it cannot tell.
func (p *Platform) CheckKnownQueue(ctx context.Context, queue string) error {
	if err := validQueue(queue); err != nil {
		return err
	}
	names, err := p.QueueNames(ctx)
	if err != nil {
		return err
	}
	if _, found := slices.BinarySearch(names, queue); found {
		return nil
	}
	paused, err := p.PausedQueues(ctx)
	if err != nil && !errors.Is(err, ErrNoStore) {
		return err
	}
	if slices.Contains(paused, queue) {
		return nil
	}
	if groups, err := p.PausedGroups(ctx, queue); err == nil && len(groups) > 0 {
		return nil
	} else if err != nil && !errors.Is(err, ErrNoStore) {
		return err
	}
	return &UnknownQueueError{Queue: queue}
}
