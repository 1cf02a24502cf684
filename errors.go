package asyncplatform

import (
	"errors"
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/enqueue"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrNoDeadLetters is returned by NextDeadLetter when the dead-letter
	// queue has no record for this caller.
	ErrNoDeadLetters = driver.ErrNoDeadLetters

	// ErrPayloadTooLarge is returned by Enqueue when a job does not fit in a
	// backend message and no PayloadStore is configured.
	ErrPayloadTooLarge = enqueue.ErrTooLarge

	// ErrLeaseLost means a job was no longer held by this worker when its
	// outcome was reported: it will be delivered again, with the crash
	// counted.
	ErrLeaseLost = driver.ErrLeaseLost

	// ErrClosed is returned when the backend was closed.
	ErrClosed = driver.ErrClosed

	// ErrStopped is returned by Start after Stop: a Platform runs once.
	ErrStopped = errors.New("platform stopped")

	// ErrNotNew is returned by a Platform that New did not make (the zero
	// Platform{}).
	ErrNotNew = errors.New("the Platform was not made by New")

	// ErrNoSigningKey is returned by Redrive for signed dead letters it left
	// because the platform has no SigningKey (their jobs would be written
	// unsigned, and signed workers would refuse them).
	ErrNoSigningKey = errors.New("signed records need the SigningKey")

	// ErrInvalidConfig is wrapped by every configuration error from New,
	// Handle and Start.
	ErrInvalidConfig = errors.New("invalid configuration")

	// ErrInvalidJob is wrapped by every error Enqueue returns for a job it
	// refuses (no type, a bad queue name, an empty header key, ...).
	ErrInvalidJob = errors.New("invalid job")
)

// outcomeError is the shared shape of InvalidError, PermanentError and
// RejectError.
type outcomeError struct{ err error }

func (e outcomeError) Unwrap() error { return e.err }

func (e outcomeError) text(kind string) string {
	if e.err == nil {
		return kind
	}
	return kind + ": " + e.err.Error()
}

// InvalidError marks a job whose input cannot be used. See Invalid.
type InvalidError struct{ outcomeError }

func (e *InvalidError) Error() string { return e.text("invalid input") }

// PermanentError marks a failure that retrying cannot fix. See Permanent.
type PermanentError struct{ outcomeError }

func (e *PermanentError) Error() string { return e.text("permanent failure") }

// RejectError marks a transient refusal that is not the job's fault. See
// Reject.
type RejectError struct {
	outcomeError
	// Delay is how long the job waits before it is offered again; zero
	// means Config.RejectDelay.
	Delay time.Duration
}

func (e *RejectError) Error() string { return e.text("rejected") }

// Invalid tells the platform the job's input cannot be parsed or used: the job
// is dead-lettered at once with reason ReasonInvalid and never retried. The
// attempt counts as a failure.
func Invalid(err error) error { return &InvalidError{outcomeError{err}} }

// Permanent tells the platform retrying cannot help: the job is dead-lettered
// at once with reason ReasonPermanent. The attempt counts as a failure.
func Permanent(err error) error { return &PermanentError{outcomeError{err}} }

// Reject tells the platform the job could not run for a transient reason that
// is not its fault (a dependency is down): the job is requeued after
// Config.RejectDelay with its counters unchanged, as often as it takes, and
// the platform re-runs its health checks at once.
func Reject(err error) error { return &RejectError{outcomeError: outcomeError{err}} }

// RejectAfter is Reject with an explicit delay before the job is offered
// again.
func RejectAfter(err error, delay time.Duration) error {
	return &RejectError{outcomeError: outcomeError{err}, Delay: delay}
}

// PanicError is the failure recorded when a handler panics.
type PanicError struct {
	Value any    // what was passed to panic
	Stack []byte // the goroutine's stack at the panic
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// LimitError is returned by Enqueue for a job over one of Config's limits
// (MaxHeaders, MaxHeaderBytes); it matches ErrInvalidJob.
type LimitError struct {
	Limit string // the Config field
	Type  string // the job's type
	Got   int
	Max   int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%v: job of type %q is over Config.%s: %d, the limit is %d", ErrInvalidJob, e.Type, e.Limit, e.Got, e.Max)
}

// Is makes a LimitError match ErrInvalidJob.
func (e *LimitError) Is(target error) bool { return target == ErrInvalidJob }
