package pause

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// MaxGroupLen bounds a group name, in bytes.
const MaxGroupLen = wire.MaxGroupLen

// heldSuffix joins a queue and a group in the name of the queue where the
// group's jobs are held while it is paused: QUEUE.held.GROUP.
const heldSuffix = ".held."

// resumeSlack is what ResumeGroup waits, beyond two polls, for every worker
// to have read the resume: the poll's own time.
const resumeSlack = 250 * time.Millisecond

// resumeTries is how many empty Receives in a row ResumeGroup takes, while
// the held queue's depth says jobs are ready, before it returns.
const resumeTries = 6

// resumeBatch is how many held jobs ResumeGroup moves back at a time.
const resumeBatch = 100

// ErrNotParked is matched by Park's error when the held copy could not be
// written: nothing was written, and the delivery is still held.
var ErrNotParked = errors.New("setting aside a job of a paused group failed")

// HeldQueue is the queue where the jobs of a paused group are held: its
// name is the queue's, ".held.", and the group's. A priority level's jobs
// are held on the level's own (QUEUE.prioN.held.GROUP), so they come back
// at their level.
func HeldQueue(queue, group string) string { return queue + heldSuffix + group }

// CheckGroup checks a group name (wire.CheckGroup), alone and in its held
// queue's name.
func CheckGroup(queue, group string) error {
	if err := wire.CheckGroup(group); err != nil {
		return err
	}
	if err := driver.CheckQueue(HeldQueue(queue, group)); err != nil {
		return fmt.Errorf("group %q of queue %q: the queue holding it would be an invalid name: %v", group, queue, err)
	}
	return nil
}

func groupKey(queue, group string) string { return groupPrefix + queue + "/" + group }

// timeout bounds a worker's store read or held-copy write.
func (e *Engine) timeout() time.Duration { return max(e.cfg.Lease/3, time.Second) }

// PauseGroup pauses group of queue: it writes its key, or leaves the one
// there.
func (e *Engine) PauseGroup(ctx context.Context, queue, group string) error {
	s, err := e.store()
	if err != nil {
		return err
	}
	if _, err := s.Create(ctx, groupKey(queue, group), nil, 0); err != nil && !errors.Is(err, driver.ErrKeyExists) {
		return fmt.Errorf("asyncplatform: pausing group %q of queue %q: %w", group, queue, err)
	}
	return nil
}

