package enqueue

import (
	"context"
	"fmt"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/unique"
)

// enqueueUnique is Enqueue for a batch with unique keys or stale claims
// among its jobs. Each unique job takes its key and is stored as a copy
// carrying its claim in unique.Header; a job without a key is stored
// without the header. When the store fails, the keys taken are given back.
func (e *Engine) enqueueUnique(ctx context.Context, jobs []Job) error {
	claims, refused, err := e.cfg.Claims.Take(ctx, requests(jobs))
	if err != nil {
		return fmt.Errorf("asyncplatform: %w", err)
	}
	if refused != nil && len(jobs) == 1 {
		return &RefusedError{Held: refused}
	}
	out := make([]Job, 0, len(jobs))
	for i := range jobs {
		if refused != nil && refused[i] != nil {
			continue
		}
		out = append(out, withClaim(jobs[i], claims[i]))
	}
	if err := e.putGrouped(ctx, out); err != nil {
		e.cfg.Claims.GiveBack(ctx, claims)
		return err
	}
	if refused != nil {
		return &RefusedError{Held: refused}
	}
	return nil
}

// requests returns the claim request of each job.
func requests(jobs []Job) []unique.Request {
	reqs := make([]unique.Request, len(jobs))
	for i := range jobs {
		j := &jobs[i]
		reqs[i] = unique.Request{Key: j.UniqueKey, JobID: j.ID, Window: j.UniqueWindow, Release: j.UniqueRelease}
	}
	return reqs
}

// withClaim returns the job as it is stored: a unique job with its claim cl
// in unique.Header, a job without a key and with a stale claim (a delivered
// job enqueued again: its claim is not its own) without the header, any
// other job as it is. The caller's headers are not written to.
func withClaim(j Job, cl unique.Claim) Job {
	_, stale := j.Headers[unique.Header]
	switch {
	case j.UniqueKey != "":
		j.Headers = cloneHeaders(j.Headers)
		j.Headers[unique.Header] = cl.Header()
	case stale:
		j.Headers = cloneHeaders(j.Headers)
		delete(j.Headers, unique.Header)
	}
	return j
}

// enqueueClaiming is enqueueUnique on a backend that creates each claim in
// the same call as its job's enqueue (driver.ClaimingEnqueuer): the claims
// (keys, values, windows, release policies) are the ones Take would write,
// carried at unique.AnyRev, and the refusals the same, a job refused by a
// held key not stored. The jobs go with one call per queue and up to
// driver.MaxBatch jobs; when a call fails, the claims it may have created
// are given back, those of the calls before it stay with their stored jobs.
func (e *Engine) enqueueClaiming(ctx context.Context, jobs []Job) error {
	reqs := requests(jobs)
	plan, err := e.cfg.Claims.Plan(reqs)
	if err != nil {
		return fmt.Errorf("asyncplatform: %w", err)
	}
	held := make([][]byte, len(jobs))
	for _, idx := range claimGroups(jobs, plan.Dups) {
		q := jobs[idx[0]].Queue
		for lo := 0; lo < len(idx); lo += driver.MaxBatch {
			part := idx[lo:min(lo+driver.MaxBatch, len(idx))]
			out := make([]Job, len(part))
			items := make([]*driver.BatchItem, len(part))
			for k, i := range part {
				out[k], items[k] = withClaim(jobs[i], plan.Claims[i]), plan.Items[i]
			}
			h, err := e.putClaiming(ctx, q, out, items)
			if err != nil {
				given := make([]unique.Claim, len(jobs))
				for _, i := range part {
					given[i] = plan.Claims[i]
				}
				e.cfg.Claims.GiveBackPlanned(ctx, reqs, given)
				return err
			}
			for k, v := range h {
				held[part[k]] = v
			}
		}
	}
	if refused := plan.Refused(reqs, held); refused != nil {
		return &RefusedError{Held: refused}
	}
	return nil
}

// putClaiming is Put through the backend's driver.ClaimingEnqueuer: each
// job with an item is stored only when the item's key is created, in the
// same call. held has one entry a job: the value holding the key of each
// job refused, nil for the others. The payloads of refused jobs are
// dropped; their status is not written.
func (e *Engine) putClaiming(ctx context.Context, queue string, jobs []Job, items []*driver.BatchItem) (held [][]byte, err error) {
	if err := e.Declare(ctx, queue); err != nil {
		return nil, err
	}
	msgs, refs, err := e.encode(ctx, jobs, true, e.nonced(queue, false))
	if err != nil {
		return nil, err
	}
	cms := make([]driver.ClaimMessage, len(msgs))
	for i := range msgs {
		cms[i] = driver.ClaimMessage{Message: msgs[i], Claim: items[i]}
	}
	rs, err := driver.EnqueueClaiming(ctx, e.cfg.Claimer, queue, cms)
	if err != nil {
		return nil, enqueueError(queue, err)
	}
	stored := jobs
	for i, r := range rs {
		if r.Err == nil {
			continue
		}
		if held == nil {
			held = make([][]byte, len(jobs))
			stored = nil
		}
		held[i] = r.Value
		if held[i] == nil {
			held[i] = []byte{}
		}
		if refs != nil && refs[i].Ref != "" {
			e.cfg.Payloads.Drop(ctx, refs[i].Job, refs[i].Ref)
		}
	}
	if held != nil {
		for i := range jobs {
			if held[i] == nil {
				stored = append(stored, jobs[i])
			}
		}
	}
	if e.cfg.Status.Tracks(queue) && len(stored) > 0 {
		e.cfg.Status.Enqueued(ctx, statusJobs(stored))
	}
	return held, nil
}

// claimGroups returns the jobs to send, by queue in the order of their
// first job: the indexes of each queue's jobs, without those in dups.
func claimGroups(jobs []Job, dups map[int]int) [][]int {
	if len(jobs) == 1 { // the common case, without a map
		return [][]int{{0}}
	}
	at := map[string]int{}
	var groups [][]int
	for i := range jobs {
		if _, dup := dups[i]; dup {
			continue
		}
		g, ok := at[jobs[i].Queue]
		if !ok {
			g = len(groups)
			at[jobs[i].Queue] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// putGrouped stores jobs with one Put per queue, in the order of each
// queue's first job.
func (e *Engine) putGrouped(ctx context.Context, jobs []Job) error {
	if oneQueue(jobs) { // the common case, without copies
		return e.Put(ctx, jobs[0].Queue, jobs, true, false)
	}
	byQueue := map[string][]Job{}
	var order []string
	for _, j := range jobs {
		if _, ok := byQueue[j.Queue]; !ok {
			order = append(order, j.Queue)
		}
		byQueue[j.Queue] = append(byQueue[j.Queue], j)
	}
	for _, q := range order {
		if err := e.Put(ctx, q, byQueue[q], true, false); err != nil {
			return err
		}
	}
	return nil
}

// oneQueue reports whether jobs, at least one, are all of one queue.
func oneQueue(jobs []Job) bool {
	for i := range jobs {
		if jobs[i].Queue != jobs[0].Queue {
			return false
		}
	}
	return len(jobs) > 0
}

// needsUnique reports whether a batch has a unique key or a stale claim,
// so that Enqueue takes the unique path.
func needsUnique(jobs []Job) bool {
	for i := range jobs {
		if jobs[i].UniqueKey != "" {
			return true
		}
		if _, ok := jobs[i].Headers[unique.Header]; ok {
			return true
		}
	}
	return false
}
