package asyncplatform

import (
	"context"
	"errors"
	"fmt"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// ErrCannotBrowse is matched by the error of Platform.Jobs asked to read
// the broker (SourceBroker) of a backend that cannot list a queue's
// messages without consuming them (RabbitMQ): its jobs are listed from
// the status records only.
var ErrCannotBrowse = errors.New("the backend cannot list a queue's jobs without consuming them")

// browseState is the part of a queue on the broker that holds jobs in
// state s.
func browseState(s JobState) (driver.BrowseState, bool) {
	switch s {
	case StateWaiting:
		return driver.BrowseReady, true
	case StateScheduled, StateRetrying:
		return driver.BrowseScheduled, true
	case StateRunning:
		return driver.BrowseInFlight, true
	}
	return "", false
}

// browseJobs is Platform.Jobs read from the broker.
func (p *Platform) browseJobs(ctx context.Context, q JobsQuery) (JobsPage, error) {
	br, ok := p.backend.(driver.Browser)
	if !ok {
		return JobsPage{}, fmt.Errorf("asyncplatform: listing jobs from the broker: %w", ErrCannotBrowse)
	}
	if q.Queue == "" {
		return JobsPage{}, fmt.Errorf("%w: listing jobs from the broker needs a queue", ErrInvalidConfig)
	}
	if err := validQueue(q.Queue); err != nil {
		return JobsPage{}, err
	}
	state, ok := browseState(q.State)
	if !ok {
		return JobsPage{}, fmt.Errorf("%w: the broker holds jobs waiting, scheduled, retrying or running, not %q", ErrInvalidConfig, q.State)
	}
	if q.Limit < 0 || q.Limit > driver.MaxBrowseLimit {
		return JobsPage{}, fmt.Errorf("%w: jobs page limit %d is outside 0..%d", ErrInvalidConfig, q.Limit, driver.MaxBrowseLimit)
	}
	pg, err := br.Browse(ctx, q.Queue, state, q.Cursor, q.Limit)
	if errors.Is(err, driver.ErrBadCursor) {
		return JobsPage{}, fmt.Errorf("%w: %w", ErrBadCursor, err)
	}
	if err != nil {
		return JobsPage{}, fmt.Errorf("asyncplatform: listing the %s jobs of queue %q from the broker: %w", q.State, q.Queue, err)
	}
	out := JobsPage{Jobs: make([]JobStatus, 0, len(pg.Items)), Next: pg.Next, Scanned: len(pg.Items), Source: SourceBroker, Partial: pg.Partial}
	for i := range pg.Items {
		js, ok := p.browsedJob(q.Queue, state, &pg.Items[i])
		if !ok {
			out.Unreadable++
			continue
		}
		if (q.Type != "" && js.Type != q.Type) || (q.State != js.State && state == driver.BrowseScheduled) {
			continue
		}
		out.Jobs = append(out.Jobs, js)
	}
	return out, nil
}

// browsedJob decodes a message read off the broker with the bounded
// decoder; ok is false for one that is not a job of this platform's (or
// too large to have been read whole).
func (p *Platform) browsedJob(queue string, state driver.BrowseState, it *driver.BrowseItem) (JobStatus, bool) {
	if it.Body == nil || it.BodySize > driver.MaxBrowseBody {
		return JobStatus{}, false
	}
	body, err := p.codec.Open(it.Body)
	if err != nil {
		return JobStatus{}, false
	}
	var w wire.Job
	if err := wire.DecodeJob(body, &w, nil); err != nil {
		return JobStatus{}, false
	}
	js := JobStatus{
		ID: w.ID, Queue: queue, Type: w.Type,
		Tries: w.Failures + w.Crashes, Failures: w.Failures, Crashes: w.Crashes,
		EnqueuedAt: w.EnqueuedAt, Copy: w.Copy, Deliveries: it.Deliveries,
	}
	if n := len(w.Errors); n > 0 {
		js.Error = wire.CutUTF8(wire.FirstLine(w.Errors[n-1]), 1<<10)
	}
	switch state {
	case driver.BrowseReady:
		js.State = StateWaiting
	case driver.BrowseScheduled:
		js.State, js.RetryAt = StateScheduled, it.At
		if w.Failures > 0 {
			js.State = StateRetrying
		}
	default:
		js.State = StateRunning
	}
	return js, true
}
