package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Harness opens backends for one test. Run makes a fresh Harness for every
// subtest and closes it at the end of the subtest.
type Harness interface {
	// MakeBackend returns a new, independent connection to the broker under
	// test, as a separate worker process would open. A test may call it
	// several times and close one backend to simulate the death of the
	// process that owned it: its unsettled deliveries must then come back
	// after their lease (or at once), with the crash counted.
	//
	// Every backend a Harness makes must see the same queues.
	MakeBackend(ctx context.Context) (driver.Backend, error)

	// Close releases what the harness holds. The suite closes every backend
	// it made before it calls Close. Queues are removed by the suite itself
	// when the backend implements driver.QueueDeleter.
	Close()
}

// Disconnecter is an optional Harness interface for backends whose leases
// last as long as their connection (RabbitMQ): it cuts the backend's
// connection to the broker without closing the backend, which must reconnect
// by itself. The suite then checks that receipts from before the cut are
// refused with driver.ErrLeaseLost. Backends without it must let a lease
// lapse when it is not extended; the suite waits for that instead.
type Disconnecter interface {
	Disconnect(ctx context.Context, b driver.Backend) error
}

// HarnessMaker makes a Harness for one subtest.
type HarnessMaker func(ctx context.Context, t *testing.T) (Harness, error)

// Options tune the suite for a backend. The zero value is good for fast
// backends.
//
// On a slow or shared machine, the environment variable
// ASYNCPLATFORM_CONFORMANCE_SCALE (a number from 1 to 100, 1 when unset)
// multiplies Lease, Wait and the suite's own short delays. The suite also
// watches for stalls of the test process itself (a loaded machine, not the
// backend): when a lease may have lapsed because the process was not
// running, Lease/ExtendedForSlowHandler runs again with a lease twice as
// long, the cases that count deliveries log a duplicate instead of failing,
// and a time-out says how long the process stalled.
type Options struct {
	// Lease is the lease the suite's platforms use (Config.Lease). It is
	// raised to the backend's Capabilities.MinLease. A case that waits for
	// a lease to lapse takes about this long, and
	// Lease/ExtendedForSlowHandler runs a handler for ten of them. Defaults
	// to 500ms.
	Lease time.Duration

	// Wait bounds how long one case waits for an outcome before it fails.
	// Defaults to 20s.
	Wait time.Duration

	// CaseDeadline bounds how long one case may run in all. A case still
	// running then has stalled (a backend that breaks a rule can leave the
	// platform waiting for ever): it fails, naming the case, with the
	// stacks of the goroutines it started (what each was waiting for); its
	// backends are closed, and the rest of the report prints. Defaults to
	// 4 Waits plus 60 Leases (110s with the defaults).
	CaseDeadline time.Duration

	// DuplicatesWithoutFaults, when non-empty, says why the broker under test
	// can deliver a message twice even when no fault is injected (an
	// emulator's known race, for example). Delivery/ExactlyOnceWithoutFaults
	// then still requires every job to be done, and logs the duplicates with
	// this reason instead of failing on them. Real brokers leave it empty.
	DuplicatesWithoutFaults string

	// Unordered, when non-empty, says why the broker does not keep a
	// queue's jobs in the order they were enqueued (Azure Queue Storage
	// promises no FIFO order): cases that check the order the platform
	// keeps where the broker does (Flow/PauseGroup's resumed jobs) then
	// check only that every job ran once, with the reason in the log.
	// Brokers with FIFO queues leave it empty.
	Unordered string

	// SingleProcess, when non-empty, says why the backend's queues cannot be
	// shared by two processes (the memory backend lives in one). The cases
	// that run child processes (RunsChild) are then skipped with that
	// reason in the log; every other backend must leave it empty.
	SingleProcess string

	// KnownDefects names cases (as Cases lists them) the backend is known to
	// fail, each with the defect and where it is tracked. Such a case is
	// skipped with that text in the log, so the defect stays visible until
	// it is fixed and the entry removed. It is for a backend's own
	// maintainers while a fix is under way, never a way to claim
	// conformance: a backend with entries here does not conform.
	KnownDefects map[string]string

	// FanIn is the number of parents of Workflow/FanIn, and FanInWhy why
	// it is below the default of 1,000 (required when it is). It is for a
	// server whose every operation slows with the number of messages it
	// holds, where a thousand waiting steps slow the package's other
	// cases; the case still proves one join from many parents. Zero means
	// 1,000.
	FanIn    int
	FanInWhy string
}
