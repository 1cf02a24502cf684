// Package payload keeps the payloads too large for a backend's messages in
// the user's PayloadStore: it stores them at Enqueue, fetches them before
// the handler runs, and deletes them once nothing points at them.
package payload

import (
	"context"
	"errors"
	"log/slog"
)

// ErrNotFound is matched by the error of Get for a reference the store does
// not hold.
var ErrNotFound = errors.New("payload not found in the store")

// Store is a PayloadStore: the methods of asyncplatform.PayloadStore.
type Store interface {
	Put(ctx context.Context, jobID string, payload []byte) (ref string, err error)
	Get(ctx context.Context, ref string) ([]byte, error)
	Delete(ctx context.Context, ref string) error
}

// JobStore is a Store that checks that a reference was made for the job
// that presents it (asyncplatform.JobPayloadStore); Get and Drop use its
// methods when the store has them.
type JobStore interface {
	Store
	GetJob(ctx context.Context, jobID, ref string) ([]byte, error)
	DeleteJob(ctx context.Context, jobID, ref string) error
}

// Key names an offloaded payload: its job and its reference.
type Key struct{ Job, Ref string }

// Payloads is the PayloadStore of a platform.
type Payloads struct {
	store Store
	log   *slog.Logger
}

// New returns the Payloads over store, logging to log; nil when store is
// nil (no payload is offloaded).
func New(store Store, log *slog.Logger) *Payloads {
	if store == nil {
		return nil
	}
	return &Payloads{store: store, log: log}
}

// Put stores the payload of job jobID and returns its reference.
func (p *Payloads) Put(ctx context.Context, jobID string, payload []byte) (string, error) {
	return p.store.Put(ctx, jobID, payload)
}

// Get fetches the payload of job jobID's reference; an error matching
// ErrNotFound when it is gone.
func (p *Payloads) Get(ctx context.Context, jobID, ref string) ([]byte, error) {
	if s, ok := p.store.(JobStore); ok {
		return s.GetJob(ctx, jobID, ref)
	}
	return p.store.Get(ctx, ref)
}

// Gone is the error Get's error matches when the payload is gone.
func (p *Payloads) Gone() error { return ErrNotFound }

// Drop deletes a payload nothing points at any more; a failure leaks it,
// so it is logged. It does nothing for an empty reference.
func (p *Payloads) Drop(ctx context.Context, jobID, ref string) {
	if p == nil || ref == "" {
		return
	}
	var err error
	if s, ok := p.store.(JobStore); ok {
		err = s.DeleteJob(ctx, jobID, ref)
	} else {
		err = p.store.Delete(ctx, ref)
	}
	if err != nil {
		p.log.WarnContext(ctx, "asyncplatform: deleting an offloaded payload failed; it stays in the store", "ref", ref, "error", err)
	}
}

// DropAll drops every payload of keys.
func (p *Payloads) DropAll(ctx context.Context, keys []Key) {
	for _, k := range keys {
		p.Drop(ctx, k.Job, k.Ref)
	}
}
