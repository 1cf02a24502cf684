// Package driver defines the interface a backend implements to carry
// asyncplatform jobs.
//
// The portable type, asyncplatform.Platform, owns every decision of the
// behaviour contract: how an outcome is classified, retry and poison limits and
// their precedence, backoff, the poison check before the handler, the renewal
// of leases and of dead-letter holds, and the shutdown hand-back. A backend
// offers only the atomic primitives below and never invents semantics of its
// own. In particular a backend never decodes a message body: bodies are opaque
// bytes encoded by the platform, and a backend may wrap them in framing of its
// own (a base counter, for example) as long as Receive hands back exactly the
// bytes it was given.
//
// # Delivery counting
//
// The platform derives crashes (deliveries that ended with no outcome) from one
// number per delivery: [Delivery.Deliveries], the number of times this copy of
// the message has been handed out, the current time included. It is 1 on the
// first delivery of a copy. Every outcome other than Ack replaces the copy
// (Requeue, DeadLetter), so any earlier delivery of the same copy is one that
// ended without an outcome. A backend keeps the count in one of two ways:
//
//  1. counted at claim time, atomically with the claim (Redis Lua, memory);
//  2. the broker's own delivery counter minus a base carried in the message
//     (RabbitMQ quorum x-delivery-count, JetStream NumDelivered, Azure
//     DequeueCount).
//
// # Queue names
//
// A queue name is 1 to MaxQueueLen bytes of [A-Za-z0-9._-], and CheckQueue is
// the one place that says so. The portable layer validates every queue name
// with it before calling a backend; a backend assumes valid input and never
// validates names itself (it maps them to names its broker accepts).
//
// # Concurrency
//
// Every method may be called from several goroutines at once, but the platform
// never calls two methods on the same *Delivery concurrently, and never calls
// one after a settling call (Ack, Requeue, DeadLetter) on it returned nil; the
// same holds for a *DeadDelivery (ExtendDead, then SettleDead).
//
// # Errors
//
// Methods return the backend's raw errors, wrapped with %w where context helps,
// and the sentinels of this package where they apply; the platform wraps once
// more for the user. A method must not retry on its own beyond what its own
// protocol needs (a reconnect, a publish that was never confirmed).
package driver

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors a backend returns; match them with errors.Is.
var (
	// ErrLeaseLost is returned by Ack, Extend, Requeue and DeadLetter when the
	// delivery they were given is no longer held: its lease expired, its
	// connection or channel is gone, or the job was delivered again since. A
	// backend must never act on a newer delivery of the same job.
	// ExtendDead and SettleDead return it likewise for a dead letter that
	// is no longer held.
	ErrLeaseLost = errors.New("lease lost")

	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("backend closed")

	// ErrNoDeadLetters is returned by NextDead when no dead letter is
	// available to this caller.
	ErrNoDeadLetters = errors.New("no dead letters")

	// ErrTooLarge is returned by Enqueue when a message body exceeds
	// Capabilities.MaxBody.
	ErrTooLarge = errors.New("message too large")
)

// Message is one message to store.
type Message struct {
	// ID identifies this copy of the message: the job's ID on its first
	// enqueue, and a new value (the job ID with a copy number) for every
	// copy written by Requeue or a redrive. A retried publish of the same
	// copy keeps the same ID. A backend that deduplicates publishes keys
	// them by Dedupe, and by ID only when Dedupe is empty. Others may
	// ignore it.
	ID string

	// Dedupe, set by the platform when the backend reports
	// Capabilities.Deduplicates, is the key a deduplicating backend stores
	// this copy under (JetStream Nats-Msg-Id, for example): the same for
	// every publish of the same copy, by any worker, and one that a writer
	// to the broker cannot compute without reading the message that led to
	// it (the job's copy before, or the Enqueue that made it), so it cannot
	// publish ahead of a copy and have the real one dropped. Empty for a
	// message whose job carries no enqueue nonce (written by an earlier
	// version): the backend then keys it by ID.
	Dedupe string

	// Body is the opaque message, encoded by the platform.
	Body []byte

	// NotBefore, when non-zero, is the earliest time the message may be
	// delivered. A message must never be delivered before it; it should be
	// delivered soon after it (within a second or so).
	NotBefore time.Time
}

// Delivery is one hand-out of a message to this worker.
type Delivery struct {
	// Queue is the queue the message was received from.
	Queue string

	// Body is exactly the Message.Body that was stored.
	Body []byte

	// Deliveries is the number of times this copy of the message has been
	// handed out, this time included: 1 on its first delivery. See the
	// package documentation.
	Deliveries int

	// Handle is the backend's own receipt for this delivery (a lease token,
	// a delivery tag with its channel generation, a pop receipt). The
	// platform never looks at it. A backend may replace it, for example to
	// keep a new pop receipt after Extend.
	Handle any
}

