package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
)

// GroupHeader is the header a job carries its Group in.
const GroupHeader = "asyncplatform-group"

// MaxGroupLen bounds a job's Group, in bytes.
const MaxGroupLen = 64

// heldSuffix joins a queue and a group in the name of the queue where the
// group's jobs are held while it is paused: QUEUE.held.GROUP.
const heldSuffix = ".held."

// HeldQueue is the queue where the jobs of a paused group are held: its
// name is the queue's, ".held.", and the group's. It shows among the
// backend's queues; ResumeGroup empties it.
func HeldQueue(queue, group string) string { return queue + heldSuffix + group }

// checkGroup checks a group name, alone and in its held queue's name.
func checkGroup(queue, group string) error {
	if group == "" || len(group) > MaxGroupLen {
		return fmt.Errorf("%w: group %q must be 1 to %d bytes", ErrInvalidJob, cutUTF8(group, 80), MaxGroupLen)
	}
	for i := 0; i < len(group); i++ {
		c := group[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: group %q: byte %d is not one of [A-Za-z0-9_-]", ErrInvalidJob, cutUTF8(group, 80), i)
		}
	}
	if err := driver.CheckQueue(HeldQueue(queue, group)); err != nil {
		return fmt.Errorf("%w: group %q of queue %q: the queue holding it would be an invalid name: %v", ErrInvalidJob, group, queue, err)
	}
	return nil
}

// setGroup checks j.Group and writes it in j's GroupHeader (in a copy of
// the caller's map).
func setGroup(j *Job) error {
	if j.Group == "" {
		return nil
	}
	if err := checkGroup(j.Queue, j.Group); err != nil {
		return err
	}
	if j.Headers[GroupHeader] != j.Group {
		h := maps.Clone(j.Headers)
		if h == nil {
			h = make(map[string]string, 1)
		}
		h[GroupHeader] = j.Group
		j.Headers = h
	}
	return nil
}

func groupKey(queue, group string) string { return "group/" + queue + "/" + group }

// PauseGroup pauses one group of a queue's jobs (Job.Group) for every
// worker process, until ResumeGroup: as a worker is handed one of its
// jobs, it sets the job aside, as it is (tries, failures, crashes), on the
// group's held queue (HeldQueue), and acknowledges it on the queue: the
// queue's other jobs keep flowing. A job set aside is written before its
// delivery is acknowledged, so a crash in between leaves a copy on both
// queues, never none. Workers notice within about PausePoll. It needs the
// backend's store.
func (p *Platform) PauseGroup(ctx context.Context, queue, group string) error {
	if err := validQueue(queue); err != nil {
		return err
	}
	if err := checkGroup(queue, group); err != nil {
		return err
	}
	s, err := p.pauseStore()
	if err != nil {
		return err
	}
	if _, err := s.Create(ctx, groupKey(queue, group), nil, 0); err != nil && !errors.Is(err, ErrKeyExists) {
		return fmt.Errorf("asyncplatform: pausing group %q of queue %q: %w", group, queue, err)
	}
	return nil
}

// ResumeGroup resumes a paused group: it ends the pause, waits until the
// workers have noticed, then moves every job held for the group back to
// its queue, in the order they were set aside, with their counters as
// they were, and returns how many it moved. If it fails part way, the jobs
// not yet moved stay held: call it again. Resuming a group that is not
// paused moves whatever its held queue still has.
func (p *Platform) ResumeGroup(ctx context.Context, queue, group string) (int, error) {
	if err := validQueue(queue); err != nil {
		return 0, err
	}
	if err := checkGroup(queue, group); err != nil {
		return 0, err
	}
	s, err := p.pauseStore()
	if err != nil {
		return 0, err
	}
	if err := s.Delete(ctx, groupKey(queue, group), ""); err != nil && !errors.Is(err, ErrKeyNotFound) {
		return 0, fmt.Errorf("asyncplatform: resuming group %q of queue %q: %w", group, queue, err)
	}
	if err := p.declare(ctx, queue); err != nil {
		return 0, err
	}
	held := HeldQueue(queue, group)
	// Every worker reads the resume within PausePoll (and the poll's own
	// time): moved back sooner, a job could be set aside again.
	select {
	case <-time.After(2*PausePoll + 250*time.Millisecond):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	// The held queue is empty when a Receive of quiet finds nothing and its
	// depth says nothing is ready. A depth that says otherwise (or cannot
	// tell) means a slow broker: the next Receive waits twice as long, up
	// to maxQuiet, and after resumeTries such Receives the call ends, its
	// count so far returned (call again for the rest).
	const resumeTries = 6
	quiet, maxQuiet, empties := PausePoll, max(p.cfg.Lease, 8*PausePoll), 0
	moved := 0
	seen := map[string]bool{} // the held copies moved: a copy held twice moves once
	for {
		rctx, cancel := context.WithTimeout(ctx, quiet)
		ds, err := p.backend.Receive(rctx, held, 100, max(p.cfg.Lease, time.Minute)) // a lease no slow batch outlives: a lapse would move a job twice
		cancel()
		if len(ds) == 0 {
			if ctx.Err() != nil {
				return moved, ctx.Err()
			}
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return moved, fmt.Errorf("asyncplatform: resuming group %q of queue %q: %w", group, queue, err)
			}
			st, serr := p.backend.Stats(ctx, held)
			if serr != nil || st.Ready == 0 {
				return moved, nil
			}
			if empties++; empties == resumeTries {
				p.log.WarnContext(ctx, "asyncplatform: held jobs are left after resuming a group: the broker handed none out; call ResumeGroup again", "queue", held, "ready", st.Ready)
				return moved, nil
			}
			quiet = min(2*quiet, maxQuiet)
			continue
		}
		empties = 0
		var msgs []driver.Message
		var dups []*driver.Delivery
		for _, d := range ds {
			var j Job
			// Held, not crashed: its deliveries here are no crashes.
			once := *d
			once.Deliveries = 1
			if derr := p.decodeDelivery(&once, &j, nil); derr != nil {
				msgs = append(msgs, driver.Message{ID: newID(time.Now()), Body: d.Body}) // not a job: the queue's worker dead-letters it
				continue
			}
			// A job set aside twice (the acknowledgement of its first
			// setting aside was lost, and it came again) is one job.
			id := messageID(&j)
			if seen[id] {
				dups = append(dups, d)
				continue
			}
			seen[id] = true
			j.copyNo++
			msgs = append(msgs, p.message(&j))
		}
		if len(msgs) > 0 {
			if err := p.backend.Enqueue(ctx, queue, msgs); err != nil {
				return moved, fmt.Errorf("asyncplatform: resuming group %q of queue %q: moving %d held jobs back: %w", group, queue, len(msgs), err)
			}
		}
		for _, d := range ds {
			if err := p.backend.Ack(ctx, d); err != nil {
				p.log.WarnContext(ctx, "asyncplatform: a held job moved back was not removed from the held queue; it will be moved again", "queue", held, "error", err)
			}
		}
		if len(dups) > 0 {
			p.log.InfoContext(ctx, "asyncplatform: a job set aside twice was moved back once", "queue", held, "copies", len(dups))
		}
		moved += len(msgs)
	}
}

