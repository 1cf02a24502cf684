package driver

import (
	"context"
	"errors"
	"fmt"
)

// ClaimingEnqueuer is an optional interface of a Backend that is its own
// Store (StoreOf returns the Backend): Enqueue where each message may come
// with a Create of one store key, done with the message's store in one
// atomic step (one script, one lock), so that a unique job's claim costs no
// round trip of its own. The platform decides every claim (its key, value
// and TTL); the backend only creates and stores.
//
// For each message with a Claim: when the claim's key is absent or
// expired, the key is created (as Store.Create would, at a new revision)
// and the message stored; when it is present, neither happens, and the
// message's result has Err ErrKeyExists and Value the stored value (the
// holder's). A message without a Claim is stored as Enqueue stores it.
// Claim keys of one call are distinct (the platform checks it), at most
// MaxBatch messages a call.
//
// It returns one result a message, in order. A call that returns an error
// may have stored any subset of its messages and created any subset of
// their keys, as Enqueue and CreateEach may; its results are then nil.
//
// ClaimsWithEnqueue reports whether the backend, as configured, can claim
// with its enqueue (false: its store's keys live on other nodes than its
// queues', say); it must not block, and its answer never changes. The
// platform asks once, and without it creates claims with CreateEach before
// Enqueue.
type ClaimingEnqueuer interface {
	ClaimsWithEnqueue() bool
	EnqueueClaiming(ctx context.Context, queue string, msgs []ClaimMessage) ([]ClaimResult, error)
}

// ClaimMessage is one message of EnqueueClaiming.
type ClaimMessage struct {
	Message

	// Claim, when not nil, is the store key (Key, Value, TTL; TTL positive)
	// that must be created for the message to be stored.
	Claim *BatchItem
}

// ClaimResult is the result of one message of EnqueueClaiming.
type ClaimResult struct {
	Err   error  // nil: stored (and its claim created); ErrKeyExists: neither
	Value []byte // with ErrKeyExists: the value that holds the key
}

// EnqueueClaiming calls c's EnqueueClaiming after checking the call (claim
// keys distinct, at most MaxBatch messages, positive TTLs), and checks its
// answer: one result a message, each Err nil or ErrKeyExists.
func EnqueueClaiming(ctx context.Context, c ClaimingEnqueuer, queue string, msgs []ClaimMessage) ([]ClaimResult, error) {
	if len(msgs) > MaxBatch {
		return nil, fmt.Errorf("claiming enqueue of %d messages, the limit is %d", len(msgs), MaxBatch)
	}
	seen := make(map[string]bool, len(msgs))
	for i, m := range msgs {
		if m.Claim == nil {
			continue
		}
		if seen[m.Claim.Key] {
			return nil, fmt.Errorf("claiming enqueue has the key %q twice", m.Claim.Key)
		}
		if m.Claim.TTL <= 0 {
			return nil, fmt.Errorf("claiming enqueue message %d: key %q has TTL %v, want a positive one", i, m.Claim.Key, m.Claim.TTL)
		}
		seen[m.Claim.Key] = true
	}
	rs, err := c.EnqueueClaiming(ctx, queue, msgs)
	if err != nil {
		return nil, err
	}
	if len(rs) != len(msgs) {
		return nil, fmt.Errorf("claiming enqueue of %d messages answered %d results", len(msgs), len(rs))
	}
	for i, r := range rs {
		if r.Err != nil && !errors.Is(r.Err, ErrKeyExists) {
			return nil, fmt.Errorf("claiming enqueue message %d: %w", i, r.Err)
		}
		if r.Err != nil && msgs[i].Claim == nil {
			return nil, fmt.Errorf("claiming enqueue message %d: refused without a claim", i)
		}
	}
	return rs, nil
}
