package asyncplatform

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/pause"
)

// GroupHeader is the header a job carries its Group in.
const GroupHeader = "asyncplatform-group"

// MaxGroupLen bounds a job's Group, in bytes.
const MaxGroupLen = 64

// HeldQueue is the queue where the jobs of a paused group are held: its
// name is the queue's, ".held.", and the group's. A priority level's jobs
// are held on their level's: HeldQueue(PriorityQueue(queue, n), group). It
// shows among the backend's queues; ResumeGroup empties it. No queue a
// user names may contain ".held." (see Enqueue).
func HeldQueue(queue, group string) string { return pause.HeldQueue(queue, group) }

// ownQueue checks a queue name a user gives for a queue of their own (a
// job's queue, a queue of Config.Queues, a queue whose groups are paused):
// a valid name (validQueue) that names none of the queues the platform
// derives from one: no ".held." (a group's held queue, HeldQueue) and no
// ".prio" and a number at its end (a priority level's queue,
// PriorityQueue), so that no real queue is taken for one of those. level
// is the job's Priority: a job enqueued again as it was delivered names
// its own level's queue. The error matches ErrInvalidJob and
// driver.ErrBadQueue.
func ownQueue(name string, level int) error {
	if err := validQueue(name); err != nil {
		return err
	}
	if strings.Contains(name, ".held.") {
		return fmt.Errorf("%w: %w: queue name %q has \".held.\", which marks the held queue of a paused group (HeldQueue)", ErrInvalidJob, driver.ErrBadQueue, name)
	}
	if i := strings.LastIndex(name, ".prio"); i >= 0 {
		if n := name[i+len(".prio"):]; n != "" && strings.Trim(n, "0123456789") == "" && (level == 0 || n != strconv.Itoa(level)) {
			return fmt.Errorf("%w: %w: queue name %q ends in %q, which marks the queue of a priority level (PriorityQueue): set Job.Priority instead", ErrInvalidJob, driver.ErrBadQueue, name, name[i:])
		}
	}
	return nil
}

// checkGroup checks a group name, alone and in its held queue's name.
func checkGroup(queue, group string) error {
	if err := pause.CheckGroup(queue, group); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidJob, err)
	}
	return nil
}

// setGroup checks j.Group and writes it in j's GroupHeader (in a copy of
// the caller's map).
func setGroup(j *Job) error {
	if j.Group == "" {
		if g, ok := j.Headers[GroupHeader]; ok {
			// A worker would take it for no group: refuse it here.
			if err := checkGroup(j.Queue, g); err != nil {
				return fmt.Errorf("%w (in header %s)", err, GroupHeader)
			}
		}
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

// PauseGroup pauses one group of a queue's jobs (Job.Group), at every
// priority level of the queue, for every worker process, until
// ResumeGroup: as a worker is handed one of its
// jobs, it sets the job aside, as it is (tries, failures, crashes), on the
// group's held queue (HeldQueue), and acknowledges it on the queue: the
// queue's other jobs keep flowing. A job set aside is written before its
// delivery is acknowledged, so a crash in between leaves a copy on both
// queues, never none. Workers notice within about PausePoll. It needs the
// backend's store.
func (p *Platform) PauseGroup(ctx context.Context, queue, group string) error {
	if err := ownQueue(queue, 0); err != nil {
		return err
	}
	if err := checkGroup(queue, group); err != nil {
		return err
	}
	if p == nil || p.pz == nil {
		return ErrNotNew
	}
	return p.pz.PauseGroup(ctx, queue, group)
}

// ResumeGroup resumes a paused group: it ends the pause, waits until the
// workers have noticed, then moves every job held for the group back to
// its queue (and each priority level's to its level), in the order they
// were set aside, with their counters as they were, and returns how many
// it moved. A held job goes back byte for byte, its signature with it: a
// platform without the SigningKey resumes signed jobs. If it fails part way, the jobs
// not yet moved stay held: call it again. Resuming a group that is not
// paused moves whatever its held queue still has.
func (p *Platform) ResumeGroup(ctx context.Context, queue, group string) (int, error) {
	if err := ownQueue(queue, 0); err != nil {
		return 0, err
	}
	if err := checkGroup(queue, group); err != nil {
		return 0, err
	}
	if p == nil || p.pz == nil {
		return 0, ErrNotNew
	}
	return p.pz.ResumeGroup(ctx, queue, group)
}

// PausedGroups returns the paused groups of a queue, sorted. A held queue
// or a priority level's queue has none: its groups are its queue's.
func (p *Platform) PausedGroups(ctx context.Context, queue string) ([]string, error) {
	if err := validQueue(queue); err != nil {
		return nil, err
	}
	if p == nil || p.pz == nil {
		return nil, ErrNotNew
	}
	return p.pz.Groups(ctx, queue)
}
