package conformance

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/conformance/internal/casewatch"
)

// testCase is one named case of the suite.
type testCase struct {
	name string
	run  func(t *testing.T, e *env)
}

// Cases lists the names of the suite's cases, in the order Run runs them.
// Each is a subtest of the test that calls Run: "Outcome/Reject" runs as
// TestConformance/Outcome/Reject.
func Cases() []string {
	var names []string
	for _, c := range cases() {
		names = append(names, c.name)
	}
	return names
}

func cases() []testCase {
	return []testCase{
		// roundtrip.go, payload.go
		{"RoundTrip/AllFields", testRoundTripFields},
		{"RoundTrip/Payloads", testPayloads},
		{"RoundTrip/PayloadLimit", testPayloadLimit},
		{"Payload/Offload10MiB", testOffload10MiB},
		{"Payload/OffloadBoundary", testOffloadBoundary},
		{"Payload/OffloadMissing", testOffloadMissing},
		{"Payload/OffloadLifecycle", testOffloadLifecycle},
		// retry.go
		{"TryCount/CountsUp", testTryCountUp},
		{"Retry/DefaultLimit", testDefaultRetryLimit},
		{"Retry/Precedence", testRetryPrecedence},
		{"Retry/BackoffRespected", testBackoffRespected},
		// outcome.go
		{"Outcome/Invalid", testInvalid},
		{"Outcome/Permanent", testPermanent},
		{"Outcome/Reject", testReject},
		{"Outcome/Panic", testPanic},
		{"Outcome/Timeout", testTimeout},
		{"Outcome/Unhandled", testUnhandled},
		{"Outcome/UnhandledThenHandled", testUnhandledThenHandled},
		{"Outcome/Expired", testExpired},
		{"Outcome/ForeignBytes", testForeignBytes},
		// crash.go
		{"Crash/Redelivered", testCrashRedelivered},
		{"Crash/RetryLimitZeroSurvivesCrash", testRetryZeroSurvivesCrash},
		{"Crash/Poison", testPoison},
		{"Crash/PoisonLimitPerType", testPoisonPerType},
		{"Crash/PoisonIsolation", testPoisonIsolation},
		{"Crash/ProcessKill", testProcessKill},
		// lease.go
		{"Lease/ExtendedForSlowHandler", testLeaseExtension},
		{"Lease/StaleReceiptRefused", testStaleReceipt},
		{"Lease/LapsedReceiptRefused", testLapsedReceipt},
		{"Lease/LapsesOnTime", testLapsesOnTime},
		{"Lease/ExtendLate", testExtendLate},
		{"Lease/HeldWholeBatch", testHeldWholeBatch},
		{"Lease/SettlesRedelivered", testSettlesRedelivered},
		// deadletter.go
		{"DeadLetter/Empty", testDeadEmpty},
		{"DeadLetter/PopKeepError", testDeadPopKeepError},
		{"DeadLetter/ConcurrentCallers", testDeadConcurrent},
		{"DeadLetter/ListingLeavesQueue", testDeadListing},
		{"DeadLetter/Redrive", testRedrive},
		{"DeadLetter/Purge", testPurge},
		{"DeadLetter/DeleteLeavesHeld", testDeleteLeavesHeld},
		{"DeadLetter/HeldForSlowCallback", testHeldForSlowCallback},
		{"DeadLetter/ExtendDeadLate", testExtendDeadLate},
		{"DeadLetter/OldestFreeFirst", testOldestFreeFirst},
		{"DeadLetter/HeldForDeadHold", testHeldForDeadHold},
		// stop.go
		{"Stop/HandsBackUncounted", testStopHandsBack},
		{"Stop/FinishesRunning", testStopFinishes},
		// delivery.go, receive.go
		{"Delivery/ExactlyOnceWithoutFaults", testExactlyOnce},
		{"Delivery/NotBeforeNotEarly", testNotBefore},
		{"Delivery/NotBeforeOnTime", testNotBeforeOnTime},
		{"Delivery/NotBeforeRace", testNotBeforeRace},
		{"Delivery/ReceiveBatch", testReceiveBatch},
		{"Delivery/WakesOnEnqueue", testWakesOnEnqueue},
		{"Delivery/CancelledReceiveUncounted", testCancelledReceive},
		// close.go
		{"Close/ErrClosed", testErrClosed},
		{"Close/AbandonsDeliveries", testCloseAbandons},
		{"Close/ReleasesDeadLetterHolds", testCloseReleasesHolds},
		{"Close/ReleasesEveryHold", testCloseReleasesEveryHold},
		// stats.go
		{"Stats/Depths", testStatsDepths},
		{"Stats/LapsedAndDue", testStatsLapsedAndDue},
		{"Stats/OldestReady", testStatsOldestReady},
		// browse.go
		{"Browse/LeavesQueue", testBrowseLeavesQueue},
		{"Browse/LapsedIsReady", testBrowseLapsedIsReady},

		{"Flow/Pause", testPause},
		{"Flow/StrictOrder", testStrictOrder},
		{"Flow/Weighted", testWeighted},
		{"Flow/PriorityWithinQueue", testPriorityWithinQueue},
		{"Flow/PauseGroup", testPauseGroup},
		{"Flow/PauseGroupSignedLevels", testPauseGroupSignedLevels},
		{"Flow/ClusterConcurrency", testClusterConcurrency},
		{"Flow/RateLimit", testRateLimit},
		// outcomes.go
		{"Outcomes/StatusWalk", testStatusWalk},
		{"Outcomes/ResultJSON", testResultJSON},
		{"Outcomes/StatusAfterStop", testStatusAfterStop},
		{"Outcomes/CancelWaiting", testCancelWaiting},
		{"Outcomes/CancelRunning", testCancelRunning},
		{"Outcomes/CancelFailsBeforePoll", testCancelFailsBeforePoll},
		// output.go
		{"Outcomes/OutputOnePerJob", testOutputOnePerJob},
		{"Outcomes/OutputSurvivesKill", testOutputSurvivesKill},
		// unique.go, schedule.go
		{"Unique/ConcurrentEnqueue", testUniqueConcurrent},
		{"Unique/FreeAfterSuccess", testUniqueAfterSuccess},
		{"Unique/FreeAfterDeadLetter", testUniqueAfterDeadLetter},
		{"Unique/FreeAfterWindow", testUniqueAfterWindow},
		{"Unique/ConcurrentProcesses", testUniqueProcesses},
		{"Unique/BatchPartlyHeld", testUniqueBatchPartlyHeld},
		{"Schedule/OnePerTick", testScheduleOnePerTick},
		{"Schedule/OnePerTickProcesses", testScheduleProcesses},
		{"Schedule/RestartSkipsMissed", testScheduleRestartSkips},
		{"Schedule/RestartCatchesUp", testScheduleRestartCatchUp},
		// workflow.go
		{"Workflow/Chain", testWorkflowChain},
		{"Workflow/Diamond", testWorkflowDiamond},
		{"Workflow/FanIn", testWorkflowFanIn},
		{"Workflow/DependencyFailedRedrive", testWorkflowDependencyFailed},
		{"Workflow/Cancel", testWorkflowCancel},
		{"Workflow/BatchOnSuccess", testWorkflowBatchOnSuccess},
	}
}

