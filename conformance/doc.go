// Package conformance is the shared test suite that every asyncplatform
// backend must pass. It drives a real asyncplatform.Platform over the backend
// under test, so it checks the behaviour contract end to end: try counts,
// retry and poison limits, every outcome of an attempt, dead letters,
// leases and shutdown; and it calls the backend directly, as the platform
// does, for the rules of driver.Backend that a platform would hide (a
// settle after a lapsed lease, a cancelled Receive, Close, Stats). The
// contract itself, with the cases that prove each of its rules, is
// docs/contract.md in the repository; its section 9 is the backend
// author's, rule by rule.
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
// [Disconnecter], and never skips a case silently: the cases a backend may
// be excused from are those that run real child processes ([RunsChild]
// names them: Crash/ProcessKill, a worker killed with SIGKILL, and the
// cases across processes), and they need [Options].SingleProcess with a
// reason, which the test log shows. The backend also needs a store
// (driver.Store or driver.StoreProvider): the unique, schedule, outcome
// and flow cases keep their state in it.
//
// # Writing the test
//
//  1. A Harness: MakeBackend returns a new, independent connection each
//     call, as another worker process would open (a new client, not a
//     shared one: the suite closes one backend to play a crashed process
//     while the others go on), and every backend it makes sees the same
//     queues. Close releases what the harness itself holds; the suite has
//     closed the backends by then.
//  2. If the broker ties leases to a connection (RabbitMQ), the harness
//     also implements [Disconnecter], cutting a backend's connection as the
//     network would (the backend reconnects by itself).
//  3. Options: leave them zero unless the backend really needs otherwise,
//     and say why in a comment: a longer Lease for a slow broker or one
//     with coarse time (Azure's whole seconds), a longer Wait, the reasons
//     of DuplicatesWithoutFaults and SingleProcess.
//  4. Implement driver.QueueDeleter, so that the suite removes each case's
//     queues (its own, and those it made beside it: QUEUE-b, a pool's
//     QUEUE.p0..., the priority levels QUEUE.prio1..., a group's held
//     queue QUEUE.held.acme); without it the queues stay on the broker.
//
// Run go test -run TestConformance ./yourbackend/, then one case by its
// name: go test -run 'TestConformance/Lease/LapsedReceiptRefused'. A
// failure says which rule broke, in the contract's words.
//
// # How the suite runs
//
// Each case is a subtest that calls t.Parallel, so at most go test's
// -parallel cases (GOMAXPROCS by default) run at once; -parallel 8 runs the
// suite faster on a broker that copes. Run calls the HarnessMaker once per
// case with that case's *testing.T, so a maker may use t.Cleanup and
// t.TempDir for per-case resources (a server of the case's own, say).
//
// A case's queue is named "ct-", up to 24 lower-case letters and digits of
// the case's name, "-" and 8 random hex digits (ct-leaselapsedreceiptrefuse-
// 1a2b3c4d); Retry/Precedence also uses that name with "-b". At the end of
// the case, pass or fail, the suite removes the
// queue through the first of its backends still open (DeleteQueue) and
// closes every backend it opened, then the harness. A run that is killed
// (a go test timeout, ^C) leaves the queues of the cases that were
// running; a key prefix or stream name of the harness's own makes them
// easy to find.
//
// # The child process
//
// Crash/ProcessKill runs a worker in another process and kills it with
// SIGKILL. The suite re-executes the test binary itself (os.Args[0]) with
// -test.run matching exactly that case's full name (for example
// ^TestConformance$/^Crash$/^ProcessKill$, with any subtest levels above
// it) and -test.count=1, with the parent's environment plus
// ASYNCPLATFORM_CONFORMANCE_CHILD set to the case's queue. In the child,
// TestMain and the test function run again up to Run, which then runs only
// the worker: one platform on the parent's queue that writes
// "STARTED <job ID> <try>" to stdout when it takes the job, and hangs until
// it is killed. So everything between TestMain and Run must also work in
// the child: no fixed port that the parent already holds, and a broker that
// the test starts itself must be reachable by the child, its address passed
// in the environment (backend/redis does so for miniredis, backend/nats for
// its in-process server). A backend that cannot share queues across
// processes sets Options.SingleProcess instead.
//
// Unique/ConcurrentProcesses and Schedule/OnePerTickProcesses,
// RestartSkipsMissed and RestartCatchesUp start the test binary the same
// way, several times (ASYNCPLATFORM_CONFORMANCE_PROC names the case, its
// queue and the child's part), and talk to the children over their stdin
// and stdout: 4 processes enqueueing one unique key, 3 running one
// schedule, a scheduler killed with SIGKILL and another started. RunsChild
// names every case with children, for a harness that shares an in-process
// server with them.
//
// # Time budgets
//
// Options.Lease (500ms by default, raised to Capabilities.MinLease) is the
// lease of the suite's platforms and direct Receives; Options.Wait (20s) is
// how long a case waits for an outcome before it fails. A case that waits
// for a lease to lapse takes about a lease, and
// Lease/ExtendedForSlowHandler runs a handler for ten;
// DeadLetter/HeldForSlowCallback holds a dead letter for one and a half
// Capabilities.DeadHold (a lease when it is zero), and
// DeadLetter/HeldForDeadHold for nine tenths of it. The bounds a backend
// must meet, each a rule of the contract:
//
//   - a body of MaxBody bytes comes back from Receive within half of the
//     lease, which runs from the claim (RoundTrip/PayloadLimit);
//   - a due NotBefore, a lapsed lease or a closed connection hands the
//     message to a waiting Receive within a second plus MinLease
//     (Delivery/NotBeforeOnTime, Lease/LapsesOnTime, Close/AbandonsDeliveries);
//   - an idle Receive hands out a new message within 250ms however long it
//     has waited, the second slowest of five after idles of 50ms to 2s
//     (Delivery/WakesOnEnqueue);
//   - Stats shows the queue's depths within five seconds (Stats/Depths);
//   - a dead letter held by a backend that closed is visible again within
//     Wait (Close/ReleasesDeadLetterHolds).
//
// On a slow or shared machine, ASYNCPLATFORM_CONFORMANCE_SCALE (a number
// from 1 to 100) multiplies Lease, Wait and every one of these bounds. The
// bounds are also stretched by the machine's load factor when they are
// checked (the body's half lease up to nine tenths of the lease at most):
// its load average per CPU, from 1 to 2.5 (LoadEnv=1 pins it to 1).
// Nothing in the suite asserts a speed: how many jobs a second a limit lets
// through is a figure the case logs, and the bench measures. The
// suite also watches for stalls of the test process itself (see Options):
// a failure says when the process stalled, and the cases that count
// deliveries tolerate a duplicate that a stall explains.
//
// # The fault suite and the store suite
//
// The conformance suite proves the rules on a healthy broker. The fault
// suite, package conformance/faults, proves "nothing lost" under SIGKILLs,
// broker restarts and connection cuts: a TestFaults in the same
// conformance_test.go calls faults.Run with a faults.Target (its package
// documentation says how; its workers are child processes too, started the
// same way). A backend that keeps shared state (driver.Store) proves it
// with conformance/storetest.Run from a TestStore.
//
// # A stalled case
//
// Every case runs in a goroutine of its own under a deadline,
// Options.CaseDeadline (4 Waits and 60 Leases: 110s by default). A backend
// that breaks a rule can leave the platform waiting for ever (a Receive
// that hands out more than max, say); such a case fails when its deadline
// passes, with "STALLED: case <name>" and the stacks of the goroutines it
// started, which carry a pprof label with its name (what each was waiting
// for). Its backends are then closed, and a case still running 10s later
// is left behind, so that the test ends and the rest of the report prints
// instead of go test's -timeout killing the binary with nothing printed.
// The fault suite's scenarios (faults.Target.Deadline, and Target.Idle for
// a scenario that stops making progress) and the store suite's cases run
// under deadlines too.
//
// # The suite's own test
//
// TestMutations (go test -v -run TestMutations ./conformance/) runs the
// cases against a reference backend of the suite's own, broken in one rule
// at a time, in a child process per mutation, and requires a named case to
// fail for each: every rule of docs/contract.md section 9 is caught. Most
// rules have two mutations: a blunt one, broken everywhere, and a partial
// twin, broken only where the platform never goes or only in part (an
// Extend in the last tenth of a lease, the second holder's dead-letter
// holds, a short early window before a NotBefore, Stats stale until a
// Receive, one more than max); the cases that call the backend directly
// (Lease/ExtendLate, Close/ReleasesEveryHold, Delivery/NotBeforeRace,
// Stats/LapsedAndDue and others) exist for the twins. A case added for a
// new rule comes with its mutations. TestStoreMutations in
// conformance/storetest does the same for the store suite.
package conformance
