// Package faults is the fault-injection suite: it proves "nothing lost" on a
// backend under crashes, restarts and cuts, and counts what at-least-once
// delivery costs in duplicates.
//
// Each scenario runs jobs through real asyncplatform.Platform workers, in
// this process or in child processes (the test binary re-executed, see Run),
// while it hurts them: SIGKILL mid-job, a job that kills its worker every
// time, a broker restart (graceful and SIGKILL, on a broker of the test's
// own), connection cuts through a TCP proxy, a handler that outlives its
// lease with extension turned off, foreign bytes written straight to the
// queue, a storm of transient rejections, a crash inside DeadLetter, four
// concurrent NextDeadLetter callers, a NextDeadLetter caller SIGKILLed
// while it holds a record, and SIGTERM mid-job.
//
// Two scenarios run workflows (on a backend with a store): a worker killed
// in the settle of a join's last parent, before or after the ack (the kill
// made by the worker itself, Plan.DieAtSettle, so its point is the same on
// every run), and random SIGKILLs under a batch with an OnSuccess callback.
// The parent records an acknowledged enqueue of every step, and checks on
// top of the figures that the workflows succeeded and that the join and the
// callback ran once (a second completion allowed only where their own
// worker died after the commit).
//
// Every worker appends its events to a history (one JSON line per write, so
// a SIGKILL loses nothing already written): the parent's acknowledged and
// indeterminate enqueues, and each attempt's start (with the counters the
// handler saw) and end (ok, fail, reject, cancel). A handler writes its end
// just before it returns, so "ok" is the commit point of the job's work. At
// the end the dead letters are drained, and Check reports the figures of
// RabbitMQ's Jepsen checker:
//
//   - lost: an acknowledged enqueue (or a foreign message) that neither
//     completed nor reached the dead-letter queue;
//   - duplicated: completed more than once, or completed and dead-lettered,
//     or dead-lettered twice (allowed where a fault explains it);
//   - unexpected: completed or dead-lettered but never enqueued;
//   - wrong try count: an attempt that was not counted, TryCount ≠
//     failures + crashes + 1, a
//     failure counted that did not happen, dead-letter counters that do not
//     match the limit, or a scenario's own expectation (no try spent by
//     Reject or SIGTERM, exactly PoisonLimit+1 attempts of a poison job);
//   - empty: nothing ready, scheduled, in flight or dead at the end.
//
// Whether an attempt was counted is read from the counters and the copy
// (Job.Copy) each attempt saw. A later attempt with the same failures and
// crashes as an earlier one is, on the same copy, a duplicate delivery
// (counted as redelivered, not wrong) if the earlier attempt reached an
// outcome the platform tried to report (its report may have been lost in
// the fault), and an uncounted crash (wrong) if it reached none: its worker
// died, or its lease was lost. On a newer copy it is wrong after a counted
// failure, and right after a Reject, a hand-back or a success (a copy newer
// than a succeeded one was written uncounted by a second delivery of it); a
// crash is judged on its own copy. On an older copy it is right. Each
// earlier attempt is judged by how it ended in the end (check.go,
// checkStarts).
//
// The suite runs per backend: each backend's folder has a TestFaults (in its
// conformance_test.go) that calls Run with a Target opening that backend,
// so a backend of its own adds itself without touching this package, which
// imports no backend. The broker fact tests (what a broker itself does,
// shown with its client library alone) live beside their backend too.
//
// The short mode is part of the ordinary test run (seconds per backend);
// "go test -run TestFaults ./backend/..." runs the suite alone on every
// backend, and ./backend/redis/ on one. ASYNCPLATFORM_SOAK=10m (see Soak)
// runs every scenario with five times the jobs and faults, plus
// RandomFaults: minutes of random kills, SIGTERMs, cuts, broker restarts and
// garbage under a mixed load. Set ASYNCPLATFORM_FAULTS_REPORT to a file to
// collect each scenario's figures as Markdown table rows (every backend's
// rows in the one file), and ASYNCPLATFORM_FAULTS_VERBOSE=1 for the
// platforms' warnings.
//
// Everything is loopback-only and bounded: every wait is capped (patience),
// nothing is asserted on time, and the machine's shared brokers are never
// stopped: a restart uses a broker of the test's own on another port, or a
// proxy outage.
package faults