// Run runs every case of the suite against the backends that makeHarness
// opens, each case a parallel subtest of t with a queue of its own (see
// Cases). Call it from one test function of the backend's package,
// TestConformance by convention. It reads ASYNCPLATFORM_CONFORMANCE_SCALE:
// see Options.
func Run(t *testing.T, makeHarness HarnessMaker, opts Options) {
	t.Helper()
	if opts.Lease <= 0 {
		opts.Lease = 500 * time.Millisecond
	}
	if opts.Wait <= 0 {
		opts.Wait = 20 * time.Second
	}
	scale, err := timeScale()
	if err != nil {
		t.Fatal(err)
	}
	opts.Lease, opts.Wait = scaled(opts.Lease, scale), scaled(opts.Wait, scale)
	if opts.CaseDeadline <= 0 {
		opts.CaseDeadline = 4*opts.Wait + 60*opts.Lease
	} else {
		opts.CaseDeadline = scaled(opts.CaseDeadline, scale)
	}
	if v := os.Getenv(procEnv); v != "" { // procs.go
		runProc(t, makeHarness, opts, v)
		return
	}
	t.Cleanup(stalls.start()) // runs once every case has finished
	for _, c := range cases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if why, ok := opts.KnownDefects[c.name]; ok {
				t.Skipf("KNOWN DEFECT of this backend (it does not conform here): %s", why)
			}
			// The case's own deadline: a stalled case fails, named, with its
			// goroutines' stacks, and the rest of the report still prints.
			var current atomic.Pointer[env]
			casewatch.Run(t, opts.CaseDeadline, caseGrace, func() {
				if e := current.Load(); e != nil {
					e.abort()
				}
			}, func() {
				e := newEnv(t, makeHarness, opts, scale, queueName(c.name))
				current.Store(e)
				c.run(t, e)
			})
		})
	}
}

// caseGrace is how long a stalled case has to end once its backends are
// closed before the suite leaves it behind.
const caseGrace = 10 * time.Second

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ok(context.Context, *ap.Job) error { return nil }
