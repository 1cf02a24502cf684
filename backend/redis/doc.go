// Package redis is an asyncplatform backend on Redis 7 (standalone, Sentinel
// or Cluster), built on go-redis v9:
//
//	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
//	b, err := redis.New(ctx, redis.Config{Client: rdb})
//	p, err := asyncplatform.New(b, asyncplatform.Config{})
//
// The backend never closes the client it is given.
//
// # URLs
//
// Importing the package registers these schemes for asyncplatform.Open (and
// so for asyncctl and the dashboard):
//
//	redis://:password@127.0.0.1:6379/0?prefix=jobs                one server
//	redis+cluster://:password@h1:7000,h2:7001,h3:7002/?prefix=jobs Redis Cluster
//	redis+sentinel://h1:26379,h2:26380/mymaster/0?password=pw     Sentinel
//	rediss://..., rediss+cluster://..., rediss+sentinel://...     the same over TLS
//
// Each is go-redis's own URL form (ParseURL, ParseClusterURL and
// ParseFailoverURL) with the host list written in the host part: the first
// host becomes go-redis's host and the others its addr parameters, which
// may also be given as such (an IPv6 literal has to be: net/url refuses
// "[::1]:7000,[::1]:7001"; write redis+cluster://[::1]:7000/?addr=[::1]:7001).
//
//   - redis://host:port/db takes one host (a list is refused, naming the two
//     other schemes).
//   - redis+cluster:// takes one or more seed nodes, host:port each; the
//     client learns the others from them. It has no path (a cluster has
//     database 0 only).
//   - redis+sentinel:// takes one or more Sentinels, host:port each, and
//     the master's name as the path, optionally followed by the database
//     (/mymaster/2); master_name= and db= work too. As in go-redis, the
//     user part authenticates to the Sentinels, and the username= and
//     password= parameters to the Redis servers (write the password in both
//     places when they share it).
//
// The parameters prefix (Config.Prefix), wait_replicas and wait_timeout
// (Config.WaitReplicas, WaitTimeout) are ours; every other parameter goes
// to go-redis (dial_timeout, pool_size, max_redirects, ...), which refuses
// one it does not know. A URL that cannot be used is refused with a
// *URLError naming the part at fault; errors never show a password (of the
// user part, or of a password or sentinel_password parameter). The Backend
// opened from a URL owns the client it made and closes it on Close.
//
// # Layout
//
// Every key of one queue starts with the hash tag {prefix:queue}, so a queue
// lives in one Cluster slot and every script can touch all its keys. With the
// default prefix "asyncplatform" and queue "mail":
//
//	{asyncplatform:mail}:seq       string  counter that names stored copies (1, 2, ...)
//	{asyncplatform:mail}:jobs      hash    id -> body; "m:"+id -> lease meta "<deliveries>:<deadline ms>:<token>"
//	{asyncplatform:mail}:ready     list    ids deliverable now (LPUSH in, RPOP out)
//	{asyncplatform:mail}:sched     zset    ids waiting for NotBefore, scored by due time (ms)
//	{asyncplatform:mail}:inflight  zset    ids handed out, scored by lease deadline (ms)
//	{asyncplatform:mail}:signal    list    wake tokens for idle receivers (at most a few)
//	{asyncplatform:mail}:dead      list    dead-letter records, oldest first (RPUSH in)
//	{asyncplatform:mail}:held      zset    hold token -> hold deadline (ms), records out with NextDead
//	{asyncplatform:mail}:heldrec   hash    hold token -> the held record
//	{asyncplatform:mail}:deadrm    string  count of records DeleteDead and PurgeDead removed
//	{asyncplatform}:queues         set     every declared queue's name (Queues), outside the queues' slots
//
// A copy is one stored version of a job's message: Enqueue writes one, and
// Requeue replaces one with a new copy under a new id, so a copy's delivery
// count starts at zero. The lease meta of a copy is absent until its first
// claim and stays (with a stale token) when an expired lease is reaped, so
// the next claim counts on from it. A dead-letter record is stored as
// "<len(id)>:<id><body>" so scripts can match it by job ID without decoding
// the body.
//
// The jobs hash also holds "r:"+id, the ms from which the copy is ready
// (its NotBefore, or its enqueue time), written with the body. Stats reports
// Stats.OldestReady from the first id in line on the ready list: its lease
// deadline when it came back from an expired lease, else its "r:" time
// (unknown for a copy stored before the field existed).
//
// Idle receivers are woken without polling. Enqueue, Requeue and a claim that
// took all it asked for (so work may remain) push a wake token to the queue's
// signal list (only when it is empty, so it never grows). An idle Receive
// waits for the first of: a token, the next due time or lease deadline the
// claim script reported, Config.IdleWait, or its context. Per Backend and
// queue one goroutine blocks in BLPOP on the signal list while anyone waits,
// and broadcasts each token to every idle Receive of that Backend, so many
// idle receivers cost one pooled connection per queue, not one each. Size the
// client's pool for one blocked connection per queue being received from,
// plus the working traffic. Close wakes its own BLPOPs with a token and takes
// back the ones nobody popped.
//
// # Counting
//
// Every state change is one Lua script that reads the server's clock (TIME),
// so worker clocks never matter and no step can be half done:
//
//   - Enqueue writes each body under a fresh id and pushes the id to ready,
//     or to sched when NotBefore is in the future.
//   - Receive's claim script first returns expired leases to ready and
//     promotes due scheduled ids, then pops up to max ids (at most 1000),
//     and for each increments its delivery count and writes its lease (a
//     token unique to this delivery, built from a random per-Backend prefix
//     and counters, and the deadline, in the meta and in inflight) in the
//     same step. A delivery that is never settled is therefore already
//     counted, and its next delivery counts one more: that is how crashes
//     are counted.
//   - Ack, Extend, Requeue and DeadLetter check that the copy's meta still
//     carries the delivery's token and a deadline not yet passed; otherwise
//     they change nothing and return driver.ErrLeaseLost, so a stale receipt
//     never touches a newer delivery. Concurrent Acks on one queue share a
//     script call (group commit: a call goes out at once when none is in
//     progress, and the Acks arriving meanwhile ride on the next one); each
//     is still checked against its own token.
//   - Requeue removes the copy and stores the new body under a new id (count
//     zero) in ready or sched, in one script. DeadLetter removes the copy and
//     appends the record to the dead list, in one script.
//
// The reaper is part of the claim script: there is no background sweeper.
// A claim sweeps (returns expired leases to ready, promotes due scheduled
// jobs, at most 1000 of each) whenever ready alone cannot fill it, and
// otherwise on about one claim in eight, so a busy queue spends fewer
// commands while a due job still moves within a few claims. An idle receiver
// runs the claim at the earliest lease deadline or due time it was told
// about, so expired leases and due jobs move on their own while anyone
// receives from the queue.
//
// # Dead letters
//
// NextDead pops the oldest record into a hold (held and heldrec) under a new
// token, for Config.DeadHold; ExtendDead renews it (the platform does, every
// DeadHold/3, while its caller works); SettleDead removes the record or
// pushes it back at the head of the list. A hold that runs out (its holder
// stopped renewing it, closed or died) is pushed back at the head by the
// next NextDead on the queue, or by the late holder's own SettleDead, which
// then returns driver.ErrLeaseLost. ListDead pages with LRANGE, the
// cursor being the index of the next record; held records are not listed.
// DeleteDead scans the list from the tail in script calls of at most 500
// records each (one LRANGE, an LSET per match, one LREM), so a delete at any
// depth never holds Redis for long, and leaves held records alone; removals
// are counted in deadrm so that a concurrent DeleteDead's removals make a
// window step back rather than skip a record. It is not atomic: a reader may
// see part of a delete. PurgeDead removes held records too, counts them and
// frees the memory with UNLINK. Nothing is ever trimmed.
//
// # Limits
//
// Priorities within a queue (Job.Priority with QueueConfig.Priorities) are a
// queue per level, here three more sets of keys per queue (see Layout), and
// a waiting Receive on each empty level (a blocked connection from the
// client's pool).
//
//   - Capabilities.MinLease is 50ms; leases are kept in milliseconds.
//   - A body is one Redis string: at most proto-max-bulk-len (512 MB by
//     default), a server setting the client cannot read, so
//     Capabilities.MaxBody is 0 and the platform's Config.MaxMessage (32 MiB
//     by default) is what bounds a message.
//   - Close abandons unsettled deliveries as a dying process would; Redis
//     cannot tell that a worker vanished, so they come back when their lease
//     runs out (Capabilities.RedeliversOnClose is false).
//   - Durability is Redis's: without AOF (appendonly yes, appendfsync
//     everysec or always) a Redis restart loses what it held. Keep
//     maxmemory-policy noeviction, or Redis may evict queue keys.
//   - ListDead's index cursor shifts when records are popped or deleted
//     between pages, so a page may then repeat or skip a record.
//   - DeleteDead's calls together scan the whole dead list: a delete of any
//     number of IDs costs about depth/500 script calls, each of which
//     compares at most the whole list in Redis's LREM (in C, no Lua).
//   - Receive hands out at most 1000 messages per call, whatever its max.
//   - Stats counts expired leases and due scheduled jobs as ready.
//
// Browse (driver.Browser) lists a queue's ready, scheduled and in-flight
// copies with one read-only script: ready is the ready list from its out
// end, then lapsed leases, then due copies (the claim's order); scheduled
// and in flight are the rest of their sorted sets. The cursor is a
// position, so a page costs O(log N + page) wherever it starts; a body
// over driver.MaxBrowseBody is measured (HSTRLEN), not read.
//
// # Clusters
//
// Replication is Redis's, and asynchronous: a master acknowledges a write
// before its replicas have it. Every key of a queue shares one hash tag, so
// a queue lives on one shard (master and replicas) of a Redis Cluster, and
// its state moves in whole scripts: a replica's copy is the master's as it
// was a moment earlier, never half a script. The store's keys
// ({prefix}:store:...) and the queue registry ({prefix}:queues) live on
// shards of their own.
//
//   - A failover (Cluster or Sentinel) costs time, not work. In a Redis
//     Cluster the dead master's replica is promoted after
//     cluster-node-timeout (15 s by default) and an election of a second or
//     so; a queue on that shard has no master until then. A New Backend
//     adds a hook to a *goredis.ClusterClient that reloads its slot map
//     whenever a command fails on a connection or a node answers
//     CLUSTERDOWN, so the queue resumes as soon as the replica is promoted
//     (go-redis alone reloads every 60 s, and kept dialling the dead
//     master until then). Measured on loopback with cluster-node-timeout
//     3000: enqueues and claims stalled 4-6 s when the queue's master was
//     SIGKILLed. A master the queue does not use stalls it too, for about a
//     second: with cluster-require-full-coverage yes (the default) every
//     node answers CLUSTERDOWN between the dead master's failure and its
//     replica's promotion. A Sentinel client (redis+sentinel://) follows
//     the new master by itself: it asks the Sentinels for the master at
//     every dial and drops its connections to the old one when they
//     announce the switch. Measured on loopback with
//     down-after-milliseconds 3000: enqueues resumed 2.4-3.6 s after the
//     master was SIGKILLed, lost 0. Claims resume with them unless a
//     platform health check (the Backend's Ping) ran during the failover:
//     then the platform takes no job until its next check passes, up to
//     asyncplatform.Config.HealthInterval later (10 s by default; claims
//     resumed 11-12 s after the kill in those runs, 3-4 s with a 1 s
//     interval).
//   - What a failover can lose is the writes the master acknowledged and
//     had not yet sent to the promoted replica. In this backend's terms: an
//     Enqueue (the job is gone); a claim, Ack, Extend, Requeue or
//     DeadLetter (the job comes back from its earlier state: a duplicate,
//     and a lost claim is not counted in Delivery.Deliveries); a NextDead
//     hold or SettleDead (the record is back in the dead list); a store
//     write (a unique key or a schedule's tick reverts: a duplicate job or
//     tick). Only the first loses a job.
//   - Config.WaitReplicas (URL wait_replicas=1) closes that hole for
//     Enqueue: it returns only once WAIT reports that many replicas hold the
//     write, and fails with ErrNotReplicated otherwise (the jobs may be
//     stored; a retry may store them twice). It costs a round trip to the
//     replica on every Enqueue, and availability: a shard with fewer live
//     replicas than asked refuses every Enqueue until one is back, so with
//     one replica per master a node loss stops enqueueing to its shard until
//     the node returns (measured: 10.4 s, against 5 s without). Keep two
//     replicas per master to enqueue through the loss of one node. WAIT
//     narrows, and does not close, Redis's own windows: a write can still
//     be lost if the replica that has it is not the one promoted, or to a
//     partition that leaves a master writable on the minority side for up
//     to cluster-node-timeout.
//   - Tested on a Redis Cluster 7.0 of 3 masters and 3 replicas on
//     loopback (scripts/cluster/redis.sh; TestClusterConformance and
//     TestClusterNodeKill), and on a master, a replica and three Sentinels
//     (scripts/cluster/redis-sentinel.sh; TestSentinelFailover: two
//     failovers under load, lost 0), all under
//     ASYNCPLATFORM_CLUSTER=redis; figures in docs/reliability.md.
package redis
