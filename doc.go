// Package asyncplatform runs background jobs with one failure model on every
// broker: RabbitMQ, Redis, NATS JetStream, Azure Queue Storage or in memory.
//
// A [Platform] enqueues jobs ([Platform.Enqueue]), runs a handler per job
// type ([Platform.Handle]) with retries, backoff and poison detection, and
// administers the dead letters of each queue ([Platform.NextDeadLetter]).
// It works over any driver.Backend; the backends live in backend/ (memory,
// redis, rabbit, nats, azure), and [Open] opens one from a URL.
//
// The full contract, with the conformance cases that prove each rule, is
// docs/contract.md in the repository; this overview is its short form.
//
// # A job's life
//
// [Platform.Enqueue] validates the job, fills in its ID, Queue and
// EnqueuedAt, and stores it durably. A worker ([Platform.Start]) claims jobs
// under a lease ([Config].Lease) and extends the lease while it holds them,
// so a handler may run far longer than the lease. Before the handler runs,
// a gate dead-letters a message that is not a job, a job whose Deadline has
// passed, and a job that crashed its workers more than its PoisonLimit
// allows; it requeues a job whose type has no handler yet. Then [Job].TryCount
// goes up by one and the handler runs; what it returns decides, through one
// outcome table, whether the job is acknowledged, written back as its next
// copy (a retry after a backoff delay, a rejection), or dead-lettered.
// [Platform.Stop] finishes running handlers and hands the rest back
// uncounted.
//
// Delivery is at least once: side effects should be idempotent on [Job].ID
// ([Job.CopyNumber] tells a duplicate delivery from a new attempt).
//
// # Failure semantics
//
//	the handler…                     counts as  then                                  dead-letter reason
//	returns nil                      –          acknowledged, gone                    –
//	returns an ordinary error        failure    retried after a backoff delay         –
//	fails more than RetryLimit       failure    dead-lettered                         retries_exceeded
//	returns Invalid(err)             failure    dead-lettered at once                 invalid
//	returns Permanent(err)           failure    dead-lettered at once                 permanent
//	returns Reject(err)              nothing    requeued after RejectDelay            –
//	panics                           failure    like an error; the stack is kept      retries_exceeded
//	runs past its timeout            failure    context cancelled; like an error      retries_exceeded
//	never reports (killed, OOM,      crash      redelivered after the lease; past     poisoned
//	  lost lease)                               PoisonLimit, dead-lettered unrun
//	(no handler for its type)        nothing    requeued UnhandledRetries times,      unhandled
//	                                            then dead-lettered
//	(its Deadline passed)            nothing    dead-lettered without running         expired
//	(its offloaded payload is gone)  nothing    dead-lettered without running         payload_missing
//	(the message is not a job)       nothing    dead-lettered with its raw bytes      invalid
//	(the platform stops first)       nothing    handed back, due now                  –
//
// TryCount is Failures + Crashes + 1 inside a handler. A job that always
// fails runs RetryLimit+1 times (default 10+1); one that always kills its
// worker runs PoisonLimit+1 times (default 3+1). A job that comes back after
// a crash runs alone, so the jobs that were beside it are charged at most
// one of the crashes it causes ([Config].DisableIsolation). The limits, the
// backoff and
// the timeout are set in a [Policy] at four levels, the most specific
// winning: the job's, its type's (given to Handle), its queue's
// ([QueueConfig]) and the platform's ([Config]). Outcomes are matched with
// errors.Is and errors.As, so wrapped errors keep their meaning.
//
// # Dead letters
//
// Each queue has a dead-letter queue. A [DeadLetter] holds the job as last
// attempted (payload, headers, counters, error history), the [Reason], the
// last error and the time. [Platform.NextDeadLetter] hands the oldest record
// to a callback that pops it or keeps it, and two concurrent callers never
// get the same one; [Platform.DeadLetters] lists them without changing
// anything; [Platform.Redrive] sends them back with their counters reset;
// [Platform.PurgeDeadLetters] deletes them. Dead letters are never trimmed:
// no size cap, no age limit.
//
// The package jobtest runs one attempt of a handler through the real
// decision logic, without a broker, for tests of your own handlers.
package asyncplatform
