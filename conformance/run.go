package conformance

import (
	"context"
	"os"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// Case is one named case of the suite.
type Case struct {
	Name string
	Run  func(t *testing.T, e *env)
}

// Cases lists the suite's cases by name, in the order Run runs them.
func Cases() []string {
	var names []string
	for _, c := range cases() {
		names = append(names, c.Name)
	}
	return names
}

func cases() []Case {
	return []Case{
		{"RoundTrip/AllFields", testRoundTripFields},
		{"RoundTrip/Payloads", testPayloads},
		{"RoundTrip/PayloadLimit", testPayloadLimit},
		{"Payload/Offload10MiB", testOffload10MiB},
		{"Payload/OffloadBoundary", testOffloadBoundary},
		{"Payload/OffloadMissing", testOffloadMissing},
		{"Payload/OffloadLifecycle", testOffloadLifecycle},
		{"TryCount/CountsUp", testTryCountUp},
		{"Retry/DefaultLimit", testDefaultRetryLimit},
		{"Retry/Precedence", testRetryPrecedence},
		{"Retry/BackoffRespected", testBackoffRespected},
		{"Outcome/Invalid", testInvalid},
		{"Outcome/Permanent", testPermanent},
		{"Outcome/Reject", testReject},
		{"Outcome/Panic", testPanic},
		{"Outcome/Timeout", testTimeout},
		{"Outcome/Unhandled", testUnhandled},
		{"Outcome/UnhandledThenHandled", testUnhandledThenHandled},
		{"Outcome/Expired", testExpired},
		{"Outcome/ForeignBytes", testForeignBytes},
		{"Crash/Redelivered", testCrashRedelivered},
		{"Crash/RetryLimitZeroSurvivesCrash", testRetryZeroSurvivesCrash},
		{"Crash/Poison", testPoison},
		{"Crash/PoisonLimitPerType", testPoisonPerType},
		{"Crash/ProcessKill", testProcessKill},
		{"Lease/ExtendedForSlowHandler", testLeaseExtension},
		{"Lease/StaleReceiptRefused", testStaleReceipt},
		{"DeadLetter/Empty", testDeadEmpty},
		{"DeadLetter/PopKeepError", testDeadPopKeepError},
		{"DeadLetter/ConcurrentCallers", testDeadConcurrent},
		{"DeadLetter/ListingLeavesQueue", testDeadListing},
		{"DeadLetter/Redrive", testRedrive},
		{"DeadLetter/Purge", testPurge},
		{"Stop/HandsBackUncounted", testStopHandsBack},
		{"Stop/FinishesRunning", testStopFinishes},
		{"Delivery/ExactlyOnceWithoutFaults", testExactlyOnce},
		{"Delivery/NotBeforeNotEarly", testNotBefore},
	}
}

// childEnv carries the queue to a child process of the ProcessKill case.
const childEnv = "ASYNCPLATFORM_CONFORMANCE_CHILD"

// Run runs every case of the suite against the backends that makeHarness
// opens, each case a parallel subtest with a queue of its own.
func Run(t *testing.T, makeHarness HarnessMaker, opts Options) {
	t.Helper()
	if opts.Lease <= 0 {
		opts.Lease = 500 * time.Millisecond
	}
	if opts.Wait <= 0 {
		opts.Wait = 20 * time.Second
	}
	if q := os.Getenv(childEnv); q != "" {
		runChild(t, makeHarness, opts, q)
		return
	}
	for _, c := range cases() {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, makeHarness, opts, queueName(c.Name))
			c.Run(t, e)
		})
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ok(context.Context, *ap.Job) error { return nil }