// ResumeGroup ends the pause of group of queue, waits until every worker
// has read it (two polls and resumeSlack), then moves the group's held jobs
// back to queue and to each of its priority levels (LevelQueues), from
// their held queues, in the order received, a batch at a time (enqueued,
// then acknowledged), until each held queue is empty, and returns how many
// it moved. If it fails part way, the jobs not yet moved stay held.
func (e *Engine) ResumeGroup(ctx context.Context, queue, group string) (int, error) {
	s, err := e.store()
	if err != nil {
		return 0, err
	}
	if err := s.Delete(ctx, groupKey(queue, group), ""); err != nil && !errors.Is(err, driver.ErrKeyNotFound) {
		return 0, fmt.Errorf("asyncplatform: resuming group %q of queue %q: %w", group, queue, err)
	}
	// Moved back sooner, a job could be set aside again.
	select {
	case <-time.After(2*e.cfg.Poll + resumeSlack):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	// The levels are listed after the wait: a worker that set a level's
	// job aside during it made that level's held queue then.
	levels, err := e.heldLevels(ctx, queue, group)
	if err != nil {
		return 0, fmt.Errorf("asyncplatform: resuming group %q of queue %q: %w", group, queue, err)
	}
	moved := 0
	seen := map[string]bool{} // the held copies moved: a copy held twice moves once
	for _, lq := range levels {
		n, err := e.moveHeld(ctx, lq, group, seen)
		moved += n
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// heldLevels returns the queues among queue and its priority levels whose
// jobs of group may be held: queue always, a level when its held queue is
// a valid name and, on a backend that lists its queues, is listed.
func (e *Engine) heldLevels(ctx context.Context, queue, group string) ([]string, error) {
	if e.cfg.LevelQueues == nil {
		return []string{queue}, nil
	}
	all := e.cfg.LevelQueues(queue)
	lister, ok := e.cfg.Backend.(driver.QueueLister)
	if !ok || len(all) < 2 {
		return all, nil
	}
	names, err := lister.Queues(ctx)
	if err != nil {
		return nil, err
	}
	out := []string{queue}
	for _, lq := range all {
		if held := HeldQueue(lq, group); lq != queue && driver.CheckQueue(held) == nil {
			if _, found := slices.BinarySearch(names, held); found {
				out = append(out, lq)
			}
		}
	}
	return out, nil
}

// moveHeld moves the held jobs of group of queue (one level) back to it,
// and returns how many it moved.
func (e *Engine) moveHeld(ctx context.Context, queue, group string, seen map[string]bool) (int, error) {
	if err := e.cfg.Declare(ctx, queue); err != nil {
		return 0, err
	}
	held := HeldQueue(queue, group)
	// The held queue is empty when a Receive of quiet finds nothing and its
	// depth says nothing is ready. A depth that says otherwise (or cannot
	// tell) means a slow broker: the next Receive waits twice as long, up
	// to maxQuiet, and after resumeTries such Receives the call ends, its
	// count so far returned (call again for the rest).
	quiet, maxQuiet, empties := e.cfg.Poll, max(e.cfg.Lease, 8*e.cfg.Poll), 0
	lease := max(e.cfg.Lease, time.Minute) // a lease no slow batch outlives: a lapse would move a job twice
	moved := 0
	for {
		rctx, cancel := context.WithTimeout(ctx, quiet)
		ds, err := e.cfg.Backend.Receive(rctx, held, resumeBatch, lease)
		cancel()
		if len(ds) == 0 {
			if ctx.Err() != nil {
				return moved, ctx.Err()
			}
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return moved, fmt.Errorf("asyncplatform: resuming group %q of queue %q: %w", group, queue, err)
			}
			st, serr := e.cfg.Backend.Stats(ctx, held)
			if serr != nil || st.Ready == 0 {
				return moved, nil
			}
			if empties++; empties == resumeTries {
				e.cfg.Log.WarnContext(ctx, "asyncplatform: held jobs are left after resuming a group: the broker handed none out; call ResumeGroup again", "queue", held, "ready", st.Ready)
				return moved, nil
			}
			quiet = min(2*quiet, maxQuiet)
			continue
		}
		empties = 0
		msgs, dups := e.moveBack(ds, seen)
		if len(msgs) > 0 {
			if err := e.cfg.Backend.Enqueue(ctx, queue, msgs); err != nil {
				return moved, fmt.Errorf("asyncplatform: resuming group %q of queue %q: moving %d held jobs back: %w", group, queue, len(msgs), err)
			}
		}
		for _, d := range ds {
			if err := e.cfg.Backend.Ack(ctx, d); err != nil {
				e.cfg.Log.WarnContext(ctx, "asyncplatform: a held job moved back was not removed from the held queue; it will be moved again", "queue", held, "error", err)
			}
		}
		if dups > 0 {
			e.cfg.Log.InfoContext(ctx, "asyncplatform: a job set aside twice was moved back once", "queue", held, "copies", dups)
		}
		moved += len(msgs)
	}
}

// moveBack returns the messages that move a batch of held deliveries back,
// and how many were copies of a job already moved (seen, which it updates).
func (e *Engine) moveBack(ds []*driver.Delivery, seen map[string]bool) (msgs []driver.Message, dups int) {
	for _, d := range ds {
		// Held, not crashed: its deliveries here are no crashes.
		once := *d
		once.Deliveries = 1
		id, msg := e.cfg.MoveBack(&once)
		if id != "" {
			// A job set aside twice (the acknowledgement of its first
			// setting aside was lost, and it came again) is one job.
			if seen[id] {
				dups++
				continue
			}
			seen[id] = true
		}
		msgs = append(msgs, msg)
	}
	return msgs, dups
}

// Groups returns the paused groups of queue, sorted. A key that is no
// group name is left out.
func (e *Engine) Groups(ctx context.Context, queue string) ([]string, error) {
	s, err := e.store()
	if err != nil {
		return nil, err
	}
	prefix := groupPrefix + queue + "/"
	var out []string
	err = s.ListAll(ctx, prefix, func(k string) (bool, error) {
		if g := strings.TrimPrefix(k, prefix); CheckGroup(queue, g) == nil {
			out = append(out, g)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: listing paused groups: %w", err)
	}
	return out, nil
}

// AllGroups returns the paused groups of every queue, each queue's sorted,
// in one listing of the store. A key that is no queue and group name is
// left out; a backend without a store has none.
func (e *Engine) AllGroups(ctx context.Context) (map[string][]string, error) {
	s, err := e.store()
	if errors.Is(err, driver.ErrNoStore) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	err = s.ListAll(ctx, groupPrefix, func(k string) (bool, error) {
		q, g, ok := strings.Cut(strings.TrimPrefix(k, groupPrefix), "/")
		if ok && driver.CheckQueue(q) == nil && CheckGroup(q, g) == nil {
			out[q] = append(out[q], g)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: listing paused groups: %w", err)
	}
	return out, nil
}

// SplitHeld returns the queue and the group of a held queue's name
// (HeldQueue), and false for any other name. A queue of a user's never
// has ".held." in its name, so the first one marks it.
func SplitHeld(name string) (queue, group string, ok bool) {
	queue, group, ok = strings.Cut(name, heldSuffix)
	return queue, group, ok && queue != "" && group != ""
}

// pollGroups reads the paused groups of every queue.
func (e *Engine) pollGroups(ctx context.Context) error {
	var set map[string]bool
	err := e.cfg.Store.ListAll(ctx, groupPrefix, func(k string) (bool, error) {
		if set == nil {
			set = map[string]bool{}
		}
		set[strings.TrimPrefix(k, groupPrefix)] = true
		return true, nil
	})
	if err != nil {
		return err
	}
	if set == nil {
		e.groups.Store(nil)
	} else {
		e.groups.Store(&set)
	}
	return nil
}

// Group says whether group of queue is paused, for the gate of job id (for
// the log); a priority level's job (Levels) asks of its queue's group. The last poll's answer is read again from the store before a
// job is set aside, so a worker whose polls fail or lag never holds a job
// after ResumeGroup has moved the held ones back; when the store cannot
// answer, the state is unknown (the job comes again a little later).
func (e *Engine) Group(ctx context.Context, queue, group, id string) decide.Group {
	if group == "" {
		return decide.GroupOpen
	}
	if base, ok := e.cfg.Levels[queue]; ok {
		queue = base // a level's jobs pause with their queue's group
	}
	if g := e.groups.Load(); g == nil || !(*g)[queue+"/"+group] {
		return decide.GroupOpen
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout())
	defer cancel()
	_, _, err := e.cfg.Store.Get(ctx, groupKey(queue, group))
	switch {
	case errors.Is(err, driver.ErrKeyNotFound):
		return decide.GroupOpen
	case err != nil:
		e.cfg.Log.Warn("asyncplatform: reading whether a job's group is paused failed; it comes back later", "queue", queue, "group", group, "id", id, "error", err)
		return decide.GroupUnknown
	}
	return decide.GroupPaused
}

// Park sets job id aside: it writes msg, the job as it is, on the held
// queue of group of queue, then calls ack to acknowledge its delivery, and
// returns ack's error. When the held copy could not be written it returns
// an error matching ErrNotParked, having written nothing and called
// nothing.
func (e *Engine) Park(ctx context.Context, queue, group, id string, msg driver.Message, ack func() error) error {
	ctx, cancel := context.WithTimeout(ctx, e.timeout())
	defer cancel()
	held := HeldQueue(queue, group)
	err := e.cfg.Declare(ctx, held)
	if err == nil {
		err = e.cfg.Backend.Enqueue(ctx, held, []driver.Message{msg})
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotParked, err)
	}
	if err := ack(); err != nil {
		return err
	}
	e.cfg.Log.Debug("asyncplatform: set aside a job of a paused group", "queue", queue, "group", group, "id", id)
	return nil
}
