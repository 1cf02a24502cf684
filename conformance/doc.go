// Package conformance is the shared test suite that every asyncplatform
// backend must pass. It drives a real asyncplatform.Platform over the backend
// under test, so it checks the behaviour contract end to end: try counts,
// retry and poison limits, every outcome of an attempt, dead letters,
// leases and shutdown. The contract itself, with the cases that prove each
// of its rules, is docs/contract.md in the repository.
//
// A backend's package calls [Run] from one test, conventionally
// TestConformance in conformance_test.go, with a [HarnessMaker] that gives
// each case a fresh [Harness] (a way to open independent connections to the
// broker under test) and the [Options] its broker needs. The example of Run
// is such a file, complete, for the in-memory backend.
//
// Every case is a named, parallel subtest on a queue of its own; [Cases]
// lists them. The suite adapts to what the backend declares in
// driver.Capabilities (its message limit, its shortest lease, whether it
// redelivers at once on a closed connection) and to the optional
// [Disconnecter], and never skips a case silently: the one case a backend
// may be excused from, Crash/ProcessKill (a worker process killed with
// SIGKILL), needs [Options].SingleProcess with a reason, which the test log
// shows.
//
// On a slow or shared machine, ASYNCPLATFORM_CONFORMANCE_SCALE stretches the
// suite's timings (see Options).
package conformance
