package asyncplatform

import (
	"context"

	"github.com/asyncplatform/asyncplatform/internal/enqueue"
	"github.com/asyncplatform/asyncplatform/internal/payload"
)

// ErrPayloadNotFound is returned by a PayloadStore's Get for a reference it
// does not hold.
var ErrPayloadNotFound = payload.ErrNotFound

// PayloadStore keeps payloads too large for the backend's messages: the
// platform stores the payload, sends a reference with the job (a claim
// check), and fetches the payload back before the handler runs. The handler
// sees the same bytes either way.
//
// Implementations must be safe for concurrent use, and Put must be durable
// before it returns (the job that points at it is acknowledged to the caller
// of Enqueue right after).
type PayloadStore interface {
	// Put stores the payload of the job with the given ID and returns a
	// reference to it.
	Put(ctx context.Context, jobID string, payload []byte) (ref string, err error)

	// Get returns the payload a reference points at, or an error wrapping
	// ErrPayloadNotFound when it is gone.
	Get(ctx context.Context, ref string) ([]byte, error)

	// Delete removes a payload. Deleting one that is gone is not an error.
	Delete(ctx context.Context, ref string) error
}

// DefaultOffloadThreshold is the largest payload kept in the message when a
// PayloadStore is configured and the backend itself carries more.
const DefaultOffloadThreshold = enqueue.DefaultOffloadThreshold

// JobPayloadStore is a PayloadStore that also checks that a reference was
// made for the job that presents it, so a forged job cannot name another
// job's payload. The platform uses GetJob and DeleteJob when the store has
// them (dirstore does).
type JobPayloadStore interface {
	PayloadStore
	GetJob(ctx context.Context, jobID, ref string) ([]byte, error)
	DeleteJob(ctx context.Context, jobID, ref string) error
}
