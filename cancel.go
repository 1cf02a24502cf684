package asyncplatform

import (
	"context"

	"github.com/asyncplatform/asyncplatform/internal/status"
)

// ReasonCancelled: Platform.Cancel ended the job, before it ran or while it
// ran (its handler then returned an error). It is not retried; its dead
// letter can be inspected or redriven like any other.
const ReasonCancelled Reason = "cancelled"

// ErrJobCancelled is the error of a handler's context that Platform.Cancel
// ended: ctx.Err() is ErrJobCancelled, and it matches context.Canceled too.
var ErrJobCancelled = status.ErrCancelled

// ErrJobFinished is returned by Platform.Cancel for a job that has ended
// already (succeeded, dead-lettered or cancelled).
var ErrJobFinished = status.ErrFinished

// Cancel asks, from any process, for the job with the given ID to end. The
// job's queue must track status (Config.TrackStatus or
// QueueConfig.TrackStatus): Cancel marks its status. A job not yet running
// never runs: the worker that takes it dead-letters it with
// ReasonCancelled. A running job's handler context is cancelled (within
// about a second) with ErrJobCancelled, and when the handler then returns
// an error the job is dead-lettered with ReasonCancelled, never retried; a
// handler that returns nil anyway has succeeded.
//
// A job with no status gives an error matching ErrJobNotFound, a finished
// one ErrJobFinished. Cancelling a job twice is not an error. A status that
// other writers change on every one of the store's 16 tries in a row gives
// an error that says so (call again).
func (p *Platform) Cancel(ctx context.Context, id string) error {
	if p == nil || p.backend == nil {
		return ErrNotNew
	}
	return p.status.Cancel(ctx, id)
}
