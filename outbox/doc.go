// Package outbox relays the jobs of a transactional outbox to any
// backend.
//
// A job enqueued under postgres.OutboxTx (or OutboxSQLTx, or
// sqlite.OutboxTx) is written, in the caller's transaction, to the
// backend's outbox table instead of its queue: it exists when the
// transaction commits, with the caller's own writes, and never when it
// rolls back. A Relay moves those rows to another backend (Redis,
// RabbitMQ, NATS, Azure, ...):
//
//   - in order per queue: a queue's rows are read in commit order by one
//     relay at a time (a lease per queue) and published in that order;
//   - at least once: rows are deleted only after the target confirmed
//     them, so a relay killed at any point loses nothing, and the next one
//     publishes again what was not deleted;
//   - recognisably: every copy keeps the job's ID and Dedupe, so a
//     duplicate is the same job (a deduplicating backend drops it; the
//     platform's unique keys and status see the same ID);
//   - shared: relays running at once take different queues' leases, and
//     never publish one queue's rows together.
//
// A row that cannot be published (a body or ID past its bound, a bad
// queue name) is moved to the outbox's aside table with the reason, and
// the rows after it go on.
//
// asyncctl relay --from postgres://... --to redis://... runs one.
package outbox
