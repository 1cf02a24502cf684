// Package azure is the asyncplatform backend on Azure Queue Storage
// (github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue), tested against
// Azurite, Microsoft's emulator.
//
//	b, err := azure.New(ctx, azure.Config{ConnectionString: os.Getenv("AZURE_STORAGE_CONNECTION_STRING")})
//	// or, with a token credential or SAS: azure.Config{Client: svc} for any *azqueue.ServiceClient
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
// The query parameter prefix (second form) sets Config.Prefix. Errors never
// quote the connection string: it holds the account key.
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
//	P "d" LL base key             one queue per dead-letter record (LL = len(base), two digits)
//	P "d" LL base key "x"         the overflow chunks of a record larger than one message
//
// key is 17 characters that sort by creation time (milliseconds in base 36,
// a per-process sequence, random digits). LL makes the dead-letter prefixes
// prefix-free, so listing one queue's records never walks another's.
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
// since, or deleted) fails with driver.ErrLeaseLost. Visibility timeouts are
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
// Azure has no dead-letter queue, Peek returns at most 32 messages and has
// no cursor, and a receive reorders. So each dead-letter record is a queue
// of its own holding one "lock" message (the job ID and the record, or the
// number of overflow chunks). The record queues of one source queue sort by
// name in creation order, and the service lists queue names in order with a
// marker, which gives:
//
//   - NextDead: list the record queues in order and dequeue the lock message
//     of the first one that has a visible one (Config.DeadLease, 30s by
//     default). A dequeue is atomic, so two callers never hold the same
//     record; a caller that vanishes releases it when DeadLease ends.
//   - SettleDead(remove): delete the lock message with its pop receipt (a
//     stale receipt fails with ErrLeaseLost), then the record's queues.
//     SettleDead(keep): make the lock message visible again. The record's
//     place is its queue name, so the next NextDead sees the same record.
//   - ListDead: the cursor is the name of the last record queue returned;
//     each record is read with Peek, so nothing changes (records held by a
//     NextDead caller are invisible to Peek and left out). It costs one
//     request per record, plus the name listing.
//
// The service's own continuation marker is not used as a cursor: Azurite's
// is an insertion index applied to a name-sorted listing, which skips names
// whenever insertion order and name order differ (records written
// concurrently). Listings are walked from the start (5,000 names per
// request) and names compared here; past 5,000 record queues the SDK's
// marker is still used, and on Azurite that paging may skip records.
//   - DeleteDead matches IDs from the record queues' metadata ("apid").
//
// DeadLetter writes the overflow chunks (if any), creates the record queue
// and enqueues its lock message last, then deletes the delivered message.
// When that delete finds the lease lost, the record is removed again and
// ErrLeaseLost returned; a crash between the two leaves a duplicate record,
// never a loss. A crash in the middle of the write leaves a record queue
// without a lock message (or an overflow queue without a record): invisible
// to NextDead and ListDead, removed by PurgeDead and DeleteQueue.
//
// The trade-off: a dead letter costs a queue create and delete, a listing
// costs one Peek per record, and an account with many dead letters shows
// many queues. Dead letters are rare, and this keeps the backend to the
// queue service alone, so it works with any credential the caller's
// *azqueue.ServiceClient holds; a blob or table store would need a second
// client and credential.
//
// # Limits
//
//   - MaxBody is 49,137 bytes: 64 KiB of base64 text is 49,152 bytes, less
//     the 15-byte frame. Enqueue returns driver.ErrTooLarge (naming the
//     limit) before sending anything when a body is larger.
//   - A dead-letter record may be up to 32 × 49,145 bytes (about 1.5 MiB):
//     the lock message holds it inline when it fits, otherwise the overflow
//     queue holds up to 32 chunks, read back with one Peek.
//   - Stats: Azure reports only an approximate count of all messages, so
//     Ready is counted with Peek when fewer than 32 are visible (else -1);
//     Scheduled and InFlight are -1. Dead counts the record queues.
//   - Azure does not promise FIFO order; neither does the platform.
//   - Dead-letter order is creation time on the writers' clocks; records
//     written in the same millisecond by different processes may list in
//     either order.
//   - Updates and deletes are not idempotent: a pop receipt changes with
//     every UpdateMessage. When a connection is reset after the service
//     applied a request, the SDK's retry fails (404 MessageNotFound or 400
//     PopReceiptMismatch) and the backend reports driver.ErrLeaseLost: an
//     Ack or dead letter has then in fact happened, and an Extend leaves the
//     job to come back after its lease, one crash counted. Updates are never
//     abandoned halfway by a cancelled ctx: they finish in the background
//     (Close waits for them) and the next call on the delivery uses the new
//     receipt.
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
package azure
