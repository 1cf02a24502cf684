package asyncplatform

import (
	"fmt"
	"strconv"
)

// MaxPriority is the highest Job.Priority.
const MaxPriority = 3

// PriorityQueue is the queue that holds the jobs of a queue's priority
// level: the queue itself for level 0, else its name and ".prio" and the
// level ("emails.prio2"). Each level is a queue of its own on the broker,
// with its own depths and dead letters, because no broker we run on gives
// every queue kind per-message priorities (RabbitMQ's quorum queues have
// none); a worker whose QueueConfig.Priorities is set works the levels as
// a strict Pool, highest first.
func PriorityQueue(queue string, level int) string {
	if level == 0 {
		return queue
	}
	return queue + ".prio" + strconv.Itoa(level)
}

// level is a priority level's queue seen from a worker.
type level struct {
	base  string
	level int
}

// expandPriorities adds, for every queue with Priorities, its level queues
// (with the queue's settings) and a strict pool over them, highest first,
// with the queue's Concurrency and Prefetch. It runs after the queues'
// defaults are set.
func (c *Config) expandPriorities() (map[string]level, error) {
	var levels map[string]level
	var bases []string
	for name, q := range c.Queues {
		if q.Priorities {
			bases = append(bases, name)
		}
	}
	for _, name := range bases {
		q := c.Queues[name]
		if c.pooled(name) {
			return nil, fmt.Errorf("%w: Queues[%q] has Priorities and is in a Pool: its levels are a pool of their own", ErrInvalidConfig, name)
		}
		pool := Pool{Concurrency: q.Concurrency, Prefetch: q.Prefetch}
		for l := MaxPriority; l >= 1; l-- {
			pq := PriorityQueue(name, l)
			if err := validQueue(pq); err != nil {
				return nil, fmt.Errorf("%w: Queues[%q] has Priorities, but its level %d's queue name is not valid: %w", ErrInvalidConfig, name, l, err)
			}
			if _, ok := c.Queues[pq]; ok {
				return nil, fmt.Errorf("%w: Queues[%q] has Priorities, and its level %d's queue %q is configured too", ErrInvalidConfig, name, l, pq)
			}
			lq := q
			lq.Priorities = false
			c.Queues[pq] = lq
			pool.Queues = append(pool.Queues, pq)
			if levels == nil {
				levels = map[string]level{}
			}
			levels[pq] = level{base: name, level: l}
		}
		pool.Queues = append(pool.Queues, name)
		levels[name] = level{base: name}
		c.Pools = append(c.Pools, pool)
	}
	return levels, nil
}

// setPriority checks j.Priority and moves j to its level's queue.
func setPriority(j *Job) error {
	if j.Priority == 0 {
		return nil
	}
	if j.Priority < 0 || j.Priority > MaxPriority {
		return fmt.Errorf("%w: job %q: Priority %d is not 0 to %d", ErrInvalidJob, j.ID, j.Priority, MaxPriority)
	}
	if lv := j.Queue; len(lv) > 6 && lv[len(lv)-6:len(lv)-1] == ".prio" {
		return nil // already on a level's queue (a job enqueued again as it was delivered)
	}
	j.Queue = PriorityQueue(j.Queue, j.Priority)
	return validQueue(j.Queue)
}
