package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// ErrHeld is returned by Source.TakeOutbox when another relay holds the
// queue's lease.
var ErrHeld = errors.New("outbox: the queue is held by another relay")

// Row is one job read from an outbox, in the order of Seq.
type Row struct {
	// Seq orders the rows of a queue: the order they were committed in.
	Seq int64
	// Msg is the message as the platform wrote it: its ID, Dedupe and
	// Body are published unchanged, and its NotBefore as the outbox
	// stores it (a whole microsecond on PostgreSQL, a millisecond on
	// SQLite, rounded up: never before the NotBefore enqueued).
	Msg driver.Message
	// Err, when set, is a *BadRowError: the row cannot be published and
	// is moved aside.
	Err error
}

// BadRowError names what is wrong with an outbox row that the relay
// cannot publish (a body or an ID past its bound, a body past the
// target's Capabilities.MaxBody, a queue name the platform would not
// write). The relay moves such a row to the outbox's
// aside table, so it never holds up the rows after it.
type BadRowError struct {
	Queue  string
	Seq    int64
	Reason string
}

func (e *BadRowError) Error() string {
	return fmt.Sprintf("outbox: row %d of queue %q: %s", e.Seq, e.Queue, e.Reason)
}

// Source is an outbox a Relay reads: implemented by the PostgreSQL and
// SQLite backends (postgres.Backend, sqlite.Backend).
type Source interface {
	// OutboxQueues returns the names of the queues with rows waiting, as
	// stored (a name may be one the platform would refuse: the relay
	// checks it), at most MaxQueues of them, each cut one byte (or
	// character) past driver.MaxQueueLen: the table is untrusted.
	OutboxQueues(ctx context.Context) ([]string, error)

	// TakeOutbox leases the queue's rows to the caller until Release, or
	// until ttl passes without a call of the Lease (a source whose lease
	// ends with its connection may ignore ttl). It returns ErrHeld
	// (wrapped) when another relay holds the lease.
	TakeOutbox(ctx context.Context, queue string, ttl time.Duration) (Lease, error)
}

// Lease is one relay's hold of one queue's outbox rows.
type Lease interface {
	// Next returns up to max rows of the queue in Seq order, from the
	// first not yet deleted. Its decoding is bounded: a row past the
	// bounds comes back with Err set.
	Next(ctx context.Context, max int) ([]Row, error)

	// Delete removes the rows seqs (rows Next returned), only while the
	// lease is held; otherwise it returns driver.ErrLeaseLost (wrapped)
	// and removes nothing. It removes those rows only: a row of a
	// transaction that committed after Next, with a smaller Seq, stays.
	Delete(ctx context.Context, seqs []int64) error

	// Aside moves row seq to the outbox's aside table with the reason,
	// only while the lease is held (driver.ErrLeaseLost otherwise).
	Aside(ctx context.Context, seq int64, reason string) error

	// Release lets the lease go. It is idempotent.
	Release(ctx context.Context) error
}
