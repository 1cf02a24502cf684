// Package decide is the outcome table: one pure function that decides what
// becomes of a delivery, before its handler runs (the gate) and after (the
// verdict). It knows nothing of brokers, encodings or goroutines; the
// platform classifies the handler's error, calls Decide, and settles the
// delivery as told. Every row of the README's failure-semantics table is a
// case of Decide, and its table test has one row per README row.
package decide

import (
	"fmt"
	"strconv"
	"time"
)

// Outcome is what becomes of a delivery.
type Outcome int

// The outcomes.
const (
	// Run: the gate let the delivery through; call its handler.
	Run Outcome = iota
	// Succeeded: acknowledge it.
	Succeeded
	// Retried: a failure within the retry limit; write the next copy,
	// Failures + 1, due at RetryAt.
	Retried
	// Rejected: Reject; write the next copy uncounted, due at RetryAt.
	Rejected
	// HandedBack: the platform is stopping; write the next copy uncounted,
	// due now.
	HandedBack
	// Requeued: no handler is registered for its type; write the next copy
	// with Unhandled + 1, due at RetryAt.
	Requeued
	// DeadLettered: move it to the dead-letter queue, for Reason.
	DeadLettered
	// Deferred: it may not run yet (over its type's limit, or its group's
	// pause could not be read); write the next copy uncounted, due at
	// RetryAt.
	Deferred
	// Parked: its group is paused; set it aside, as it is, on the group's
	// held queue.
	Parked
)

