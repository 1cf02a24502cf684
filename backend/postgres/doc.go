// Package postgres is an asyncplatform backend in PostgreSQL tables, built
// on pgx v5:
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
//	b, err := postgres.New(ctx, postgres.Config{Pool: pool})
//	p, err := asyncplatform.New(b, asyncplatform.Config{})
//
// The backend never closes a pool it is given. Its store (unique jobs,
// schedules, status, flow control) is a pgstore table on the same
// database. Jobs can be enqueued inside the caller's own transaction (a
// pgx.Tx or a *sql.Tx), with their unique keys and status records: see
// WithTx. A handler can complete its job inside its own transaction, so
// that its writes and the completion commit together: see
// Backend.CompleteTx.
//
// # URLs
//
// Importing the package registers the schemes postgres and postgresql for
// asyncplatform.Open (and so for asyncctl and the dashboard):
//
//	postgres://app:secret@db:5432/app?sslmode=require&prefix=jobs
//	postgresql://app@db/app?pool_max_conns=50&dead_hold=1m
//
// The parameters prefix (Config.Prefix), listen_url (Config.ListenURL),
// dead_hold and idle_wait (durations: Config.DeadHold, Config.IdleWait),
// max_body (bytes: Config.MaxBody) and skip_migrate (true or false:
// Config.SkipMigrate) are ours; every other parameter goes to pgx
// (pgxpool.ParseConfig: sslmode, pool_max_conns, ...), which refuses one
// it does not know. Errors never show the password. The Backend opened
// from a URL owns the pool it made and closes it on Close.
//
// Behind PgBouncer in transaction pool mode, add
// default_query_exec_mode=simple_protocol (or exec) to the URL, a pgx
// parameter: pgx's default prepares and caches named statements on a
// connection, and PgBouncer (before 1.21, or without
// max_prepared_statements) hands the next transaction another server
// connection, which knows none of them ("prepared statement ... already
// exists" or "does not exist"). Point listen_url (Config.ListenURL) at the
// server itself or at a session-mode pool: LISTEN needs a session.
// Enqueue, claims, leases, dead letters, the store and the migrations (a
// transaction-scoped advisory lock) all work through the transaction pool
// (TestPgBouncer, in simple_protocol mode):
//
//	postgres://app@pgbouncer:6432/app?default_query_exec_mode=simple_protocol&listen_url=postgres%3A%2F%2Fapp%40db%3A5432%2Fapp
//
// # Layout
//
// New applies the embedded migrations (migrations/*.sql, versioned) under
// an advisory lock, each in a transaction of its own, and records them in
// <prefix>_migrations; Config.SkipMigrate leaves that to Migrate (or
// asyncctl migrate). A released migration is never changed; an upgrade
// from every earlier version keeps every row (TestUpgradeKeepsData). With
// the default prefix "asyncplatform":
//
//	asyncplatform_jobs        id, queue, body, run_at, deliveries, token: one row per stored copy
//	asyncplatform_dead        id, queue, rec_id, body, held_until, token: one row per dead letter
//	asyncplatform_queues      name: every declared queue (Queues)
//	asyncplatform_token       sequence: the lease and hold tokens
//	asyncplatform_store       the pgstore table (and its sequence asyncplatform_store_rev)
//	asyncplatform_migrations  version, applied_at
//	asyncplatform_outbox      seq, queue, id, dedupe, body, not_before: jobs enqueued under OutboxTx (version 3)
//	asyncplatform_outbox_aside  the outbox rows a relay could not publish, with the reason
//
// The outbox (OutboxTx, OutboxSQLTx) is read by an outbox.Relay through
// the Backend's outbox.Source methods: a queue's lease is a session
// advisory lock (pg_try_advisory_lock) held on a pool connection until the
// relay releases it or its connection closes (a relay killed with SIGKILL
// lets it go at once); rows are read in seq order, their bodies and IDs
// bounded (Config.MaxBody, 4 KiB), and deleted by seq once the target
// confirmed them. Rows of transactions in flight together may commit out
// of seq order: each is relayed when visible, and only the rows read are
// deleted. Not behind PgBouncer in transaction mode (session state).
//
// A job row's run_at is when it is next claimable: its NotBefore while it
// waits (token 0), its lease's end while it is out (token set). Queue names
// are stored as they are (every valid name is a valid text value). One
// index, (queue, run_at, id), serves the claim, the next due time and the
// queue listing (a skip scan); on the dead letters, (queue, id) serves
// NextDead, ListDead and the listing, and a hash index on rec_id (version
// 2; a hash, as a record's ID may be longer than a B-tree entry allows)
// DeleteDead.
//
// Idle receivers are woken by LISTEN/NOTIFY on the channel
// <prefix>_wake: an Enqueue within WithTx, a Requeue due now and a
// cancelled Receive's put back notify "<jobs> <queue>" in the statement
// that writes the rows, so the notification is delivered when it commits
// (never for a rolled back transaction). An Enqueue outside a caller's
// transaction notifies after its INSERT committed, in a statement of its
// own, the wake-ups of concurrent enqueues summed per queue: a notifying
// transaction holds PostgreSQL's notify lock while its commit is flushed,
// so a NOTIFY in every enqueue's statement made concurrent enqueues wait
// for each other's flush (see docs/benchmarks.md). Each Backend holds one session connection for LISTEN (not
// from the pool; Config.ListenURL points it elsewhere, as behind PgBouncer
// in transaction mode, which cannot LISTEN) and wakes as many of its idle
// Receives as the notification announces jobs. An idle Receive waits for
// the first of: a wake-up, the queue's next due time (a NotBefore or a
// lease's end, read after an empty claim), Config.IdleWait (a second at
// most: the safety net while the LISTEN connection is being reopened), or
// its context.
//
// # Counting
//
// Counted at claim time, atomically with the claim: one UPDATE takes up to
// max rows of the queue whose run_at has passed (in run_at, id order,
// picked FOR UPDATE SKIP LOCKED, so concurrent claims never wait for each
// other), increments their deliveries, writes a new token from the
// sequence and sets run_at to the lease's end, by the server's clock from
// the moment it takes the row (clock_timestamp, not the transaction's
// start: a claim slowed by a loaded server hands out a whole lease). A
// lease that runs out needs no reaper: the row is claimable again, and its
// next claim counts one more. A claim whose Receive context ended while
// the statement ran is put back with the count decremented (the statement
// itself is never cancelled halfway: it runs under a context of its own).
//
// Ack (DELETE), Extend (UPDATE run_at), Requeue (an UPDATE in place: the
// new body, run_at at its NotBefore, deliveries 0, token 0) and DeadLetter
// (a DELETE ... RETURNING feeding an INSERT into the dead table, one
// statement) each match the row's id, its token and a run_at not yet
// passed; no row matched is driver.ErrLeaseLost, so a lapsed or stale
// receipt never acts on a newer delivery.
//
// Acks are committed together, like a group commit: four goroutines per
// Backend each delete the rows of every Ack queued, up to 1000, in one
// DELETE ... USING unnest(ids, tokens) ... RETURNING id, token. An Ack
// goes out at once while one of them is free (no wait for company), and
// with every Ack that arrived meanwhile once one is; each returns once the
// statement holding it committed, and finds its own row among those
// returned or else reports its lease lost. An Ack within WithTx deletes
// its row in that transaction.
//
// # Dead letters
//
// NextDead takes the oldest record of the queue not held (held_until NULL
// or passed), FOR UPDATE SKIP LOCKED, and writes a new token and
// held_until = now() + Config.DeadHold; ExtendDead renews it, SettleDead
// deletes the row or clears the hold (the record keeps its place, its id),
// each matching the token and a hold not yet passed. A holder that
// vanished leaves a hold that simply runs out. ListDead pages by id (the
// cursor is the last id of the page) and includes held records. DeleteDead
// is one DELETE of the queue's unheld records with those IDs, found by the
// rec_id index whatever the queue's depth; PurgeDead one DELETE of them
// all, held or not, an index scan of the queue's records.
//
// # Limits
//
//   - Capabilities.MaxBody is Config.MaxBody (1 MiB by default, up to
//     1 GiB - 1, bytea's limit); a large body costs its transfer inside the
//     lease, which runs from the claim.
//   - Capabilities.MinLease is 50ms; leases are kept in microseconds.
//   - Message.NotBefore is the enqueuing process's clock, every other time
//     the server's: keep the clocks in step.
//   - Receive hands out at most 1000 jobs per call, whatever its max, and
//     ListDead at most 1000 records per page, whatever its limit.
//   - Reads are bounded: a body over MaxBody (a row someone else wrote, or
//     one written before MaxBody was lowered) is handed out cut to
//     MaxBody+1 bytes, and the platform dead-letters it as not a job; a
//     dead letter's ID is read up to 4 KiB+1 bytes and its body up to
//     MaxBody + 1 MiB + 1 (DeadLetter refuses a record over those limits
//     with driver.ErrTooLarge).
//   - Stats counts jobs whose lease ran out as ready; it counts rows, so it
//     costs a scan of the queue's index entries.
//   - Close abandons unsettled deliveries; they come back when their lease
//     runs out (Capabilities.RedeliversOnClose is false).
//   - Every write is a committed transaction: a job costs three (enqueue,
//     claim, ack; claims and acks are shared by the jobs taken or settled
//     together), each waiting for PostgreSQL's WAL flush unless the
//     server runs with synchronous_commit off (a crash of the server then
//     loses the last moments of writes).
//   - Rows are deleted as they settle: run autovacuum (the default), as a
//     busy jobs table is a high-churn one.
//
// Browse (driver.Browser) reads the job rows of a state in claim order
// (run_at, id), keyset-paged over the (queue, run_at, id) index; IDs are
// row IDs; a body over driver.MaxBrowseBody is measured, not returned.
//
// # Clusters
//
// Durability and replication are PostgreSQL's: a committed write survives
// a server crash (the WAL), and with synchronous replication a failover
// loses nothing committed; with asynchronous replication a failover can
// lose the last committed transactions, so an enqueue (a lost job) or a
// claim, Ack, Requeue or settle (the job comes back: a duplicate). The
// pool reconnects on its own after a restart or failover (a statement in
// flight fails, and the platform retries); the LISTEN connection is
// reopened every second until it succeeds, and every idle Receive is woken
// then, as notifications sent meanwhile are lost. Several workers, and
// several platforms with distinct prefixes, share one database.
package postgres