// DeadMessage is a dead-letter record to store.
type DeadMessage struct {
	// ID identifies the record: the Message.ID of the copy that was
	// dead-lettered, so a job dead-lettered again after a redrive gets a new
	// one. Several records may share an ID only as duplicates of one another
	// (a crash between the dead-letter write and the settle leaves a
	// duplicate, never a loss).
	ID string

	// Body is the record, encoded by the platform.
	Body []byte
}

// DeadDelivery is a dead letter held by one NextDead caller.
type DeadDelivery struct {
	DeadMessage

	// Handle is the backend's receipt, as in Delivery.
	Handle any
}

// DeliveryKey is the context key under which the platform puts, in every
// handler's context, the *Delivery the handler runs; DeliveryFrom reads it.
type DeliveryKey struct{}

// DeliveryFrom returns the delivery whose handler runs under ctx, or nil
// outside a handler. A backend's own API uses it to act on that delivery
// from inside the handler (postgres.Backend.CompleteTx, a completion in the
// handler's own transaction). It only reads the delivery: the platform goes
// on calling the backend's methods on it meanwhile (Extend), and settles
// it after the handler returns.
func DeliveryFrom(ctx context.Context) *Delivery {
	d, _ := ctx.Value(DeliveryKey{}).(*Delivery)
	return d
}

// Stats are the depths of one queue. A backend that cannot tell one of the
// numbers sets it to -1.
type Stats struct {
	Ready     int64 // deliverable now
	Scheduled int64 // waiting for NotBefore (including retries in backoff)
	InFlight  int64 // handed out and not yet settled
	Dead      int64 // in the queue's dead-letter queue

	// OldestReady is when the ready job that has waited longest became
	// deliverable: it was enqueued, it came due (NotBefore, a retry's
	// backoff), or its lease ran out. Zero when Ready is 0, and when the
	// backend cannot tell (the platform then reports the age as unknown).
	// A backend that keeps its ready jobs in line may report the first in
	// line: a job promoted late (at a claim) may have waited longer.
	OldestReady time.Time
}

// Capabilities describe what a backend can carry. The platform uses them to
// validate input before it reaches the broker, and the conformance suite uses
// them to adapt its cases (never to skip them silently).
type Capabilities struct {
	// MaxBody is the largest Message.Body the backend can store, in bytes;
	// zero means no limit the platform need care about.
	MaxBody int

	// MinLease is the shortest lease the backend honours. The platform never
	// asks for less. Zero means any positive duration.
	MinLease time.Duration

	// RedeliversOnClose is true when a closed connection makes the broker
	// return its unsettled deliveries at once rather than after their lease.
	RedeliversOnClose bool

	// DeadHold is how long a dead letter handed out by NextDead stays held
	// when neither ExtendDead nor SettleDead is called: the platform calls
	// ExtendDead every third of it for as long as it works on the record.
	// Zero means a hold lasts until SettleDead or until the holder's
	// connection ends, and the platform never calls ExtendDead.
	DeadHold time.Duration

	// LocalSettle is true when Ack, Requeue and DeadLetter complete in this
	// process, with no round trip to wait for (an in-memory broker): the
	// platform then runs one worker a handler rather than two, as there
	// is no broker round trip to overlap with the next job (see
	// asyncplatform.QueueConfig.Concurrency).
	LocalSettle bool

	// Deduplicates is true when the backend drops a publish whose key
	// (Message.Dedupe, or Message.ID without one) it stored within a
	// window. The platform then carries a random nonce in every job it
	// enqueues and sets Message.Dedupe from it.
	Deduplicates bool
}

