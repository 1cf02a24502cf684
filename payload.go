package asyncplatform

import (
	"context"
	"fmt"

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
const DefaultOffloadThreshold = 16 << 20

// offload returns j itself when its payload stays in the message, or else
// a copy whose payload was moved to the store: when it is over the
// configured threshold or over what the backend carries (MaxPayload). A
// generous bound on the envelope's size spares most calls MaxPayload's
// probe encoding.
func (p *Platform) offload(ctx context.Context, j *Job) (*Job, error) {
	if p.payloads == nil || j.payloadRef != "" {
		return j, nil
	}
	t := DefaultOffloadThreshold
	if p.cfg.OffloadThreshold > 0 {
		t = p.cfg.OffloadThreshold
	}
	if len(j.Payload) <= t {
		bound := 256 + len(j.ID) + len(j.Type) + len(j.Payload)
		for k, v := range j.Headers {
			bound += len(k) + len(v) + 10
		}
		for _, e := range j.Errors {
			bound += len(e) + 5
		}
		if bound+p.codec.Overhead() <= p.codec.MaxBody-envelopeHeadroom {
			return j, nil
		}
	}
	if m := p.MaxPayload(*j); m >= 0 && m < t {
		t = m
	}
	if len(j.Payload) <= t {
		return j, nil
	}
	ref, err := p.payloads.Put(ctx, j.ID, j.Payload)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: offloading the %d-byte payload of job %s: %w", len(j.Payload), j.ID, err)
	}
	off := *j
	off.payloadRef = ref
	return &off, nil
}

// JobPayloadStore is a PayloadStore that also checks that a reference was
// made for the job that presents it, so a forged job cannot name another
// job's payload. The platform uses GetJob and DeleteJob when the store has
// them (dirstore does).
type JobPayloadStore interface {
	PayloadStore
	GetJob(ctx context.Context, jobID, ref string) ([]byte, error)
	DeleteJob(ctx context.Context, jobID, ref string) error
}
