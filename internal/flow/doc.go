// Package flow is the engine of the platform's flow control: limits that hold
// for every worker process at once, kept in the platform's shared store
// (KV), and a per-process limit that costs nothing remote.
//
//   - Semaphore is a cluster-wide counting semaphore: at most N holders of a
//     name (a job type, say) at once, across every process. A holder takes a
//     Slot, renews it while it works and releases it after; a crashed
//     holder's slot comes back when its lease (a TTL) lapses.
//   - Local is the same limit within one process, with no store at all.
//   - Rate is a cluster-wide rate limit (GCRA: one key holding the
//     theoretical arrival time), exact under contention from many processes.
//
// Neither blocks: Semaphore.TryAcquire says whether a slot was free, and
// Rate.Take how long to wait before the next try. Waiting, and how these
// combine (a local limit in front of a cluster-wide one, a rate limit after
// both), is the caller's business.
//
// The store's contents are untrusted: a rate state further ahead than any
// Rate writes, and a slot key that keeps one revision for longer than any
// lease (a key without expiry), are taken for corrupt and replaced, with a
// warning to the Logger of their configuration.
//
// Every limit lives in a few keys of the KV, under a prefix or key the caller
// chooses; nothing else in the store is touched. The package does not import
// the platform: the root package's *Store satisfies KV, and so does a
// driver.Store (which, unlike the root Store, does not check keys, values
// and TTLs itself; this package only ever writes valid ones).
package flow
