// Package nats is an asyncplatform backend on NATS JetStream, written with
// nats.go and its jetstream package. It works on nats-server 2.9 and later
// (checked on 2.9.10 and, in process, 2.15).
//
//	b, err := nats.New(ctx, nats.Config{URL: "nats://127.0.0.1:4222"})
//	p, err := asyncplatform.New(b, asyncplatform.Config{})
//
// # URLs
//
// Importing the package registers the nats scheme for asyncplatform.Open:
//
//	nats://user:password@127.0.0.1:4222?stream=JOBS
//	nats://user:password@10.0.0.1:4222,10.0.0.2:4222,10.0.0.3:4222?replicas=3
//
// The hosts, comma-separated, are the servers the client may dial
// (Config.URL, one server URL each; it learns the rest of a cluster from
// the one it reaches); the user part (user:password, or a token alone)
// reaches whichever it dials. The query parameters: stream sets
// Config.Stream, replicas (1 to 5) Config.Replicas; any other is an error.
// Without replicas, existing streams are taken with their own replica
// count, so a URL opens a platform's R3 streams as they are. A Backend
// opened from a URL dials its own connection and closes it on Close.
//
// # Layout
//
// A platform (Config.Stream, "ASYNCPLATFORM" by default; S below) owns three
// streams, a fourth once dead letters are handed out or deleted, and a fifth
// on an old server; a queue q appears in each as one subject token, q with
// '_' written "__" and '.' written "_d":
//
//   - S, work-queue retention, subjects S.q.*: the jobs. Each queue has a
//     durable pull consumer "w_<q>" filtered on S.q.<q>, explicit ack,
//     MaxDeliver unlimited, AckWait = the lease Receive is given.
//   - S_DELAY, work-queue retention, subjects S.delay.*: copies with a
//     NotBefore ahead (scheduled jobs and retries in backoff), each with an
//     Asyncplatform-Not-Before header. One durable consumer, "mover", shared
//     by every Backend.
//   - S_DEAD, limits retention with no limits, subjects S.dead.*: dead
//     letters, each with an Asyncplatform-Id header (the job ID). Each queue
//     has a durable pull consumer "d_<q>" used only to hand records out.
//   - S_HOLD, limits retention, one message per subject, subjects
//     S.hold.>: a marker per dead letter held by NextDead or being deleted
//     by DeleteDead (see Dead letters), made on first use.
//   - S_CLAIM, on nats-server before 2.10.14 only, limits retention,
//     subjects S.claim.>: one claim per first delivery in flight, kept
//     until it is deleted in bulk, at most about 5 s after its settle (see
//     Counting), made on first use.
//
// Storage (file by default), replicas and the MaxMsgs/MaxBytes limits apply to
// the first three streams (S_HOLD and S_CLAIM take the storage and
// replicas, never a limit). Limits use the "new" discard policy: a full stream refuses
// publishes with an error, and never drops a stored message.
// Publishes carry Nats-Msg-Id = <q>/#<Message.Dedupe>, so a retried
// publish of the same copy, by this worker or another, is stored once
// within Config.DuplicateWindow; the platform makes Dedupe unguessable
// (Capabilities.Deduplicates), so no writer to the broker can publish
// ahead of a copy and have the real one dropped. A message without a
// Dedupe (a job written by an earlier version) carries <q>/<Message.ID>,
// a name anyone can predict. Bodies are
// stored untouched; everything of the backend's own is in headers.
//
// Delays. nats-server 2.9 has no delayed publish, and NakWithDelay cannot
// change a message. A copy due later goes to S_DELAY. Every Backend runs a
// mover goroutine (stopped by Close) that pulls from the mover consumer: a
// due copy is published to S with its Nats-Msg-Id, and the delayed copy is
// acked once that publish is acked; a copy not yet due is naked with its
// remaining delay, so it returns to some mover when due and the mover never
// polls. The mover consumer has MaxAckPending unlimited, so copies scheduled
// far ahead never block due ones. A message is never moved before its
// NotBefore by the mover's clock; it is usually moved within milliseconds
// after. Clocks of the enqueuer and the mover should agree. A delayed copy
// held by a mover that closed or died comes back after Config.MoverAckWait
// (5s), so it can be that late.
//
// # Counting
//
// Delivery.Deliveries is the consumer's NumDelivered, read from the ack
// subject, plus the message's Asyncplatform-Base header when it has one.
// Every Requeue and DeadLetter writes a new message (a new stream sequence),
// whose count starts again at 1 with no base. The base is only written by a
// hand-back (see Receiving, below): it carries the deliveries of the old
// message before the one handed back, so earlier crashes stay counted. Nak is
// never used on the work stream.
//
// Requeue and DeadLetter publish the new copy, wait for its publish ack, and
// only then ack the delivery: a crash in between leaves a duplicate, never a
// loss.
//
// Claims. nats-server before 2.10.14 can hand a message that a live worker
// holds out again, as a first delivery: when a lapsed lease's redelivery
// finds only stale pull requests waiting (a killed worker's long poll
// stays on the server until it next looks), the server drops it and moves
// the consumer back onto the newest message it delivered
// (TestStaleRequestFact; nats-server PR #5305). Two workers would then hold
// one message, one of them seeing its crashes uncounted. On such a server
// (New logs a warning) each first delivery is claimed before Receive hands
// it out: a publish to S_CLAIM on a subject naming the message (its stream
// sequence and timestamp) with Nats-Expected-Last-Subject-Sequence 0, all
// of a Receive's claims at once, one round trip. A delivery whose claim is
// refused was handed out before: it is not handed out, and nothing is sent
// for it, so the earlier holder keeps it or it comes back with its crash
// counted (TestNoSecondHolderAfterStaleRequest). Once a delivery is
// settled its claim is deleted later and in bulk, without waiting for the
// answer: a purge a bucket of 1024 stream sequences once the consumer's
// ack floor passes it, one purge of the queue's claims when nothing is
// pending, a delete of its own after 5 s or at Close
// (TestUnclaimInBulk, TestUnclaimBucketBelowFloor); a claim left behind (a
// worker killed in between) names a message that never comes again. See
// claim.go.
//
// Leases and stale receipts. The server does not check which delivery an ack
// belongs to: an ack, a progress update or a term names only the stream
// sequence, so once a message was redelivered, the first delivery's ack
// subject acts on the new delivery (TestRawAckIsNotChecked shows 2.9.10
// acking it; in the 2.15 source progress updates and terms, too, look at the
// stream sequence only). So the backend keeps each delivery's lease itself,
// from below. The lease starts when a no-wait pull request was sent (before
// the server could deliver), or when a long-polled message was read (the
// server sent it earlier, by one transit plus however long this process took
// to read it). Extend restarts it only when the server confirmed the
// InProgress before the lease ended. Nothing is sent for a delivery once less
// than a fifth of the AckWait (at most 2s) is left: Ack, Extend, Requeue and
// DeadLetter return driver.ErrLeaseLost instead. Acks are double acks (the
// server confirms). What that margin does not cover (an ack in transit longer
// than it, or a process that stalls longer than it between the socket and the
// read of a long-polled message) can still act on a newer delivery, which
// only ever causes a duplicate.
//
// The AckWait is per consumer, not per delivery. Receive creates the
// consumer on first use and updates it when asked for another lease, so
// with several processes asking for different leases on one queue the last
// one wins, and a process that asked for a longer lease than the consumer
// now has may ack after the server redelivered. Give every worker of a queue
// the same lease. Extend restarts the AckWait; it cannot grant more than
// the AckWait, so callers extend at least that often (the platform does so
// every lease/3).
//
// Close abandons unsettled deliveries (they come back after AckWait, with
// the crash counted): Capabilities.RedeliversOnClose is false.
//
// Receiving. Receive uses its own pull requests rather than jetstream's
// Fetch. Each Receive subscribes a fresh inbox, asks for up to max messages
// without waiting and, if none are ready, long-polls (Config.PollWait) for
// one and returns it as soon as it comes (what else is ready then is the
// next Receive's: the first job of a burst does not wait a round trip; on
// a server that needs claims, see claim.go, the rest of the burst is
// claimed in a round trip of its own, one after the first's).
//
// A pull request cannot be withdrawn. Unsubscribing its inbox makes the
// server skip it for new deliveries (it checks interest first), but a
// message it chose just before still arrives, to nobody, and comes back
// after its AckWait counted as a crash: at every graceful Stop this would
// now and then spend a try of an innocent job. So a Receive whose ctx ends
// returns at once and leaves its request to a drain goroutine, which hands
// back whatever still arrives without counting that delivery: a new copy is
// published with a base (the deliveries before it), then the delivery is
// acked. On a single server of 2.10.14 and later the Receive first drains
// its inbox's subscription: the UNSUB goes out at once, ahead of whatever the process
// publishes next, and the inbox takes what the server sent before it saw
// it, until a flush comes back. Before 2.10.14 the request keeps its inbox
// until the server ends it (at most PollWait): there an unsubscribed
// request is a stale one, which makes the server drop a lapsed lease's
// redelivery and count it twice (see Claims). In a cluster too: the
// consumer's leader may be another server, which can still send a message
// over a route after the flush, lost to nobody and counted
// (Delivery/CancelledReceiveUncounted failed so on three 2.15.2 nodes).
// The difference shows when
// the platform isolates a suspect: it cancels the Receive, hands back what
// it had queued (new copies) and runs the suspect, which may kill the
// process; a request still open takes one of those copies, and if the
// process dies while the drain hands it back, an innocent job is charged a
// crash (the fault suite's PoisonIsolation: about 1 run in 20 on 2.9.10,
// and on one 2.15.2 before the UNSUB; TestCancelledReceiveSkipsLaterCopies).
// Close waits for the drains, so the usual shutdown (the platform's Stop,
// then Close) counts no crash; a Receive still running at Close is
// abandoned, the crash Close stands for. A pull under way when the
// connection reconnects (its server died or restarted) is left to a drain
// the same way, and sent again at once: the request may have died with that
// server. So is a work or delay pull the server has not ended by PollWait
// plus 5s (a loaded 2.9.10 now and then did not): its inbox is kept for as
// long again, so a late message is handed back, not lost to nobody
// (TestPullWithoutAnswer).
//
// # Dead letters
//
// NextDead pulls one record from the queue's dead-letter consumer
// (AckWait = Config.DeadHold). A delivered, unacked record is pending on
// the consumer and not given to anyone else, so two callers never hold the
// same record; ExtendDead renews the hold with InProgress (the platform
// calls it every DeadHold/3 until SettleDead). SettleDead(remove) deletes
// the record from the stream, then acks it; SettleDead(keep) naks it, which
// puts it first in line again (redeliveries come before new records). A
// caller that dies without settling releases it after DeadHold; a Backend
// that closes naks its held records at once. ListDead walks the stream by subject with the
// STREAM.MSG.GET next_by_subj request (the cursor is the next sequence to
// read and how many records were listed before it); PurgeDead walks and
// deletes by sequence. DeleteDead reads the queue's records through an
// ephemeral consumer filtered on its subject (streamed, a few requests a
// call where a walk by lookups makes one a record) and deletes 32 at a
// time, so a redrive in chunks costs O(records) requests
// (TestDeleteDeadLinear).
// Dead letters are kept until deleted; nothing expires them.
//
// Holds. The server tells no one which records are pending on a consumer,
// so DeleteDead learns what NextDead callers hold from markers on S_HOLD
// (subject S.hold.<q>.<record's sequence>), each written with
// Nats-Expected-Last-Subject-Sequence, so of two writers one wins: "h"
// while a NextDead caller holds the record (renewed with each InProgress),
// "d" while a DeleteDead deletes it. A marker stands for its lease from its
// server timestamp, judged by the reader's clock (keep clocks in sync).
// DeleteDead leaves, and does not count, a record with a live hold;
// NextDead passes by a record a DeleteDead is deleting, and checks after
// its hold that the record still exists. A SettleDead whose hold another
// marker replaced returns driver.ErrLeaseLost. Cost: NextDead three round
// trips more, SettleDead one more, DeleteDead one conditional publish per
// record, all of them sent at once. See hold.go. PurgeDead deletes held
// records too.
//
// nats-server 2.9 can lose a message from its per-subject index: when a
// subject's newest message is deleted and then its oldest, one remaining
// message is invisible to every lookup by subject, and a consumer filtered
// on the subject passes it by for good (TestDeadInterleavedDeletes; it
// takes two queues' records in one message block). The backend checks the
// walks against the subject's message count, which stays right: when they
// fall short, ListDead, DeleteDead and PurgeDead (and DeleteQueue) also scan
// the whole stream, one lookup per message of any queue; and NextDead,
// when its consumer has nothing to deliver while the count says records are
// there that nobody holds, moves each passed-by record to the end of the
// stream (a copy published, then the original deleted), where the consumer
// finds it. ListDead lists such records after the others.
//
// No purges. The backend never purges a stream that has consumers. On
// nats-server 2.9.10 a purge filtered on one subject moves every consumer of
// the stream past all its messages, those of other subjects included: they
// stay in the stream and are never delivered (TestFilteredPurgeFact shows it;
// 2.15 is fine). PurgeDead and DeleteQueue therefore delete message by
// message, two round trips each (S_CLAIM, which has no consumer, is purged).
//
// # Limits
//
// Priorities within a queue (Job.Priority with QueueConfig.Priorities) are a
// queue per level, here three more queues per queue, each laid out as in
// Layout, and a waiting Receive on each empty level (a pull request).
//
// The server's max_payload (1 MiB by default) bounds a message with its
// headers. Capabilities.MaxBody is max_payload minus HeaderReserve (16 KiB),
// which leaves room for the headers and for a dead-letter record, which
// carries a job of up to MaxBody plus its reason and error history. IDs are
// limited to MaxIDLen bytes.
//
// Stats: a delivery whose lease lapsed counts InFlight, not Ready, until
// the server hands it out again (to the next Receive): JetStream's
// consumer info counts it as pending an ack and cannot tell it from a live
// one. The suite's Stats/LapsedAndDue is a known defect of this backend.
//
// Reconnects and restarts. The connection reconnects forever (every 250ms).
// Deliveries survive a reconnect and a server restart (JetStream keeps the
// consumer state), so their receipts stay valid for as long as their lease
// lasts. The 2.9 file store syncs every 60s: an OS crash can lose
// acknowledged writes.
//
// A SIGKILL of the server loses its last moments of consumer state (written
// at most every 100 ms): acked messages can come back, and a delivery be
// forgotten and handed out again as a first delivery. Both are duplicates
// under at-least-once; the forgotten delivery's attempt goes uncounted if
// its worker died too (before 2.10.14, the claims refuse such a delivery
// when its claim outlived the kill: see Counting). On 2.9 it also loses
// recent deletes, which leaves
// acked messages in the stream below the consumer's ack floor, never
// delivered again. The backend sweeps those: when it first pulls from a
// consumer and after every reconnect, it deletes its messages below the ack
// floor (see sweep.go; a few lookups when there is nothing to delete).
//
// Browse (driver.Browser) reads with stream message gets by subject (one
// request per message; no consumer is made or changed): ready is the work
// stream's copies after the work consumer's last delivered sequence, and
// the page is partial while the consumer has pending acknowledgements or
// redeliveries (a lapsed copy is not told apart from one in flight);
// scheduled is the delay stream's copies in stream order; in flight is
// an empty, partial page. On 2.9 a get by subject relies on the subject
// index that can lose a message (see Dead letters): a browse may miss it.
//
// # Clusters
//
// On a JetStream cluster, give the URL (or Config.URL) several nodes and
// set replicas=3 (Config.Replicas) when the streams are first made; every
// other process, asyncctl and the dashboard can open them without it.
//
//   - What is replicated: with Replicas 3, every stream the backend makes
//     (work, delay, dead letters, holds, claims, and the store's KV bucket)
//     and, with them, their consumers (each has the stream's replica count),
//     so the queue, its delivery counts and its dead-letter holds survive
//     the loss of one node of three. A publish is acknowledged once a
//     majority of the stream's replicas stored it (Raft), so a single node
//     loss loses nothing acknowledged.
//   - What a node loss costs: the client reconnects to another node in
//     about ReconnectWait (250 ms) and a pull under way is sent again at
//     once. When the lost node led a stream or consumer, the others elect a
//     new leader first: requests to it fail or time out meanwhile: Enqueue
//     returns the error (a retry of the same job is stored once within
//     DuplicateWindow, by its Nats-Msg-Id), and Receive tries again. Measured on 3 loopback nodes
//     of 2.9.10 (TestClusterNodeKill, docs/reliability.md), the connected
//     node or another killed: enqueues and claims went on within 0.01 to
//     7 s, depending on which leaders the node held; nothing lost, no
//     duplicate in three runs. Deliveries held at
//     the loss stay held: their receipts stay valid for their lease.
//     Duplicates come from acks lost with the node (the job comes back
//     after its lease, counted).
//   - What the broker can lose: nothing acknowledged while a majority of a
//     stream's replicas lives; a majority lost at once (two nodes of
//     three) stops the stream until one returns, and loses the writes only
//     its failed replicas had. Each node syncs its file store every 60 s
//     (2.9), so nodes lost together to a power cut can lose acknowledged
//     writes, as a single server does; a SIGKILL of one node of three lost
//     nothing in TestClusterNodeKill (the others hold every acknowledged
//     write and the consumers' state).
//   - Versions: run every node on 2.10.14 or later. Before 2.9.21 a
//     replicated stream checks Nats-Expected-Last-Subject-Sequence before
//     the write is proposed, not as part of it, so concurrent conditional
//     publishes can all be stored (nats-server #4320; TestClusterCASFact:
//     43 to 47 rounds of 50 on three 2.9.10 nodes, none on 2.15.2): the
//     store's compare-and-swap is not atomic there (a schedule's tick fired
//     by two processes, a unique job stored twice: the conformance suite's
//     Schedule/OnePerTick fails on such a cluster), nor the dead-letter
//     holds; New warns. The backend decides whether to claim first
//     deliveries (see Counting) by the version of the node it is connected
//     to; in a cluster mixing versions (an upgrade under way) a consumer led
//     by an older node has the bug while the client sits on a newer one,
//     and nothing is claimed.
//   - The store's bucket, when replicated, has direct gets turned off: a
//     follower answering a read could be behind a write just made.
//   - Tested with scripts/cluster/nats.sh (3 nodes on loopback, of the
//     machine's 2.9.10 or of 2.15.2 built by scripts/nats-current.sh;
//     TestClusterConformance, TestClusterNodeKill and TestClusterCASFact
//     under ASYNCPLATFORM_CLUSTER=nats).
package nats
