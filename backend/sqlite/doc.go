// Package sqlite is an asyncplatform backend in one SQLite database file,
// built on modernc.org/sqlite (pure Go: no cgo, no server):
//
//	b, err := sqlite.New(ctx, sqlite.Config{Path: "/var/lib/app/jobs.db"})
//	defer b.Close()
//	p, err := asyncplatform.New(b, asyncplatform.Config{})
//
// It is the durable choice for one machine: jobs, dead letters and the
// store (unique jobs, schedules, status, flow control) live in the file and
// survive a restart of every process, and several processes on the machine
// may work the same file at once. The Backend is its own driver.Store (a
// table in the same file). Jobs can be enqueued inside the caller's own
// transaction on the file, with their unique keys and status records: see
// WithTx; and a handler can complete its job in its own transaction on the
// file, so its writes and the completion commit together: see
// Backend.CompleteTx.
//
// # URLs
//
// Importing the package registers the scheme sqlite for asyncplatform.Open
// (and so for asyncctl and the dashboard); the path is absolute, after
// three slashes:
//
//	sqlite:///var/lib/app/jobs.db
//	sqlite:///var/lib/app/jobs.db?prefix=shop&dead_hold=1m&busy_timeout=30s
//
// The parameters are prefix (Config.Prefix), dead_hold, idle_wait and
// busy_timeout (durations: Config.DeadHold, Config.IdleWait,
// Config.BusyTimeout), max_body (bytes: Config.MaxBody) and max_conns
// (Config.MaxConns); any other parameter, a host other than localhost, or
// a user is refused. The Backend opened from a URL owns its connections and
// closes them on Close.
//
// # Layout
//
// New opens the file in WAL mode (journal_mode=WAL, synchronous=FULL, the
// busy timeout) and creates, in one transaction, the tables it lacks,
// recording SchemaVersion in <prefix>_schema (a file whose tables are of a
// later version is refused; an earlier one gains the tables it lacks:
// version 2 added the outbox's). With the default prefix "asyncplatform":
//
//	asyncplatform_jobs    id, queue, body, run_at, deliveries, token: one row per stored copy
//	asyncplatform_dead    id, queue, rec_id, body, held_until, token: one row per dead letter
//	asyncplatform_queues  name: every declared queue (Queues)
//	asyncplatform_store   key, value, rev, expires_at: the store
//	asyncplatform_seq     the store's revision counter
//	asyncplatform_schema  version
//	asyncplatform_outbox        seq, queue, id, dedupe, body, not_before: jobs enqueued under OutboxTx
//	asyncplatform_outbox_aside  the outbox rows a relay could not publish, with the reason
//	asyncplatform_outbox_lease  queue, owner, until: a relay's lease of a queue's outbox rows
//
// The outbox (OutboxTx) is read by an outbox.Relay through the Backend's
// outbox.Source methods: a queue's lease is a row that lapses at until
// (outbox.Config.LeaseTTL after it was taken or last renewed; every delete
// renews it in its transaction, and refuses with ErrLeaseLost once it
// lapsed), so a relay killed holding it holds up that queue for the TTL.
// Rows are read in seq order (commit order: SQLite has one writer), their
// bodies and IDs bounded (Config.MaxBody, 4 KiB).
//
// Times are milliseconds since the Unix epoch. A job row's run_at is when
// it is next claimable: its NotBefore while it waits (token 0), its lease's
// end while it is out (token set). Queue names are stored as they are. One
// index, (queue, run_at, id), serves the claim, the next due time and the
// queue listing.
//
// SQLite lets one connection write at a time. Every write is a short
// transaction begun IMMEDIATE (it takes the write lock at BEGIN, so it
// never fails to upgrade a read lock); the Backends of one process queue
// for the lock in Go (one writer lock per file per process, waited for
// until the write's context ends), and processes queue on an flock beside
// the file: a write that waited Config.BusyTimeout for another process's
// flock fails with a *LockTimeoutError, before it started (that process is
// stopped or hung holding it), and SQLite's busy handler bounds the rest
// by Config.BusyTimeout too. Reads
// (Stats, ListDead, the store's Get and List, and the look for a due job
// before a claim) never wait for the writer.
//
// Wake-ups: SQLite has no LISTEN. A commit of the process itself (Enqueue,
// a Requeue due now, a cancelled Receive's put back) wakes its idle
// Receives of that queue at once, whichever of the process's Backends on
// the file made it. For the commits of other processes (and of
// transactions given to WithTx) each process reads PRAGMA data_version
// every PollInterval (100ms) and wakes every idle Receive when it changed,
// so a job enqueued by another process is seen within about PollInterval.
// An idle Receive otherwise waits for the queue's next due time (a
// NotBefore or a lease's end, read after an empty claim) or
// Config.IdleWait, whichever comes first.
//
// # Counting
//
// Counted at claim time, atomically with the claim: one write transaction
// picks up to max rows of the queue whose run_at has passed (in run_at, id
// order) and updates them, incrementing deliveries, writing a new random
// token and setting run_at to the lease's end. The lease runs from the
// database's clock as the statement runs, after it got the write lock, so
// a claim that waited for another writer hands out a whole lease. A lease
// that runs out needs no reaper: the row is claimable again, and its next
// claim counts one more. A claim whose Receive context ended meanwhile is
// put back with the count decremented and its old run_at (the transaction
// itself is never cancelled halfway).
//
// A process killed inside a write transaction (its own claim, or a
// caller's WithTx transaction) leaves none of it: WAL frames of a
// transaction never committed are ignored, the kernel drops the dead
// process's flock and SQLite's locks, and the next writer goes on at once.
//
// Ack (DELETE), Extend (UPDATE run_at), Requeue (an UPDATE in place: the
// new body, run_at at its NotBefore, deliveries 0, token 0) and DeadLetter
// (a DELETE and an INSERT into the dead table, one transaction) each match
// the row's id, its token and a run_at not yet passed; no row matched is
// driver.ErrLeaseLost, so a lapsed or stale receipt never acts on a newer
// delivery.
//
// # Dead letters
//
// NextDead takes the oldest record of the queue not held (held_until
// passed) and writes a new token and held_until = now + Config.DeadHold in
// one UPDATE; ExtendDead renews it, SettleDead deletes the row or clears
// the hold (the record keeps its place, its id), each matching the token
// and a hold not yet passed. A holder that vanished leaves a hold that
// simply runs out. ListDead pages by id (the cursor is the last id of the
// page) and includes held records. DeleteDead is one DELETE per ID of the
// queue's unheld records, each found by the index (queue, rec_id), in one
// transaction; PurgeDead one DELETE of them
// all, held or not.
//
// # Limits
//
//   - Capabilities.MaxBody is Config.MaxBody (1 MiB by default, up to
//     512 MiB).
//   - Capabilities.MinLease is 50ms; leases are kept in milliseconds.
//   - Every time is the machine's clock (the database reads the same one):
//     the processes sharing a file are on one machine.
//   - One writer at a time: a job costs three write transactions (enqueue,
//     claim, ack), each an fsync of the WAL (synchronous=FULL). Throughput
//     is bounded by the disk's fsync rate, whatever the concurrency.
//     The store's batch calls (CreateEach, UpdateEach, DeleteEach,
//     DeleteValueEach) write all their keys in one transaction, GetEach
//     reads them in one statement; the Backend's statements are prepared
//     once per connection (TestStatementsPreparedOnce).
//   - Receive hands out at most 1000 jobs per call, whatever its max, and
//     ListDead at most 1000 records per page, whatever its limit.
//   - Reads are bounded: a body over MaxBody (a row someone else wrote) is
//     handed out cut to MaxBody+1 bytes, and the platform dead-letters it
//     as not a job; a dead letter's ID is read up to 4 KiB+1 bytes and its
//     body up to MaxBody + 1 MiB + 1 (DeadLetter refuses a record over
//     those limits with driver.ErrTooLarge). The store's Get reads a value
//     up to driver.MaxValueLen+1 bytes and List a key up to
//     driver.MaxStoreKeyLen+1 (as bytes, whatever the column's type): a row
//     over either limit is refused with a *StoreRowError naming its key.
//   - Stats counts jobs whose lease ran out as ready; it counts rows, so it
//     costs a scan of the queue's index entries. Queues reads the distinct
//     queue names of both tables' indexes.
//   - The store's expired keys are absent at once; their rows are deleted
//     every minute by each open Backend, 1000 at a time.
//   - Close abandons unsettled deliveries; they come back when their lease
//     runs out (Capabilities.RedeliversOnClose is false).
//   - A transaction given to WithTx holds the file's write lock until it
//     ends: every other write, from every process, waits for it (up to
//     Config.BusyTimeout, then fails).
//
// Browse (driver.Browser) reads the job rows of a state in claim order
// (run_at, id), keyset-paged over the (queue, run_at, id) index, without
// waiting for the writer; IDs are row IDs.
//
// # Clusters
//
// None: the file is on one machine, and every process that opens it must
// run there (SQLite's WAL needs shared memory; never put the file on a
// network file system). A committed write survives a crash of the process
// and, with synchronous=FULL, of the machine. There is no replication:
// the loss of the disk loses the jobs; back the file up with SQLite's
// online backup or VACUUM INTO. To grow past one machine, move to another
// backend: the handlers and the failure semantics stay the same.
package sqlite