// PausedGroups returns the paused groups of a queue, sorted.
func (p *Platform) PausedGroups(ctx context.Context, queue string) ([]string, error) {
	if err := validQueue(queue); err != nil {
		return nil, err
	}
	s, err := p.pauseStore()
	if err != nil {
		return nil, err
	}
	prefix := "group/" + queue + "/"
	var out []string
	cursor := ""
	for {
		page, err := s.List(ctx, prefix, cursor, MaxListLimit)
		if err != nil {
			return nil, fmt.Errorf("asyncplatform: listing paused groups: %w", err)
		}
		for _, k := range page.Keys {
			if g := strings.TrimPrefix(k, prefix); checkGroup(queue, g) == nil {
				out = append(out, g)
			}
		}
		if page.Next == "" {
			return out, nil
		}
		cursor = page.Next
	}
}

// groupPaused reports whether j's group is paused, by the last poll.
func (p *Platform) groupPaused(j *Job) bool {
	g := p.pz.groups.Load()
	return g != nil && (*g)[j.Queue+"/"+j.Group]
}

// pollGroups reads the paused groups of every queue.
func (p *Platform) pollGroups(ctx context.Context) error {
	var set map[string]bool
	cursor := ""
	for {
		page, err := p.pz.store.List(ctx, "group/", cursor, MaxListLimit)
		if err != nil {
			return err
		}
		for _, k := range page.Keys {
			if set == nil {
				set = map[string]bool{}
			}
			set[strings.TrimPrefix(k, "group/")] = true
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	if set == nil {
		p.pz.groups.Store(nil)
	} else {
		p.pz.groups.Store(&set)
	}
	return nil
}

// groupState says whether j's group is paused. The last poll's answer is
// read again from the store before a job is set aside, so a worker whose
// polls fail or lag never holds a job after ResumeGroup has moved the held
// ones back; when the store cannot answer, the state is unknown (the job
// comes again a little later).
func (p *Platform) groupState(j *Job) decide.Group {
	if j.Group == "" || !p.groupPaused(j) {
		return decide.GroupOpen
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(p.cfg.Lease/3, time.Second))
	defer cancel()
	_, _, err := p.pz.store.Get(ctx, groupKey(j.Queue, j.Group))
	switch {
	case errors.Is(err, ErrKeyNotFound):
		return decide.GroupOpen
	case err != nil:
		p.log.Warn("asyncplatform: reading whether a job's group is paused failed; it comes back later", "queue", j.Queue, "group", j.Group, "id", j.ID, "error", err)
		return decide.GroupUnknown
	}
	return decide.GroupPaused
}

// park sets j aside, as it is, on its group's held queue, then acknowledges
// its delivery. It returns errNotParked, having written nothing, when the
// held copy could not be written.
func (p *Platform) park(f *inflight, j *Job) error {
	ctx, cancel := context.WithTimeout(context.Background(), max(p.cfg.Lease/3, time.Second))
	defer cancel()
	held := HeldQueue(j.Queue, j.Group)
	j.copyNo++
	msg := p.message(j)
	err := p.declare(ctx, held)
	if err == nil {
		err = p.backend.Enqueue(ctx, held, []driver.Message{msg})
	}
	if err != nil {
		j.copyNo--
		return fmt.Errorf("%w: %w", errNotParked, err)
	}
	if err := p.settle(f, true, nil, nil); err != nil {
		return err
	}
	p.log.Debug("asyncplatform: set aside a job of a paused group", "queue", j.Queue, "group", j.Group, "id", j.ID)
	return nil
}

// errNotParked says a job of a paused group could not be set aside.
var errNotParked = errors.New("setting aside a job of a paused group failed")
