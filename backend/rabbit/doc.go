// Package rabbit is the RabbitMQ backend of asyncplatform, on
// github.com/rabbitmq/amqp091-go. It needs RabbitMQ 3.10 or later and no
// plugin.
//
//	b, err := rabbit.New(ctx, rabbit.Config{URL: "amqp://guest:guest@127.0.0.1:5672/"})
//	p, err := asyncplatform.New(b, asyncplatform.Config{})
//
// # URLs
//
// Importing the package registers the amqp and amqps schemes for
// asyncplatform.Open:
//
//	amqp://guest:guest@127.0.0.1:5672/?prefix=jobs&prefetch=20
//	amqps://user:password@broker.example.com:5671/vhost
//	amqp://user:password@rabbit1:5672,rabbit2:5672,rabbit3:5672/vhost
//
// The query parameters prefix and prefetch set Config.Prefix and
// Config.Prefetch; the rest of the URL, other parameters included, is
// Config.URL for the AMQP client. The nodes of a cluster are listed in the
// host part, separated by commas; they share the URL's user, password,
// vhost and parameters (see Clusters). asyncplatform.Open cannot parse a
// list of IPv6 literals ([::1]:5672,[::1]:5673); Config.URL can. Errors
// show the URL with its password hidden.
//
// # Layout
//
// For a queue q and Config.Prefix p (default "asyncplatform"), all on the
// default exchange:
//
//   - p.q: the work queue, a durable quorum queue (x-queue-type=quorum).
//   - p.q:dead: the dead-letter queue, a durable quorum queue, replicated
//     like the work queue. Records are published to it by the backend (no
//     broker dead-lettering); the AMQP message-id is the job ID, and the
//     header x-asyncplatform-dead-seq (the time of the DeadLetter, in Unix
//     nanoseconds) their order. Older versions used p.q.dead, a classic
//     queue on one node: Declare moves the records of such a queue into
//     p.q:dead (see Dead letters) and leaves it, empty, for DeleteQueue.
//   - p.q.delay.<ms>: the delay queues, one per step of a fixed ladder
//     (50ms, 100ms, 200ms, … doubling up to 104857600ms, about 29h; 22
//     steps). Each is a durable quorum queue with a queue-level
//     x-message-ttl of its step and a dead-letter route
//     (x-dead-letter-exchange "", x-dead-letter-routing-key p.q) back to
//     the work queue, taken at least once (x-dead-letter-strategy
//     at-least-once, which needs x-overflow reject-publish). They are declared the first time a delay needs them
//     and belong to their queue: DeleteQueue removes them with it. (Sharing
//     them between queues would need the route back in each message, which a
//     queue-level dead-letter route cannot carry.)
//   - p:registry: the registry Queues reads (AMQP cannot list queues), a
//     durable quorum queue, replicated like the work queues, with one
//     message per Declare, whose body is the queue's name; each Queues call
//     compacts it (and so does a Declare that finds 1,000 messages),
//     holding the exclusive queue p:queues-lock meanwhile: it takes every
//     message, publishes one per live queue with confirm, and then acks
//     the taken ones with one multiple ack (a crash in between leaves
//     duplicates, never a loss); a Declare waits for its entry's confirm
//     (its ctx, at most Config.PublishTimeout) and fails without it, and
//     waits at most 10s for a compaction it starts (one that fails is
//     logged). Older versions kept a classic p:queues on
//     one node: each Queues call moves its messages into p:registry the
//     same way (those an older version still writes there included) and
//     leaves it, empty; while its node is down it is skipped.
//   - p.q:dead-lock: an exclusive queue that a dead-letter read of q holds
//     while it reads (see Dead letters); it exists only meanwhile.
//
// Every publish is persistent, mandatory, and waits for its publisher
// confirm; a returned (unroutable) publish fails with ErrUnroutable (a
// return is matched to its publish by queue, message-id and instance, so
// that of two publishes of one job at once only the one that came back
// fails: TestReturnedTwinsOnTheBroker), and a
// nacked one is tried again three times (25, 50, 100 ms later: a delay queue
// just declared nacked its first publishes now and then) before it fails
// with ErrNacked, each time on a new channel; the old channel takes no new
// publishes and closes once those under way on it are confirmed (closed at
// once, it made the client take them as not confirmed, and they were sent
// again although stored: two copies of a job). A publish not confirmed when its channel closed is sent
// again, with the same message-id, on the next channel, unless it is the
// successor of a delivery (Requeue, DeadLetter, a hand-back, a delay hop
// or sweep) whose channel or connection closed meanwhile: that delivery
// comes back by itself, and the first publish may be stored, so a second
// one would be a second message with the same counters
// (TestLostConfirmNotSentTwice). When the new copy
// of a Requeue or DeadLetter is not confirmed, the delivery is handed back
// at once (basic.nack with requeue, counted), since nothing else would
// release it before its channel closes.
//
// Delays. Per-message TTL only expires at the head of a queue, so a delay
// queue holds only messages of one TTL, and FIFO order is expiry order: a
// short retry never waits behind a long one. A message due after d is
// published to the largest step not longer than d (the smallest when d is
// shorter than it), with what is left of d in the header
// x-asyncplatform-delay-ms. When it comes back to the work queue with time
// left, Receive does not hand it out: it publishes it on to the next step
// (largest first), confirms, and acks it, so an arbitrary delay takes a few
// hops and is never delivered early; it is late by at most one smallest step
// plus the broker's expiry latency. Each delay publish carries, in the
// header x-asyncplatform-due, when it is due to leave its delay queue.
// Delayed messages wait for a consumer of
// their queue to move them on: with no worker running, a message between hops
// sits in the work queue (counted in Stats as Ready) until one starts.
// Dead-lettering out of the delay queues is at-least-once (RabbitMQ 3.10 or
// later): a message leaves a delay queue only once the work queue has
// confirmed its copy, so a restart of the node can duplicate a delayed job
// but not drop it. Classic delay queues, whose dead-lettering is
// at-most-once, drop the messages they hold across a graceful restart
// (evidence: docs/reliability.md, "RabbitMQ: a delayed copy can be lost
// across a broker restart").
//
// The delay sweeper. A quorum queue expires messages from its head only,
// so a message there that does not expire holds every message behind it
// (see Clusters). Each Backend looks at the delay queues of the queues it
// consumes every Config.DelaySweep (30s by default). A delay queue that
// held messages at two looks in a row is swept (again after its step, or a
// minute, whichever is shorter): the sweeper takes its head (basic.get)
// and moves it to where
// x-asyncplatform-due says (the work queue when due, else the step for what
// is left), with confirm, then ack; while the heads it takes are more than
// a second overdue, it takes the next one too (up to 1,000), and logs each
// at WARN. A message from an older version, without the header, is moved
// to its step again, for a whole step. A stuck message is so late by at
// most a minute or its step, whichever is shorter, plus two sweep periods.
// A process killed during a move leaves a duplicate, never a loss: the
// sweeper touches only queues that stayed non-empty, and at most one
// on-time message each per sweep, to keep that rare.
//
// Connections. A Backend holds one connection: one confirm-mode channel for
// publishing, one channel per consumed queue, and short-lived channels for
// topology and dead letters. A supervisor redials a lost connection: each
// round tries every node of Config.URL once, starting with the one after
// the node it lost, with capped, fully jittered backoff between rounds
// (Config.ReconnectMin to ReconnectMax); it declares every known queue
// again (a queue that cannot be declared is logged and skipped), and
// consumers start again on the next Receive. Every delivery carries the channel it came from (its generation):
// a settle on a channel that has closed returns driver.ErrLeaseLost and can
// never ack another message, even though the new channel reuses the same
// delivery tags; Requeue and DeadLetter do not publish again for a delivery
// whose channel closed meanwhile. While the broker blocks the connection
// (connection.blocked: a memory or disk alarm), publishing methods wait up to
// Config.BlockedTimeout and then fail with ErrBlocked; a publish already sent
// may still be stored once the alarm clears.
//
// # Counting
//
// Delivery.Deliveries is the quorum queue's x-delivery-count plus one (plus
// x-asyncplatform-base, below): x-delivery-count is absent on a message's
// first delivery and rises on every nack-with-requeue and every delivery
// returned by a closed channel or connection. Requeue and DeadLetter publish
// a new copy (confirm, then ack the original), so a copy's count starts at
// zero by itself; a crash between the confirm and the ack leaves a
// duplicate, never a loss (with a Store, only a crash of the process: see
// Gone marks). A consumer's prefetch is the platform's own
// window (its concurrency plus its prefetch), so the broker never pushes
// more than the platform asked for; still, messages can sit in the client's
// buffer without having been handed out (after a settle opened the window).
// Those are handed back uncounted, as a copy carrying the original's count in
// x-asyncplatform-base, when Receive is cancelled, when no Receive comes for
// a lease, and on Close. Any writer to the broker can set that header
// (RabbitMQ overwrites a forged x-delivery-count, TestForgedDeliveryCountFact,
// but not it), so a base counts only when bound or bounded: with
// Config.Store a hand-back writes p:base/<instance> (the copy's instance,
// the base as value, kept 7 days) before it publishes the copy (a key
// another writer took first gets the copy a new instance, up to three,
// then the hand-back fails and the originals return with their bases:
// TestBindBasePreempted), and a
// delivery's base counts only when that key holds it; without a store a
// base counts up to 16. A base that does not count is logged at WARN with
// a *BaseError and the delivery counts the broker's deliveries alone
// (TestForgedBaseNotCounted, TestHandBackBaseKept). A copy handed back by
// an older version, or more than 7 days before its delivery, so loses its
// inherited count. A release collects the consumer's deliveries,
// handing each burst back as it comes, until its window is full or the
// broker is quiet, then cancels it; the originals are acked together, in one
// multiple ack when nothing below them is held. (Its copies go to the queue
// it still consumes, and come back to it while the window has room, to be
// copied again: a long drain, which catches deliveries still on their way
// before the cancel. Publishing the copies only after the cancel made the
// drain short, and TestFaults/PoisonIsolation then charged innocent jobs a
// crash in 3 runs of 3.) The platform releases a consumer before it hands
// back the jobs it claimed ahead (Stop, a pause, a suspect's isolation), so
// that those copies cannot reach it (TestStopReleasesFirst).
//
// Gone marks. An ack is not confirmed: one lost to a cut connection or a
// broker restart after the new copy was confirmed brings the original back,
// counted, beside its copy, and the job then runs on in two lines of
// copies, each counting its own tries (RandomFaults' wrong try counts). With
// Config.Store set, a replacement (Requeue, DeadLetter, a delay hop or
// sweep, a release's hand-back) writes the key p:going/<instance> before it
// writes the copy, and p:gone/<instance> once the copy is stored (the
// going key is deleted when it was not): before its ack, or, for Requeue
// and DeadLetter, after it, on a goroutine of its own, so that the outcome
// the platform reports next waits for no store round trip. The instance is
// the header x-asyncplatform-instance: 128 random bits, new for every
// message and copy this backend publishes, so a writer to the broker
// cannot name a live message it has not read. A delivery that carries
// x-delivery-count or the redelivered flag (it went back to the queue
// unsettled) is looked up first: gone, it is acked and never handed out;
// going, the lookup waits for the writer, at most 2s, then hands it out.
// A Receive looks up what it takes in one store call, and a release looks
// up, marks and publishes what it hands back a burst at a time (one
// lookup, two mark writes and one publish of the copies per burst). Only a
// process that dies between the copy's confirm and the gone write still
// leaves two lines. A gone mark lives 24h, a going mark PublishTimeout
// plus a minute: a replaced message that comes back later runs again.
// Without a store nothing is marked or looked up, and a lost ack leaves
// the two lines. The price: two store writes per Requeue or DeadLetter,
// and one read per Receive that takes a redelivery
// (TestReplacedAckLost, TestReplacingPendingWaits, BenchmarkRequeue,
// BenchmarkReleaseRedelivered).
//
// Lost acks. An ack written just before its connection died may never
// have been applied, and the queue then hands the message out again,
// counted, though the platform had settled it. A Backend remembers the
// instances its consumers acked on its live connection (the last 8,192);
// when the connection is lost, those acked in its last 10s are doubtful
// for 10 minutes (at most 65,536), and a delivery of a doubtful instance
// is acked and never handed out (TestLostAckNotRunAgain). So is any
// delivery of an instance among the remembered acks of the live
// connection: one publish stored twice (an Enqueue whose confirm was lost
// with a killed node is sent again) whose other copy this Backend already
// ran (TestTwinOfAckedDropped). With Config.Store the doubtful ones are
// written as gone marks too, so another process drops their redeliveries
// as well; without one, and for twins, only the Backend that acked does
// (TestCluster/NodeKill).
//
// Twins. A publish whose confirm was lost with a killed node is sent again
// under the same instance, and an Enqueue that failed so is often tried
// again by its caller: the queue may then hold two messages of one job
// (TestCluster/NodeKill traced both). An Enqueue of a job ID to a queue
// with the same body within 10 minutes of a failed Enqueue of it by the
// same Backend publishes under the failed one's instance
// (TestEnqueueRetryTwinDropped; another body is a new job,
// TestReenqueueAfterFailedEnqueueRuns);
// copies a release, a delay hop or a sweep makes carry their publish's
// origin (header x-asyncplatform-origin). A delivery whose origin (or
// instance) a live channel of the same Backend holds is acked and never
// handed out (TestTwinOfHeldDropped, TestTwinCopyDropped), and so is one
// whose origin the Backend handed out and settled in the last 10 minutes
// (at most 65,536); a delivery held on a channel that was lost comes back
// and runs (TestHeldLostNotTwin). No store round trip: twins that reach
// two processes both run.
//
// Settle barrier. RabbitMQ 3.10 holds a channel's settles to a quorum
// queue back once about 32 are unapplied and drops the held ones when the
// channel closes: acked one by one (a handler held a lower tag) and the
// channel closed at that handler's ack or at Close, 27 of 60 originals
// came back counted beside their copies (TestReleaseHeldAcksApplied,
// TestCloseHeldAcksApplied); 80 handler acks then a close, 67 came back
// (TestRetiredManySettlesApplied). So when a released consumer's channel
// has sent more than 16 settle frames since its last barrier, the release,
// and again the close of the channel, first publish on that channel, in
// confirm mode, a marker message (header x-asyncplatform-barrier,
// expiration 0) to the work queue: the queue confirms it only after
// applying every settle sent before it, and the channel sends what it held
// back before it passes that confirm on. The marker takes no message; it
// expires at once where no consumer waits, and a consumer that gets it
// acks it and never hands it out. (A worker of an older version, during a
// rolling upgrade, does not know it: one that gets it hands out a job it
// cannot decode.) A killed process cannot do any of this:
// its buffered messages come back with one more delivery counted, like the
// ones it held.
//
// Acks. Settles on a consumer channel are coalesced like a group commit. The
// first Ack writes its frame; Acks arriving meanwhile queue up, and the next
// frame settles them together: one basic.ack with multiple set, up to the
// highest queued tag H such that every tag up to H on the channel is queued
// or already settled (acked, or nacked by a failed hand-back or delay hop). A
// tag that is not (its delivery is held by a running handler, moved by a
// delay hop or hand-back, or not yet handed out) blocks a multiple ack past
// it, since the broker would settle it too. An Ack above such a tag waits up
// to 200µs for the tags below it, then goes out on its own; once such a wait
// has run out, Acks above the same tag go out on their own at once, so a long
// handler delays the Acks above it once, by 200µs, and never by its own
// length. On a quorum queue each ack frame is a Raft command, so fewer frames
// take load off the broker (about 2.5 settles a frame in BenchmarkEndToEnd).
// Ack, Requeue and DeadLetter return once the frame that settles their
// delivery is written. A multiple ack never leaves the channel of the
// receipt, so the channel-generation check below holds as before.
//
// Leases and consumer_timeout. An unacked delivery is held by its channel for
// as long as the channel lives; Extend is a no-op that only reports whether
// the channel is still there. RabbitMQ 3.10 closes a channel whose delivery
// stays unacked longer than consumer_timeout (30 minutes by default, a global
// setting in rabbitmq.conf; per-queue values came in later versions): a
// handler running longer loses its lease (its settle returns
// driver.ErrLeaseLost) and the job is redelivered with a crash counted. Raise
// consumer_timeout for longer jobs.
//
// # Dead letters
//
// With Config.Store set (the companion store the platform's unique keys,
// pauses and status already need), dead letters live in the store, and
// every dead-letter call costs the same at any depth: a few store calls,
// none of them a read of the queue (TestDeadStoreCostFlat). For queue q,
// the keys are under "p:dead/q/", apart from the platform's own ("p/..."):
// r/<seq> is a record's head (its ID, its size, and its body's first 60
// KiB), c/<seq>/<i> the rest of its body, 60 KiB a key, i/<hash>/<seq> the
// index by ID (hash: the first 128 bits of the SHA-256 of the ID), and
// h/<seq> a hold. seq is the time of the DeadLetter in Unix nanoseconds
// (19 digits), '-' and 16 random hex digits, so keys sort oldest first and
// no writer can take another record's key. Heads read from the store are
// decoded within bounds (the ID at most 4 KiB, the body at most MaxBody
// plus 1 MiB, the parts exactly the lengths the head states); a head that
// is not one (another writer's bytes under a record's key) is handed out
// in its place, its ID its seq and its body the bytes, which the platform
// reports as undecodable, so it can be popped or deleted and never blocks
// the records behind it (TestDeadStoreForeignHead).
//
// DeadLetter writes the parts, then the index key, then the head, and only
// then acks the delivery: a crash in between leaves keys no head names, or
// a duplicate record, never a loss. NextDead lists the heads from the
// first and takes the hold of the first it can (Create with a TTL of
// Config.DeadHold, 30 s by default: Capabilities.DeadHold, renewed by the
// platform with ExtendDead), so two callers are never handed the same
// record, and a record whose caller vanished is visible again DeadHold
// after its last renewal. Close lets go of its holds at once. SettleDead
// with keep deletes the hold at its revision (ErrLeaseLost if it lapsed);
// a pop reads the hold (ErrLeaseLost unless it is still the caller's: the
// platform renews it every DeadHold/3, so two thirds of it are left),
// removes the head, then the parts, the index key and the hold at once.
// ListDead lists the heads after its cursor (the seq of the last record of
// the page before), reads them in one batch, and the parts of large
// records 32 at once. DeleteDead looks its IDs up in the index (1,000 a
// store call), then removes the records in rounds of 500, in the order of a pop:
// it takes the holds of the round (held records stay), reads the heads,
// removes the heads, then the parts, the index keys and the holds; a crash
// in between leaves a held record that is visible again after DeadHold, or
// keys no head names, never half a record. PurgeDead does the same for
// every head, 1,000 keys a page. On a store with batches
// (driver.StoreBatcher, which pgstore implements) a round is four store
// calls, three of them writes (one PostgreSQL commit each); on another
// store each key is a call of its own, 32 at once. These calls use as
// many store connections as they can: give pgstore a pool of 32
// (pool_max_conns=32 in its URL; pgx's default is 4). Stats.Dead counts
// the heads' keys: one count query on a store with driver.StoreCounter
// (pgstore), else a listing of them, 10,000 a call; held records count.
// DeleteQueue removes every key. Records are as durable and as
// replicated as the store: on a RabbitMQ cluster, run the store replicated
// too.
//
// Upgrade to the store. Once a backend has a Store, every dead-letter call
// first moves the records of the quorum queue p.q:dead (and of the classic
// p.q.dead before it, see below) into the store: basic.get, write under a
// seq made of the record's x-asyncplatform-dead-seq and a hash of its ID,
// time and body, then ack. A crash in between leaves the record in the
// queue, and the move done again finds it written: no loss, no copy
// (TestDeadUpgradeToStore). A record an older version holds meanwhile
// moves on a later call, once let go, as do records an older version still
// dead-letters to the queue. Give every process the same Store.
//
// Without a Store, dead letters live in the quorum queue p.q:dead, as
// follows. A quorum queue puts a record it gets back (a nack with requeue, a closed
// channel) at its tail, behind records never handed out
// (TestQuorumRequeueFact), so the queue's order is not the records' order:
// every read sorts by x-asyncplatform-dead-seq. AMQP has no browse, so
// every read takes the records off the queue for a moment: NextDead,
// ListDead, DeleteDead, PurgeDead and a keeping SettleDead take turns,
// across processes and nodes, by holding the exclusive queue
// p.q:dead-lock (the broker deletes it with its connection, so a reader
// that dies lets go); without that, a read beside another saw none of the
// records the other held, and a redrive's DeleteDead left the records it
// had redriven in place. NextDead streams every ready record on a channel
// of its own (a consumer whose prefetch is the count the broker reports,
// up to 65535, then basic.get), keeps the oldest unacked, which hides it
// from every other caller, and hands the others back (basic.nack with
// requeue). SettleDead acks the held record (remove) or nacks it with
// requeue (keep: it is still the oldest, so the next NextDead hands it out
// again). A hold lasts as long as the holder's channel
// (Capabilities.DeadHold is zero), so ExtendDead only reports whether the
// channel is still open; a holder that vanishes closes its channel and the
// record is visible again. ListDead and DeleteDead stream every ready record on a
// side channel, sort them, keep the page or ack the records to delete, and
// close the channel, which hands the rest back. ListDead's cursor is the
// number of records to skip. Each of NextDead, ListDead and DeleteDead so
// costs the whole queue streamed (about 80µs a record here) and, for
// NextDead, a requeue of each record: fine for thousands of records, slow
// for a million. A quorum queue puts records handed back by a closed
// channel back asynchronously (all at once): each read waits, up to 10 s,
// until the queue counts them ready again before it lets go of the lock.
// RabbitMQ 3.10 holds a channel's acks to a quorum queue back beyond a few
// dozen unapplied commands and drops them when the channel closes (500
// acks then a close left up to 466 records in place,
// TestDeleteDeadAcksApplied), so DeleteDead cancels its consumer and makes
// one basic.get before it closes the channel, calls the queue answers only
// once it has applied the acks; and when the queue then counts more
// records than DeleteDead handed back (a record dead-lettered meanwhile,
// or an ack not applied), it reads the queue again for the records it
// acked, acks any still there, and counts as deleted only those gone.
// Records held by NextDead callers are not seen. PurgeDead is queue.purge
// (held records stay). Stats.Dead counts ready records: not those a read
// holds at that instant.
//
// Upgrade from the classic dead-letter queue. Declare looks for the queue's
// classic p.q.dead of the older layout. While it exists, each
// Declare, NextDead, ListDead, DeleteDead and PurgeDead first moves its
// records into p.q:dead: basic.get, publish a copy (same message-id, its
// order from its timestamp) with confirm, then ack, one record at a time, so
// a crash in between leaves a duplicate, never a loss. A record an older
// version holds at that moment is moved by a later call, as are records an
// older version still running dead-letters there; Stats.Dead counts both
// queues meanwhile. The old queue is left in place, empty; DeleteQueue
// removes it, or delete it by hand once no older version runs.
//
// # Limits
//
//   - Config.MaxBody states the broker's max_message_size (16 MiB by
//     default, RabbitMQ 4's; 3.x accepts 128 MiB), which AMQP does not tell
//     a client; the platform's Config.MaxMessage bounds messages below it.
//   - Stats.Ready is the work queue's ready count; Stats.InFlight is -1 (AMQP
//     does not report unacknowledged counts without the management plugin).
//   - A queue that already exists with other arguments (a classic p.q, say)
//     makes Declare fail with ErrIncompatibleQueue, naming the queue and the
//     argument.
//   - Returns are matched to publishes by message-id; two concurrent
//     publishes of the same id to a missing queue may both see the return.
//   - A message published while a consumer is being released can be
//     delivered to it after basic.cancel-ok (quorum queues do that, and the
//     client drops the delivery); it then comes back with one more delivery
//     counted when the channel closes. A release holds the channel's
//     settles until cancel-ok, so no settle opens the window while the
//     cancel is on its way. A cancelled Receive's release (a suspect's
//     isolation, a Stop) and Release first publish a settle barrier, a
//     marker the queue confirms after sending every delivery the consume,
//     the settles and the confirmed copies caused; the marker is counted
//     in Stats.Ready until it reaches the head of the queue, where it
//     expires. Close and the idle release wait instead for two quiet
//     rounds as long as their slowest hand-back (within 200 ms), which a
//     loaded broker can outlast. Either way, a message put in the queue
//     at that instant by anyone else (an enqueue, a handler's Requeue
//     copy, a dead worker's deliveries coming back) can still arrive
//     after cancel-ok, and the barrier is skipped while the connection is
//     blocked.
//   - Without Config.Store there are no gone marks: an ack lost to a cut
//     connection or a broker restart after a Requeue's, DeadLetter's,
//     delay hop's or release's copy was confirmed brings the original back
//     beside its copy, counted, and the job runs on in two lines of copies
//     (see Gone marks), unless the original comes back to the Backend
//     that acked it within 10 minutes (see Lost acks). With a store, a
//     process that dies between the copy's confirm and its gone mark still
//     leaves them.
//   - Two stored messages of one job (a publish re-sent after a lost
//     confirm, an Enqueue tried again after it failed so) both run when
//     they reach two processes, or one Backend more than 10 minutes apart
//     (see Twins), and so do those of an Enqueue tried again with another
//     body (a signed job bound to its queue is signed anew). A job ID
//     enqueued again on purpose with the very same body within 10 minutes
//     of a failed Enqueue of it, by the same Backend, is taken for the same
//     job: it does not run again when its first message ran there.
//
// # Clusters
//
// On a RabbitMQ cluster, list its nodes in Config.URL (or the URL given to
// asyncplatform.Open): amqp://user:pass@rabbit1:5672,rabbit2:5672,rabbit3:5672/.
//
//   - What is replicated: the work, delay and dead-letter queues are quorum
//     queues, each a Raft group with a member on every node of the cluster
//     when it is declared (RabbitMQ's default initial group size), so their
//     messages survive the loss of a minority of nodes; a publish is
//     confirmed once a majority stored it. The Queues registry p:registry
//     is a quorum queue too; the classic p:queues of older versions is not
//     replicated, and Queues moves its names into p:registry (see Layout).
//     Dead-letter queues of the older layout (p.q.dead)
//     are classic: Declare moves their records (see Dead letters).
//   - What a node loss costs: the connection to the lost node closes (at
//     once for a killed process; within two heartbeats, Config.Heartbeat,
//     for a vanished host) and the backend dials the next node of the list
//     at once, the lost one last: measured on 3 loopback nodes of 3.10.8
//     (TestCluster/NodeKill, docs/reliability.md), both clients were on a
//     surviving node and jobs were claimed again within milliseconds of a
//     SIGKILL. Unsettled deliveries of the lost connection come back counted
//     (a crash each), and an ack written just before the loss can be lost
//     with it; its redelivery is dropped (see Lost acks) when it reaches
//     the Backend that acked, or any Backend with a store.
//     Quorum queues whose leader was on the lost node elect another in about
//     a second; a publish meanwhile can be nacked, and a channel whose first
//     publish to the queue was nacked so went on nacking every publish until
//     the lost node came back, so the backend tries a nacked publish again
//     on a new channel. Measured: enqueues and claims went on 3 to 76 ms
//     after the kill of the connected node, no Enqueue failed, lost 0 (3
//     runs). A node nobody was connected to cost nothing measurable.
//   - What the broker can lose: nothing confirmed while a majority of a
//     queue's members lives. A quorum queue SIGKILLed within about 0.8 s of
//     its creation can come back empty on 3.10.8 (rabbitKillLeaves,
//     TestRabbitKillFact); delay queues are created on first use. On
//     3.10.8 a new quorum queue gets its arguments only after the
//     declaring call's start: a second connection declaring it at that
//     moment got declare-ok at once, its publish got no TTL, and it and
//     every message behind it stayed in the delay queue for good
//     (Retry/Precedence, Outcomes/OutputOnePerJob on the cluster; not on
//     one node). Every delay publish now carries the step's TTL as its own
//     expiration, which the queue reads even then (TestCluster/DelayRace).
//     A message that still sticks (rabbitmq-server #10718 reports messages
//     of such queues that never expire; or one an older version left) is
//     moved by the delay sweeper (see Delays): TestCluster/DelayStuck
//     plays the race without the expiration, where 3 runs of 3 stuck
//     without the sweeper and none with it.
//   - A new quorum queue can nack the first publish of a connection other
//     than the one creating it (2 of 120 new queues here; the message was
//     not stored): that publish is tried again on a new channel, and the
//     other publishes under way are not sent twice (see above).
//   - Tested with scripts/cluster/rabbit.sh (3 nodes of the machine's
//     3.10.8 on loopback ports of their own; TestCluster under
//     ASYNCPLATFORM_CLUSTER=rabbit).
package rabbit
