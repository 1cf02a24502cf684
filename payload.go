package asyncplatform

import (
	"context"
	"errors"
	"fmt"
)

// ErrPayloadNotFound is returned by a PayloadStore's Get for a reference it
// does not hold.
var ErrPayloadNotFound = errors.New("payload not found in the store")

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

// offloadThreshold is the size above which j's payload goes to the store.
func (p *Platform) offloadThreshold(j *Job) int {
	t := DefaultOffloadThreshold
	if p.cfg.OffloadThreshold > 0 {
		t = p.cfg.OffloadThreshold
	}
	if m := p.MaxPayload(*j); m >= 0 && m < t {
		t = m
	}
	return t
}

// surelyKept reports, without encoding j, that its payload stays in the
// message: under the configured threshold and, by a generous bound on the
// envelope's size, within what the backend carries. It spares most Enqueue
// calls the probe encoding that offloadThreshold needs.
func (p *Platform) surelyKept(j *Job) bool {
	t := DefaultOffloadThreshold
	if p.cfg.OffloadThreshold > 0 {
		t = p.cfg.OffloadThreshold
	}
	if len(j.Payload) > t {
		return false
	}
	bound := 256 + len(j.ID) + len(j.Type) + len(j.Payload)
	for k, v := range j.Headers {
		bound += len(k) + len(v) + 10
	}
	for _, e := range j.Errors {
		bound += len(e) + 5
	}
	return bound+p.codec.Overhead() <= p.codec.MaxBody-envelopeHeadroom
}

// offload returns j itself when its payload fits in the message, or else a
// copy whose payload was moved to the store.
func (p *Platform) offload(ctx context.Context, j *Job) (*Job, error) {
	if p.cfg.PayloadStore == nil || j.payloadRef != "" || p.surelyKept(j) || len(j.Payload) <= p.offloadThreshold(j) {
		return j, nil
	}
	ref, err := p.cfg.PayloadStore.Put(ctx, j.ID, j.Payload)
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

// payloadKey names an offloaded payload: its job and its reference.
type payloadKey struct{ job, ref string }

// getPayload fetches the payload of a job's reference.
func (p *Platform) getPayload(ctx context.Context, jobID, ref string) ([]byte, error) {
	if s, ok := p.cfg.PayloadStore.(JobPayloadStore); ok {
		return s.GetJob(ctx, jobID, ref)
	}
	return p.cfg.PayloadStore.Get(ctx, ref)
}

// dropPayload deletes a payload nothing points at any more; a failure leaks
// it, so it is logged.
func (p *Platform) dropPayload(ctx context.Context, jobID, ref string) {
	if ref == "" || p.cfg.PayloadStore == nil {
		return
	}
	var err error
	if s, ok := p.cfg.PayloadStore.(JobPayloadStore); ok {
		err = s.DeleteJob(ctx, jobID, ref)
	} else {
		err = p.cfg.PayloadStore.Delete(ctx, ref)
	}
	if err != nil {
		p.log.WarnContext(ctx, "asyncplatform: deleting an offloaded payload failed; it stays in the store", "ref", ref, "error", err)
	}
}

func (p *Platform) dropPayloads(ctx context.Context, keys []payloadKey) {
	for _, k := range keys {
		p.dropPayload(ctx, k.job, k.ref)
	}
}