var outcomeNames = [...]string{"run", "succeeded", "retried", "rejected", "handed_back", "requeued", "dead_lettered", "deferred", "parked"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Reason says why a delivery is dead-lettered; the values are the root
// package's Reason values.
type Reason string

// The dead-letter reasons decided here.
const (
	RetriesExceeded Reason = "retries_exceeded"
	Invalid         Reason = "invalid"
	Permanent       Reason = "permanent"
	Poisoned        Reason = "poisoned"
	Unhandled       Reason = "unhandled"
	Expired         Reason = "expired"
	PayloadMissing  Reason = "payload_missing"
	Cancelled       Reason = "cancelled"
	DepFailed       Reason = "dependency_failed"
)

// Result is the handler's result, as the platform classified its error.
type Result int

// The results.
const (
	// NotRun: the handler has not run yet; Decide is the gate.
	NotRun Result = iota
	// OK: it returned nil.
	OK
	// Failed: it returned an ordinary error, panicked or timed out.
	Failed
	// InvalidInput: it returned Invalid.
	InvalidInput
	// PermanentFailure: it returned Permanent.
	PermanentFailure
	// Rejection: it returned Reject (or the payload store could not be
	// reached, which is not the job's fault either).
	Rejection
	// PayloadGone: the job's offloaded payload is gone from the store; the
	// handler cannot run.
	PayloadGone
	// DependencyFailed: a workflow step whose dependency failed for good
	// (the handler did not run): dead-lettered uncounted.
	DependencyFailed
	// CancelledRun: a workflow step whose workflow was cancelled while it
	// ran, and whose handler returned an error: dead-lettered uncounted.
	CancelledRun
)

// Group is what a worker knows of the pause of a job's group.
type Group int

// The group states.
const (
	// GroupOpen: the job has no group, or its group is not paused.
	GroupOpen Group = iota
	// GroupPaused: its group is paused.
	GroupPaused
	// GroupUnknown: its group may be paused, and the pause could not be
	// read.
	GroupUnknown
)

// Policy is a resolved policy: every field set.
type Policy struct {
	RetryLimit  int
	PoisonLimit int
	BackoffBase time.Duration
	BackoffCap  time.Duration
	Timeout     time.Duration // negative: none
}

// Input is everything the decision depends on.
type Input struct {
	// The job's counters as delivered: Crashes includes the deliveries of
	// this copy that ended with no outcome.
	Failures, Crashes, Unhandled int

	Type       string    // the job's type, for the texts
	Deadline   time.Time // zero: none
	HasHandler bool
	Policy     Policy

	UnhandledRetries int           // requeues allowed for want of a handler
	UnhandledDelay   time.Duration // between them
	RejectDelay      time.Duration // Config.RejectDelay

	Group     Group         // the pause of the job's group
	GroupPoll time.Duration // when Group is GroupUnknown: come again after this

	// OverLimit: admission refused the job (a type's concurrency or rate
	// limit). LimitWait is the limit's own wait (a rate's answer); zero
	// means about LimitDelay (±50 %).
	OverLimit             bool
	LimitWait, LimitDelay time.Duration

	Result Result
	// RejectAfter is the Reject's own delay; zero means RejectDelay.
	RejectAfter time.Duration
	// Stopping: the platform is stopping (its shutdown cancelled the
	// handler, or a job over its limit is handed back rather than
	// deferred).
	Stopping bool
	// Cancelled: Platform.Cancel asked for the job to end (before it ran,
	// or while it ran).
	Cancelled bool

	Now time.Time
	// Jitter, in [0, 1], places a retry within its backoff window
	// (exponential backoff with full jitter), and a deferred job's wait
	// within its spread (see limitWait).
	Jitter float64
}

// Decision is what to do.
type Decision struct {
	Outcome Outcome
	Reason  Reason    // for DeadLettered
	RetryAt time.Time // for Retried, Rejected, Requeued and Deferred
	// The next copy's counters (and the dead letter's).
	Failures, Crashes, Unhandled int
	// Why explains a dead letter the gate decided (there is no handler
	// error to show).
	Why string
}

// Decide decides. Before the handler runs (Result NotRun), in this order: a
// job of a paused group is parked (deferred when the pause could not be
// read), a cancelled job is dead-lettered, a passed deadline expires the
// job, crashes beyond the poison limit poison it, a missing handler
// requeues it until UnhandledRetries are spent, and a job over its type's
// limit is deferred (handed back when the platform is stopping); else the
// handler runs. The limit is asked only once
// the rest of the gate said Run, and then Decide is asked again with
// OverLimit set. Jitter spreads a deferred job's wait. After it ran: nil succeeds; a cancelled job whose
// handler returned an error is dead-lettered uncounted; a shutdown hands the job back
// uncounted; Reject requeues it uncounted; a payload gone from the store
// dead-letters it uncounted; Invalid and Permanent dead-letter
// it at once; any other failure is retried with backoff until the failures
// pass the retry limit. Every failure counts; nothing else does.
func Decide(in Input) Decision {
	d := Decision{Failures: in.Failures, Crashes: in.Crashes, Unhandled: in.Unhandled}
	if in.Result == NotRun {
		switch {
		case in.Group == GroupPaused:
			d.Outcome = Parked
		case in.Group == GroupUnknown:
			d.Outcome, d.RetryAt = Deferred, in.Now.Add(in.GroupPoll)
		case in.Cancelled:
			d.Outcome, d.Reason = DeadLettered, Cancelled
			d.Why = "cancelled (Platform.Cancel) before it ran"
		case !in.Deadline.IsZero() && !in.Now.Before(in.Deadline):
			d.Outcome, d.Reason = DeadLettered, Expired
			d.Why = fmt.Sprintf("deadline %s passed before the job could run", in.Deadline.Format(time.RFC3339Nano))
		case in.Crashes > in.Policy.PoisonLimit:
			d.Outcome, d.Reason = DeadLettered, Poisoned
			d.Why = fmt.Sprintf("the job's worker crashed or lost it %s; the poison limit is %d", times(in.Crashes), in.Policy.PoisonLimit)
		case !in.HasHandler && in.Unhandled < in.UnhandledRetries:
			d.Outcome, d.RetryAt = Requeued, in.Now.Add(in.UnhandledDelay)
			d.Unhandled++
		case !in.HasHandler:
			d.Outcome, d.Reason = DeadLettered, Unhandled
			d.Why = fmt.Sprintf("no handler registered for job type %q after %d requeues", in.Type, in.Unhandled)
		case in.OverLimit && in.Stopping:
			d.Outcome = HandedBack
		case in.OverLimit:
			d.Outcome, d.RetryAt = Deferred, in.Now.Add(limitWait(in))
		default:
			d.Outcome = Run
		}
		return d
	}
	switch in.Result {
	case OK:
		d.Outcome = Succeeded
		return d
	case PayloadGone:
		d.Outcome, d.Reason = DeadLettered, PayloadMissing
		return d
	case DependencyFailed:
		d.Outcome, d.Reason = DeadLettered, DepFailed
		return d
	case CancelledRun:
		d.Outcome, d.Reason = DeadLettered, Cancelled
		return d
	}
	if in.Cancelled { // its handler returned an error after Cancel: never retried
		d.Outcome, d.Reason = DeadLettered, Cancelled
		return d
	}
	if in.Stopping {
		d.Outcome = HandedBack
		return d
	}
	if in.Result == Rejection {
		delay := in.RejectAfter
		if delay <= 0 {
			delay = in.RejectDelay
		}
		d.Outcome, d.RetryAt = Rejected, in.Now.Add(delay)
		return d
	}
	d.Failures++
	switch {
	case in.Result == InvalidInput:
		d.Outcome, d.Reason = DeadLettered, Invalid
	case in.Result == PermanentFailure:
		d.Outcome, d.Reason = DeadLettered, Permanent
	case d.Failures > in.Policy.RetryLimit:
		d.Outcome, d.Reason = DeadLettered, RetriesExceeded
	default:
		d.Outcome, d.RetryAt = Retried, in.Now.Add(Backoff(in.Policy, d.Failures, in.Jitter))
	}
	return d
}

// limitWait is how long a job over its type's limit waits: the limit's
// own wait plus up to half LimitDelay, or LimitDelay ±50 %, so the jobs it
// refused do not all come back at once.
func limitWait(in Input) time.Duration {
	j := min(max(in.Jitter, 0), 1)
	if in.LimitWait > 0 {
		return in.LimitWait + time.Duration(j*float64(in.LimitDelay/2))
	}
	return in.LimitDelay/2 + time.Duration(j*float64(in.LimitDelay))
}

// Backoff is the delay before the retry after the given number of failures:
// jitter times min(BackoffCap, BackoffBase·2^(failures-1)).
func Backoff(p Policy, failures int, jitter float64) time.Duration {
	d := min(p.BackoffBase, p.BackoffCap)
	for i := 1; i < failures && d < p.BackoffCap; i++ {
		if d > p.BackoffCap/2 {
			d = p.BackoffCap
			break
		}
		d *= 2
	}
	if d <= 0 {
		return 0
	}
	v := float64(d) * min(max(jitter, 0), 1)
	if v >= float64(d) { // also keeps a huge d from overflowing
		return d
	}
	return time.Duration(v)
}

// times says how many times: "once", "twice", "3 times".
func times(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return strconv.Itoa(n) + " times"
}
