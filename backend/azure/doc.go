// Package azure is the asyncplatform backend on Azure Queue Storage
// (github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue), with its dead
// letters in Blob Storage of the same account
// (github.com/Azure/azure-sdk-for-go/sdk/storage/azblob), tested against
// Azurite, Microsoft's emulator.
//
//	b, err := azure.New(ctx, azure.Config{ConnectionString: os.Getenv("AZURE_STORAGE_CONNECTION_STRING")})
//	// or, with a token credential or SAS: azure.Config{Client: queues, BlobClient: blobs} (*azqueue.ServiceClient, *azblob.Client)
//	p, err := asyncplatform.New(b, asyncplatform.Config{...})
//
// # URLs
//
// Importing the package registers the azure scheme for asyncplatform.Open,
// in either form:
//
//	azure:DefaultEndpointsProtocol=https;AccountName=...;AccountKey=...;   the connection string itself
//	azure://?prefix=jobs                                                    the connection string from $ASYNCPLATFORM_AZURE_CONNECTION_STRING
//
// The query parameter prefix (second form) sets Config.Prefix. A
// connection string that names a QueueEndpoint must name a BlobEndpoint too
// (Azurite's do: scripts/azurite.sh starts both services); one with only
// an account name and key reaches both services of the account. Errors
// never quote the connection string: it holds the account key.
//
// # Layout
//
// Azure queue names allow only 3 to 63 lowercase letters, digits and single
// hyphens, so every facade queue name ([A-Za-z0-9._-]{1,100}) is mapped to a
// "base": the name itself when it is already a valid lowercase name of at
// most 34 characters, otherwise up to 12 sanitized characters, "-h" and 20
// hex digits of the SHA-256 of the name ("Orders.v2" → "orders-v2-h3f…").
// A simple name never ends like a hashed one, so the mapping is injective up
// to an 80-bit hash collision. With the configured prefix P (default "ap"):
//
//	P "w" base                    the work queue: one message per job copy
//	dead/ base "/" key            one blob per dead-letter record, in the container Config.Container (default P "-asyncplatform")
//
// New creates the container. key is 17 characters that sort by creation
// time (milliseconds in base 36, a per-process sequence, random digits), so
// a listing of the prefix dead/<base>/ returns one queue's records oldest
// first; a base holds no "/", so no queue's prefix is a prefix of
// another's. No queue is created per dead letter.
//
// Versions before this layout kept each record in a queue of its own
// (P "d" LL base key, with overflow queues P "d" LL base key "x"; LL is
// len(base) in two digits). Such records are moved into blobs, keeping
// their keys and so their order: see Dead letters.
//
// # Counting
//
// Message text is always base64 (raw bytes do not survive the service) of a
// 15-byte frame followed by the platform's body: magic "aw", a version, a
// 32-bit base and the NotBefore time in milliseconds. Messages are sent with
// a time-to-live of -1, so the service's 7-day default expiry never deletes a
// job. Deliveries = DequeueCount − base. Requeue is one atomic UpdateMessage
// that writes the new body with base = the current DequeueCount and a
// visibility timeout up to NotBefore. Extend is an UpdateMessage with the
// same text and the new timeout; the new pop receipt replaces the old one in
// the Delivery's handle. A stale pop receipt (the message was received again
// since, or deleted) fails with driver.ErrLeaseLost. The service accepts a
// pop receipt after its visibility timeout, until the message is received
// again, so each Delivery also keeps its lease's end on the local clock,
// counted from when the receive (or the Extend) was sent and so never later
// than the service's: once it has passed, Ack, Extend, Requeue and
// DeadLetter return driver.ErrLeaseLost without sending anything. A settle
// sent just before that end and delayed in transit past the visibility
// timeout still takes effect if no one has received the message since (no
// one else has seen it). Visibility timeouts are
// whole seconds (rounded up, so nothing surfaces early; MinLease is 1s) and
// cap at 7 days: a message scheduled further ahead surfaces early, is seen
// by Receive to be early, and is hidden again with its base moved up by one
// in the same UpdateMessage, so the early surfacing is not counted as a
// crash. Likewise, when Receive's ctx ends while a receive request is in
// flight (the request itself is not cut short), the messages it took are made
// visible again with the base moved up by one: that receive is not counted,
// earlier deliveries without an outcome still are.
//
// A message that is not our frame (foreign or corrupt text) is handed to the
// platform with its raw text as the body, which dead-letters it.
//
// Receive takes up to 32 messages per request. Azure cannot signal new work,
// so an empty queue is polled, the wait doubling from 10ms to
// Config.PollInterval (100ms by default). Close abandons unsettled
// deliveries; they reappear when their visibility timeout ends
// (RedeliversOnClose is false).
//
// # Dead letters
//
// A record is a blob whose content is a small frame (magic, version, the
// job ID) followed by the platform's record; its metadata repeats the ID
// (apid, base64url) when it fits in 4 KiB. Blob Storage gives what a
// dead-letter queue needs:
//
//   - DeadLetter refuses a lapsed lease, renews it when less than half is
//     left, writes the blob with If-None-Match: * (a conditional create,
//     so no record is ever overwritten; an SDK retry of a write that had
//     succeeded finds its own content and is done), then deletes the
//     delivered message: two requests, three with the renewal. A crash in
//     between leaves a duplicate record, never a loss.
//   - NextDead lists the queue's prefix 32 names at a time, skips records
//     the listing shows leased, and takes a blob lease of Config.DeadHold
//     (15s to 60s, 30s by default) on the first it can. A lease has one
//     holder, so two callers never hold the same record. ExtendDead renews
//     the lease (the platform calls it every DeadHold/3 until SettleDead);
//     a caller that vanishes (a crash, or Close) stops renewing and its
//     record is visible again when the lease ends. It costs one listing, one lease and one read,
//     whatever the depth.
//   - SettleDead(remove) deletes the blob under the lease: the service
//     refuses a delete with a lease that is no longer the blob's, which is
//     driver.ErrLeaseLost. SettleDead(keep) releases the lease; the record's
//     place is its name, so the next NextDead sees it again.
//   - ListDead is one listing of up to limit names from the service's
//     continuation marker (the cursor is that marker, tagged with the
//     queue) and one read per record, 16 at a time. Held records are
//     listed too. Nothing changes.
//   - DeleteDead deletes each record it finds without a lease: the service
//     refuses that for a held record, which is left alone and not counted.
//     It finds them by name when every ID it is given is one that a whole
//     listing by this Backend showed (ListDead's pages from the empty
//     cursor to the end, or an earlier DeleteDead's walk, with no name
//     dropped; up to 100,000 names of IDs up to 256 bytes are remembered,
//     about 15 MB; a single page is not enough, for it may not show every
//     record of an ID it shows), so a
//     redrive, which lists the queue once and then deletes in chunks,
//     lists it once in all; otherwise it walks the prefix with metadata
//     (5,000 names a request), remembering every record it sees, and
//     matches IDs there. A record of a remembered ID written after the
//     listing that showed the ID (a duplicate) is not deleted by name: it
//     stays, as a duplicate written after the call would. PurgeDead deletes
//     every record, breaking the lease of a held one first (its holder's
//     SettleDead then fails with ErrLeaseLost, or finds the record gone).
//     Both cost one request per record (plus the walk, when there is one);
//     Stats counts records with the listing alone.
//
// Records in the legacy layout (a queue per record) are moved, not read in
// place: each process, at its first dead-letter call on a queue (NextDead,
// ListDead from the start, DeleteDead, Stats) and again at most once a
// minute, lists the queue's legacy record queues (one request when there
// are none), and for each complete one dequeues its lock message (hiding it
// for 60s), writes the record as a blob under the same key, and deletes the
// record's queues. Backend.MigrateDeadLetters does the same on demand.
// Records that a worker of the previous version holds are moved by a later
// check; records it writes during a rolling upgrade are moved within a
// minute of the next dead-letter call. Two processes moving one record
// write the same blob (the second finds its own content), so nothing is
// lost; at worst, a record popped between the two writes comes back once.
// PurgeDead and DeleteQueue delete legacy queues directly, incomplete ones
// included.
//
// # Limits
//
// Priorities within a queue (Job.Priority with QueueConfig.Priorities) are a
// queue per level, here three more Storage queues per queue, and a waiting
// Receive on each empty level, which polls at PollInterval as every Azure
// Receive does (about ten requests a second per level at the default).
//
//   - MaxBody is 49,137 bytes: 64 KiB of base64 text is 49,152 bytes, less
//     the 15-byte frame. Enqueue returns driver.ErrTooLarge (naming the
//     limit) before sending anything when a body is larger.
//   - A dead-letter record is one blob, written with one request: up to
//     Azure's limit for a single Put Blob (5,000 MiB); the platform's
//     records are far smaller.
//   - Stats: Azure reports only an approximate count of all messages, so
//     Ready is counted with Peek when fewer than 32 are visible (else -1);
//     Scheduled and InFlight are -1. Dead counts the record blobs.
//   - Azure does not promise FIFO order; neither does the platform.
//   - Dead-letter order is creation time on the writers' clocks; records
//     written in the same millisecond by different processes may list in
//     either order.
//   - The credential needs the Blob Storage permissions named at
//     Config.BlobClient; a SAS scoped to one container works when that
//     container exists.
//   - Updates and deletes are not idempotent: a pop receipt changes with
//     every UpdateMessage. When a connection is reset after the service
//     applied a request, the SDK retries it with the same pop receipt. A
//     retried delete (Ack, or the end of DeadLetter) that finds the message
//     gone (404 MessageNotFound) succeeds: an earlier try deleted it (or,
//     had the lease run out meanwhile, the next holder settled it); one that
//     finds another pop receipt reports driver.ErrLeaseLost. A retried update
//     fails (400 PopReceiptMismatch) and the backend reports
//     driver.ErrLeaseLost: the new pop receipt was in the lost answer, so an
//     Extend leaves the job to come back after its lease, one crash counted,
//     and a Requeue's new copy may be in place. With Config.Client, deletes
//     retry with the SDK's default retry options. Updates are never
//     abandoned halfway by a cancelled ctx: they finish in the background
//     (Close waits for them) and the next call on the delivery uses the new
//     receipt.
//   - A delivery's lease is counted on the local clock from when its
//     receive (or last Extend) was sent, the only bound known never to be
//     later than the service's. A request that takes a good part of the
//     lease to answer (Azurite during its garbage collection, see
//     docs/reliability.md, "Azure: the benchmark's claim that failed with
//     context deadline exceeded") leaves that much less of the lease: a
//     settle after its local end is refused with driver.ErrLeaseLost and
//     the job comes back, one crash counted, although the service would
//     still have taken it.
//   - A deleted queue's name cannot be created again for about 30 seconds
//     on Azure (QueueBeingDeleted); after DeleteQueue, Declare the same name
//     later or use a new one.
//   - Azure cannot signal new work: every idle queue costs a request per
//     Config.PollInterval per worker.
//   - Two backends sharing an account need prefixes of which neither is a
//     prefix of the other.
//   - Azurite keeps data in memory (the tests start it with
//     --inMemoryPersistence) or saves to disk every few seconds: it is no
//     oracle for broker-crash durability.
//
// Browse (driver.Browser) peeks: PeekMessages shows the first 32 visible
// messages and changes nothing, so a ready listing is partial when the
// peek is full, a scheduled copy shows only while visible (a NotBefore
// beyond the longest visibility timeout), and in-flight messages not at
// all; each such page says it is partial (BrowsePage.Partial).
//
// # Clusters
//
// There is no cluster to run: the storage account is the service's, and so
// is its replication, chosen with the account's redundancy. Every worker
// talks to the account's primary endpoints; the backend has no setting for
// it and uses no secondary endpoint (RA-GRS and RA-GZRS secondaries are
// read-only, and every operation here writes).
//
//   - LRS (three copies in one datacenter) and ZRS (three zones of one
//     region) replicate each write synchronously before it is acknowledged:
//     a datacenter loss (LRS: not survived; ZRS: survived) loses nothing
//     acknowledged.
//   - GRS and GZRS copy the primary region to a secondary one
//     asynchronously. A customer-managed (unplanned) failover promotes the
//     secondary and loses what was written after its Last Sync Time (Azure
//     promises no bound; typically minutes), and the account is LRS
//     afterwards until geo-redundancy is configured again. A planned
//     failover waits for the copy and loses nothing. The endpoints keep
//     their names (DNS moves), so workers carry on with the same
//     connection string.
//   - What such a failover can lose, in this backend's terms: jobs
//     enqueued after the Last Sync Time (gone: at-most-once for them);
//     acks and requeues after it (the job comes back with its older copy,
//     a duplicate); dead-letter records and store keys written after it
//     (blobs), store writes reverting to an older revision. The queue and
//     blob services each have a Last Sync Time of their own (Get Queue
//     Service Stats, Get Blob Service Stats), so the order DeadLetter
//     writes in (the record blob, then the message's delete) does not
//     survive a failover: a dead letter made just before one can lose its
//     record while its message's delete survives, and the job is then
//     lost. Check both Last Sync Times before a customer-managed failover.
//   - Tested only on Azurite, a single process: nothing here has been run
//     against a failover.
package azure