// Backend stores and delivers messages for a set of named queues, and keeps one
// dead-letter queue per queue.
//
// Every queue argument is a valid queue name (see CheckQueue): the platform
// validates names before they reach a backend, so a backend does not check
// them again and may assume valid input. It derives its own names (keys,
// subjects, dead-letter queues) from them.
type Backend interface {
	// Capabilities reports the backend's limits. It must not block.
	Capabilities() Capabilities

	// Declare makes sure the queue and its dead-letter queue exist. It is
	// idempotent. It returns an error naming the queue and the setting when
	// an existing queue was declared with incompatible arguments.
	Declare(ctx context.Context, queue string) error

	// Enqueue stores the messages durably before it returns. On error, some
	// of them may have been stored (the platform retries with the same IDs).
	Enqueue(ctx context.Context, queue string, msgs []Message) error

	// Receive hands out up to max messages from the queue, each under a lease
	// of the given duration, counting the delivery. It blocks until at least
	// one message is available or ctx is done, and then returns ctx.Err().
	// It must not poll on a fixed sleep when the broker can signal new work;
	// where it must poll, the interval is its own (tens of milliseconds).
	//
	// A delivery whose lease runs out (or whose connection closes) without a
	// settle becomes deliverable again, and its next delivery counts one more.
	// Messages the backend took from the broker but did not return (ctx
	// ended first) must be put back without counting a delivery: they never
	// reached the platform.
	Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*Delivery, error)

	// Ack removes the delivered message for good.
	Ack(ctx context.Context, d *Delivery) error

	// Extend renews the delivery's lease to the given duration from now. It
	// returns ErrLeaseLost when the lease had already been lost.
	Extend(ctx context.Context, d *Delivery, lease time.Duration) error

	// Requeue replaces the delivered message with msg (the same job, a new
	// body), which becomes deliverable at msg.NotBefore (now when zero) with
	// its delivery count starting again at zero. The replacement is atomic, or
	// ordered so that a crash in between leaves a duplicate, never a loss:
	// store the new copy, then settle the old.
	Requeue(ctx context.Context, d *Delivery, msg Message) error

	// DeadLetter moves the delivered message to the queue's dead-letter queue
	// as the given record, atomically or ordered as in Requeue.
	DeadLetter(ctx context.Context, d *Delivery, rec DeadMessage) error

	// NextDead hands out the oldest dead letter of the queue that no other
	// caller holds, and hides it from other callers until SettleDead. It
	// returns ErrNoDeadLetters when there is none. A record held by a caller
	// that vanishes (crash, closed connection) becomes visible again, at the
	// latest Capabilities.DeadHold after its last ExtendDead (or NextDead).
	// A backend never renews a hold on its own: the holder does, with
	// ExtendDead.
	NextDead(ctx context.Context, queue string) (*DeadDelivery, error)

	// ExtendDead renews the hold on a record handed out by NextDead for
	// another Capabilities.DeadHold from now. It returns ErrLeaseLost when
	// the hold had already been lost (it lapsed, the record was purged, or
	// it was settled). A backend whose DeadHold is zero only reports whether
	// the record is still held.
	ExtendDead(ctx context.Context, d *DeadDelivery) error

	// SettleDead releases a record handed out by NextDead: remove true
	// deletes it, false puts it back where it was (the next NextDead sees it
	// again). It returns ErrLeaseLost when the record is no longer held.
	SettleDead(ctx context.Context, d *DeadDelivery, remove bool) error

	// ListDead returns up to limit records of the queue's dead-letter queue,
	// oldest first, starting after the opaque cursor (empty for the start),
	// and the cursor for the next page (empty at the end). It changes
	// nothing: neither the order nor the count, and records held by a
	// NextDead caller may or may not be included.
	ListDead(ctx context.Context, queue, cursor string, limit int) (recs []DeadMessage, next string, err error)

	// DeleteDead removes every record of the queue's dead-letter queue whose
	// ID is among ids, and returns how many it removed. Records held by a
	// NextDead caller must be left alone (and not counted).
	DeleteDead(ctx context.Context, queue string, ids []string) (int, error)

	// PurgeDead removes every record of the queue's dead-letter queue and
	// returns how many it removed.
	PurgeDead(ctx context.Context, queue string) (int, error)

	// Stats returns the queue's depths.
	Stats(ctx context.Context, queue string) (Stats, error)

	// Close releases the backend's connections. Deliveries not yet settled are
	// abandoned, exactly as if the process had died: no outcome is reported
	// for them, and they come back after their lease (or at once, see
	// Capabilities.RedeliversOnClose) with one more delivery counted.
	// Close is idempotent.
	Close() error
}

// QueueDeleter is an optional interface: a backend that can remove a queue,
// its dead-letter queue and every message in them implements it. The
// conformance suite calls it after each test, and the CLI offers it.
type QueueDeleter interface {
	DeleteQueue(ctx context.Context, queue string) error
}

// Releaser is an optional interface for backends that buffer messages
// received from the broker ahead of Receive (a consumer's prefetch window):
// Release stops that buffering for the queue and hands back, uncounted,
// everything received but not yet handed out. A later Receive may start
// again. The platform calls it when it stops working the queue.
type Releaser interface {
	Release(ctx context.Context, queue string) error
}

// Pinger is an optional interface: a backend that can check its connection
// to the broker cheaply implements it, and the platform reports the result in
// its health.
type Pinger interface {
	Ping(ctx context.Context) error
}
