// Package redrive moves dead letters back to their queue as fresh jobs and
// deletes their records, so that nothing is lost and no job is enqueued
// twice by a redrive retried after a failure: a record is deleted as soon
// as its job is stored, and a job is stored only while its record is
// there.
package redrive

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/enqueue"
	"github.com/asyncplatform/asyncplatform/internal/payload"
	"github.com/asyncplatform/asyncplatform/internal/status"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// Letter is a dead letter to redrive.
type Letter struct {
	ID  string   // the record's ID
	Job wire.Job // the job as dead-lettered; Job.PayloadRef is the record's
}

// Config is an Engine's dependencies. Fields marked optional may be nil.
type Config struct {
	Backend driver.Backend
	Codec   wire.Codec // opens the records that Unreferenced reads
	Enqueue *enqueue.Engine
	Status  *status.Tracker
	Log     *slog.Logger
	// Payloads keeps offloaded payloads. Optional.
	Payloads *payload.Payloads
}

// Engine redrives dead letters.
type Engine struct {
	cfg Config
}

// New returns an Engine.
func New(cfg Config) *Engine { return &Engine{cfg: cfg} }

// Chunk enqueues the letters' jobs on queue, counters reset, then deletes
// their records, and returns how many jobs it enqueued. The jobs go in at
// most two groups (see groups); each group's records are deleted as soon
// as its jobs are stored, so a failure leaves every record whose job was
// stored deleted, and every other record in place with its job not
// stored: a retried redrive enqueues no job twice. A record held or popped
// meanwhile stays (its job is a duplicate, logged).
func (e *Engine) Chunk(ctx context.Context, queue string, letters []Letter) (int, error) {
	jobs := make([]enqueue.Job, len(letters))
	var newRefs []payload.Key
	for i, l := range letters {
		j := enqueue.Job{Job: l.Job, Queue: queue}
		j.Failures, j.Crashes, j.Unhandled, j.Suspect = 0, 0, 0, false
		j.NotBefore = time.Time{}
		if !j.Deadline.IsZero() && !time.Now().Before(j.Deadline) {
			j.Deadline = time.Time{}
		}
		j.Copy++
		// The job gets a payload reference of its own, so the record and
		// the job never share one: whichever goes first cannot take the
		// other's.
		if l.Job.PayloadRef != "" && e.cfg.Payloads != nil {
			b, err := e.cfg.Payloads.Get(ctx, l.Job.ID, l.Job.PayloadRef)
			if err == nil {
				j.PayloadRef, err = e.cfg.Payloads.Put(ctx, j.ID, b)
			}
			if err != nil {
				e.cfg.Payloads.DropAll(ctx, newRefs)
				return 0, fmt.Errorf("asyncplatform: redriving job %s: copying its offloaded payload: %w", j.ID, err)
			}
			newRefs = append(newRefs, payload.Key{Job: j.ID, Ref: j.PayloadRef})
		}
		jobs[i] = j
	}
	done := 0
	for _, g := range e.groups(ctx, queue, jobs) {
		n, err := e.group(ctx, queue, letters, jobs, g)
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// group is the indexes of some of a chunk's letters, and whether their
// jobs' status is written though queue is not tracked here.
type group struct {
	idx   []int
	track bool
}

// groups splits a chunk's jobs by how their status is written: all in one
// group where queue is tracked here; else the jobs without a status record
// (untracked), then those with one (the workers track it: their waiting
// state is written, so that a status never says dead-lettered of a job
// waiting again).
func (e *Engine) groups(ctx context.Context, queue string, jobs []enqueue.Job) []group {
	all := make([]int, len(jobs))
	for i := range all {
		all[i] = i
	}
	if e.cfg.Status.Tracks(queue) {
		return []group{{idx: all}}
	}
	ids := make([]string, len(jobs))
	for i := range jobs {
		ids[i] = jobs[i].ID
	}
	recorded := e.cfg.Status.Recorded(ctx, ids)
	with, without := group{track: true}, group{}
	for _, i := range all {
		if recorded[jobs[i].ID] {
			with.idx = append(with.idx, i)
		} else {
			without.idx = append(without.idx, i)
		}
	}
	var out []group
	for _, g := range []group{without, with} {
		if len(g.idx) > 0 {
			out = append(out, g)
		}
	}
	return out
}

// group stores the jobs of g, then deletes their records, then drops the
// payloads the records alone pointed at.
func (e *Engine) group(ctx context.Context, queue string, letters []Letter, jobs []enqueue.Job, g group) (int, error) {
	js := make([]enqueue.Job, len(g.idx))
	ids := make([]string, len(g.idx))
	var oldRefs []payload.Key
	for k, i := range g.idx {
		js[k], ids[k] = jobs[i], letters[i].ID
		if ref := letters[i].Job.PayloadRef; ref != "" && e.cfg.Payloads != nil {
			oldRefs = append(oldRefs, payload.Key{Job: letters[i].Job.ID, Ref: ref})
		}
	}
	if err := e.cfg.Enqueue.Put(ctx, queue, js, false, g.track); err != nil {
		return 0, fmt.Errorf("asyncplatform: redriving %d jobs of queue %q (their records stay): %w", len(js), queue, err)
	}
	n, err := e.cfg.Backend.DeleteDead(ctx, queue, ids)
	if err != nil {
		return len(js), fmt.Errorf("asyncplatform: deleting %d redriven dead letters of queue %q (the jobs are enqueued; the records stay): %w", len(ids), queue, err)
	}
	if n < len(ids) {
		e.cfg.Log.WarnContext(ctx, "asyncplatform: some redriven dead letters were held or popped meanwhile; their jobs are enqueued and the held records stay",
			"queue", queue, "redriven", len(ids), "deleted", n)
		oldRefs = e.Unreferenced(ctx, queue, oldRefs)
	}
	e.cfg.Payloads.DropAll(ctx, oldRefs)
	return len(js), nil
}

// Unreferenced returns the refs no dead letter of queue points at; none
// when the records cannot be read (the payloads are then kept).
func (e *Engine) Unreferenced(ctx context.Context, queue string, refs []payload.Key) []payload.Key {
	still := map[string]bool{}
	for cursor := ""; ; {
		recs, next, err := e.cfg.Backend.ListDead(ctx, queue, cursor, 1000)
		if err != nil {
			return nil // cannot tell: keep them all
		}
		for _, r := range recs {
			still[e.payloadRef(r)] = true
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	var out []payload.Key
	for _, r := range refs {
		if !still[r.Ref] {
			out = append(out, r)
		}
	}
	return out
}

// payloadRef is the payload reference of a dead-letter record: empty for
// one that cannot be opened or decoded.
func (e *Engine) payloadRef(m driver.DeadMessage) string {
	body, err := e.cfg.Codec.Open(m.Body)
	if err != nil {
		return ""
	}
	var d wire.Dead
	if err := wire.DecodeDead(body, &d); err != nil || d.Raw != nil {
		return ""
	}
	return d.Job.PayloadRef
}
