package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

type (
	driverMessage = driver.Message
	deadMessage   = driver.DeadMessage
)

var errLeaseLost = driver.ErrLeaseLost

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

// ---- round trip ----

func testRoundTripFields(t *testing.T, e *env) {
	got := make(chan ap.Job, 1)
	w := e.worker(e.config()).handle(t, "rt", func(_ context.Context, j *ap.Job) error {
		got <- *j
		return nil
	})
	deadline := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	notBefore := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	job := &ap.Job{
		ID:        "id-" + e.queue,
		Type:      "rt",
		Payload:   []byte("payload \x00\xff"),
		Headers:   map[string]string{"traceparent": "00-abc-def-01", "ünïcode": "välue", "empty": ""},
		NotBefore: notBefore,
		Deadline:  deadline,
		Policy:    ap.Policy{RetryLimit: ap.Limit(7), PoisonLimit: ap.Limit(2), Timeout: 42 * time.Second},
	}
	e.enqueue(w.P, job)
	if job.EnqueuedAt.IsZero() {
		t.Errorf("Enqueue did not set EnqueuedAt")
	}
	w.start(t)
	var j ap.Job
	select {
	case j = <-got:
	case <-time.After(e.opts.Wait):
		t.Fatalf("job never delivered\n%s", e.rec)
	}
	if j.ID != job.ID || j.Type != "rt" || j.Queue != e.queue || !bytes.Equal(j.Payload, job.Payload) {
		t.Errorf("got ID %q Type %q Queue %q Payload %q; want %q %q %q %q", j.ID, j.Type, j.Queue, j.Payload, job.ID, "rt", e.queue, job.Payload)
	}
	if len(j.Headers) != len(job.Headers) {
		t.Errorf("headers: got %v, want %v", j.Headers, job.Headers)
	}
	for k, v := range job.Headers {
		if got, ok := j.Headers[k]; !ok || got != v {
			t.Errorf("header %q: got %q (present %v), want %q", k, got, ok, v)
		}
	}
	if !j.EnqueuedAt.Equal(job.EnqueuedAt) || !j.Deadline.Equal(deadline) || !j.NotBefore.Equal(notBefore) {
		t.Errorf("times: EnqueuedAt %v/%v Deadline %v/%v NotBefore %v/%v", j.EnqueuedAt, job.EnqueuedAt, j.Deadline, deadline, j.NotBefore, notBefore)
	}
	if j.Policy.RetryLimit == nil || *j.Policy.RetryLimit != 7 || j.Policy.PoisonLimit == nil || *j.Policy.PoisonLimit != 2 || j.Policy.Timeout != 42*time.Second {
		t.Errorf("policy did not round-trip: %+v", j.Policy)
	}
	if j.TryCount != 1 || j.Failures != 0 || j.Crashes != 0 || len(j.Errors) != 0 {
		t.Errorf("first attempt: TryCount %d Failures %d Crashes %d Errors %v; want 1 0 0 none", j.TryCount, j.Failures, j.Crashes, j.Errors)
	}
	if job.TryCount != 0 {
		t.Errorf("an enqueued job has TryCount %d, want 0", job.TryCount)
	}
}

func testPayloads(t *testing.T, e *env) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	payloads := map[string][]byte{
		"nil":     nil,
		"empty":   {},
		"binary":  all,
		"invalid": []byte{0xff, 0xfe, 0xc3, 0x28},
		"text":    []byte(`{"hello":"world"}`),
	}
	got := map[string][]byte{}
	done := make(chan struct{}, len(payloads))
	w := e.worker(e.config()).handle(t, "p", func(_ context.Context, j *ap.Job) error {
		e.rec.mu.Lock()
		got[j.ID] = append([]byte{}, j.Payload...)
		e.rec.mu.Unlock()
		done <- struct{}{}
		return nil
	})
	for name, p := range payloads {
		e.enqueue(w.P, &ap.Job{ID: name + "-" + e.queue, Type: "p", Payload: p})
	}
	w.start(t)
	for range payloads {
		select {
		case <-done:
		case <-time.After(e.opts.Wait):
			t.Fatalf("not every payload was delivered\n%s", e.rec)
		}
	}
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	for name, p := range payloads {
		if g := got[name+"-"+e.queue]; !bytes.Equal(g, p) {
			t.Errorf("payload %s: got %x, want %x", name, g, p)
		}
	}
}

func testPayloadLimit(t *testing.T, e *env) {
	got := make(chan int, 4)
	w := e.worker(e.config()).handle(t, "big", func(_ context.Context, j *ap.Job) error {
		for i, c := range j.Payload {
			if c != byte(i*7) {
				return ap.Permanent(fmt.Errorf("byte %d differs", i))
			}
		}
		got <- len(j.Payload)
		return nil
	})
	w.start(t)
	probe := ap.Job{ID: "0190c0de-0000-7000-8000-000000000000", Type: "big", Queue: e.queue}
	limit := w.P.MaxPayload(probe)
	if limit < 0 {
		limit = 1 << 20 // no limit declared: a 1 MiB payload must pass
		t.Logf("the backend declares no message limit; sending %d bytes", limit)
	} else {
		t.Logf("the backend carries payloads up to %d bytes (MaxBody %d)", limit, e.caps.MaxBody)
	}
	mk := func(n int) *ap.Job {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(i * 7)
		}
		j := probe
		j.ID = fmt.Sprintf("0190c0de-0000-7000-8000-%012d", n%1_000_000_000_000)
		j.Payload = p
		return &j
	}
	e.enqueue(w.P, mk(limit-1))
	e.enqueue(w.P, mk(limit))
	if e.caps.MaxBody > 0 {
		err := w.P.Enqueue(ctxT(t, e.opts.Wait), mk(limit+1))
		if !errors.Is(err, ap.ErrPayloadTooLarge) {
			t.Errorf("a payload one byte over the limit: got %v, want ErrPayloadTooLarge", err)
		}
	}
	seen := map[int]bool{}
	for range 2 {
		select {
		case n := <-got:
			seen[n] = true
		case <-time.After(e.opts.Wait):
			t.Fatalf("limit-sized payloads not delivered intact (got %v)\n%s", seen, e.rec)
		}
	}
	if !seen[limit-1] || !seen[limit] {
		t.Errorf("delivered sizes %v, want %d and %d", seen, limit-1, limit)
	}
}

// ---- try counts and retries ----

func testTryCountUp(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "flaky", func(_ context.Context, j *ap.Job) error {
		if j.TryCount < 3 {
			return fmt.Errorf("failure %d", j.TryCount)
		}
		return nil
	})
	job := &ap.Job{Type: "flaky"}
	e.enqueue(w.P, job)
	w.start(t)
	e.waitFor("a success on the third try", func() bool {
		o := e.rec.outcomes(job.ID)
		return len(o) == 3 && o[2].Outcome == ap.OutcomeSucceeded
	})
	e.settle()
	got := e.rec.of(job.ID)
	checkTries(t, got, [3]int{1, 0, 0}, [3]int{2, 1, 0}, [3]int{3, 2, 0})
	if n := len(got[2].Job.Errors); n != 2 {
		t.Errorf("third attempt sees %d error lines, want 2: %q", n, got[2].Job.Errors)
	}
	if len(e.dead(w.P)) != 0 {
		t.Errorf("a job that succeeded was dead-lettered")
	}
}

func failing(context.Context, *ap.Job) error { return errors.New("always fails") }

func testDefaultRetryLimit(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "fail", failing)
	job := &ap.Job{Type: "fail"}
	e.enqueue(w.P, job)
	w.start(t)
	dls := e.waitDead(w.P, 1)
	if n := e.rec.count(job.ID); n != ap.DefaultRetryLimit+1 {
		t.Errorf("attempts = %d, want DefaultRetryLimit+1 = %d", n, ap.DefaultRetryLimit+1)
	}
	dl := dls[0]
	if dl.Reason != ap.ReasonRetriesExceeded || dl.Job.ID != job.ID {
		t.Errorf("dead letter %s reason %q, want %s %q", dl.Job.ID, dl.Reason, job.ID, ap.ReasonRetriesExceeded)
	}
	if dl.Job.TryCount != ap.DefaultRetryLimit+1 || dl.Job.Failures != ap.DefaultRetryLimit+1 || dl.Job.Crashes != 0 {
		t.Errorf("dead letter counters TryCount/Failures/Crashes = %d/%d/%d", dl.Job.TryCount, dl.Job.Failures, dl.Job.Crashes)
	}
	if len(dl.Job.Errors) != ap.DefaultRetryLimit+1 || dl.Error != "always fails" {
		t.Errorf("dead letter error %q, history %d lines", dl.Error, len(dl.Job.Errors))
	}
	if dl.Worker == "" || dl.DeadAt.IsZero() || dl.Queue != e.queue {
		t.Errorf("dead letter worker %q, time %v, queue %q", dl.Worker, dl.DeadAt, dl.Queue)
	}
}

func testRetryPrecedence(t *testing.T, e *env) {
	// platform 4 < queue 3 < type 2 < job; a second queue has no policy of its own.
	other := e.queue + "-b"
	cfg := e.config()
	cfg.Policy.RetryLimit = ap.Limit(4)
	cfg.Queues = map[string]ap.QueueConfig{
		e.queue: {Concurrency: 4, Policy: ap.Policy{RetryLimit: ap.Limit(3)}},
		other:   {Concurrency: 4},
	}
	w := e.worker(cfg).
		handle(t, "typed", failing, ap.Policy{RetryLimit: ap.Limit(1)}).
		handle(t, "plain", failing)
	t.Cleanup(func() { _, _ = w.P.PurgeDeadLetters(context.Background(), other) })
	cases := []struct {
		job  *ap.Job
		want int
	}{
		{&ap.Job{Type: "plain"}, 4}, // queue
		{&ap.Job{Type: "typed"}, 2}, // type
		{&ap.Job{Type: "typed", Policy: ap.Policy{RetryLimit: ap.Limit(0)}}, 1}, // job
		{&ap.Job{Type: "plain", Queue: other}, 5},                               // platform
	}
	for _, c := range cases {
		e.enqueue(w.P, c.job)
	}
	w.start(t)
	e.waitDead(w.P, 3)
	e.waitFor("the other queue's dead letter", func() bool {
		page, err := w.P.DeadLetters(context.Background(), other, "", 10)
		return err == nil && len(page.Letters) == 1
	})
	if d, ok := w.B.(driver.QueueDeleter); ok {
		t.Cleanup(func() { _ = d.DeleteQueue(context.Background(), other) })
	}
	for i, c := range cases {
		if n := e.rec.count(c.job.ID); n != c.want {
			t.Errorf("case %d (%s, queue %s): %d attempts, want %d", i, c.job.Type, c.job.Queue, n, c.want)
		}
	}
}

func testBackoffRespected(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Policy.BackoffBase, cfg.Policy.BackoffCap = 400*time.Millisecond, 400*time.Millisecond
	w := e.worker(cfg).handle(t, "once", func(_ context.Context, j *ap.Job) error {
		if j.TryCount == 1 {
			return errors.New("first try fails")
		}
		return nil
	})
	job := &ap.Job{Type: "once"}
	e.enqueue(w.P, job)
	w.start(t)
	// The retry may start before the first attempt's hook has run (the
	// jitter can be near 0): wait for both.
	e.waitFor("the retry", func() bool { return e.rec.count(job.ID) == 2 && len(e.rec.outcomes(job.ID)) >= 1 })
	o := e.rec.outcomes(job.ID)[0]
	if o.Outcome != ap.OutcomeRetried {
		t.Fatalf("first outcome %q, want retried", o.Outcome)
	}
	second := e.rec.of(job.ID)[1].At
	if second.Before(o.RetryAt) {
		t.Errorf("the retry ran %v before its backoff ended", o.RetryAt.Sub(second))
	}
	first := e.rec.of(job.ID)[0].At
	if gap := o.RetryAt.Sub(first); gap > 400*time.Millisecond+o.Duration+50*time.Millisecond {
		t.Errorf("backoff %v exceeds the 400ms cap", gap)
	}
}

// ---- outcomes ----

func testDeadAtOnce(t *testing.T, e *env, ret error, reason ap.Reason) {
	w := e.worker(e.config()).handle(t, "t", func(context.Context, *ap.Job) error { return ret })
	job := &ap.Job{Type: "t"}
	e.enqueue(w.P, job)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	e.settle()
	if n := e.rec.count(job.ID); n != 1 {
		t.Errorf("%d attempts, want 1 (never retried)", n)
	}
	if dl.Reason != reason || dl.Job.Failures != 1 || dl.Job.TryCount != 1 {
		t.Errorf("dead letter reason %q failures %d tries %d; want %q 1 1", dl.Reason, dl.Job.Failures, dl.Job.TryCount, reason)
	}
	if dl.Error != ret.Error() {
		t.Errorf("dead letter error %q, want %q", dl.Error, ret.Error())
	}
}

func testInvalid(t *testing.T, e *env) {
	testDeadAtOnce(t, e, ap.Invalid(errors.New("bad json")), ap.ReasonInvalid)
}

func testPermanent(t *testing.T, e *env) {
	testDeadAtOnce(t, e, fmt.Errorf("wrapped: %w", ap.Permanent(errors.New("no such account"))), ap.ReasonPermanent)
}

func testReject(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Policy.RetryLimit = ap.Limit(0)
	w := e.worker(cfg).handle(t, "r", func(_ context.Context, j *ap.Job) error {
		if e.rec.count(j.ID) <= 3 {
			return ap.Reject(errors.New("dependency down"))
		}
		return nil
	})
	job := &ap.Job{Type: "r"}
	e.enqueue(w.P, job)
	w.start(t)
	e.waitFor("success after three rejects", func() bool {
		o := e.rec.outcomes(job.ID)
		return len(o) == 4 && o[3].Outcome == ap.OutcomeSucceeded
	})
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0}, [3]int{1, 0, 0}, [3]int{1, 0, 0}, [3]int{1, 0, 0})
	if len(e.dead(w.P)) != 0 {
		t.Errorf("a rejected job with RetryLimit 0 was dead-lettered: Reject must not count")
	}
}

func testPanic(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Policy.RetryLimit = ap.Limit(1)
	w := e.worker(cfg).handle(t, "boom", func(context.Context, *ap.Job) error { panic("kaboom") })
	job := &ap.Job{Type: "boom"}
	e.enqueue(w.P, job)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	if n := e.rec.count(job.ID); n != 2 {
		t.Errorf("%d attempts, want 2 (a panic is a failure, retried)", n)
	}
	if dl.Reason != ap.ReasonRetriesExceeded || !bytes.Contains([]byte(dl.Error), []byte("kaboom")) || !bytes.Contains([]byte(dl.Error), []byte("goroutine")) {
		t.Errorf("dead letter reason %q error %q; want retries_exceeded with the panic and its stack", dl.Reason, dl.Error)
	}
}

func testTimeout(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "slow", func(ctx context.Context, _ *ap.Job) error {
		<-ctx.Done()
		return ctx.Err()
	}, ap.Policy{Timeout: 100 * time.Millisecond, RetryLimit: ap.Limit(1)})
	job := &ap.Job{Type: "slow"}
	e.enqueue(w.P, job)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0}, [3]int{2, 1, 0})
	if dl.Reason != ap.ReasonRetriesExceeded || !bytes.Contains([]byte(dl.Error), []byte("timed out")) {
		t.Errorf("dead letter reason %q error %q; want retries_exceeded, timed out", dl.Reason, dl.Error)
	}
}

func testUnhandled(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "known", ok)
	job := &ap.Job{Type: "unknown"}
	e.enqueue(w.P, job)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	if dl.Reason != ap.ReasonUnhandled || dl.Job.ID != job.ID || dl.Job.TryCount != 0 {
		t.Errorf("dead letter reason %q job %s tries %d; want unhandled %s 0", dl.Reason, dl.Job.ID, dl.Job.TryCount, job.ID)
	}
	if n := e.rec.count(job.ID); n != 0 {
		t.Errorf("%d handler calls for a job with no handler", n)
	}
}

func testUnhandledThenHandled(t *testing.T, e *env) {
	cfg := e.config()
	cfg.UnhandledRetries = ap.Limit(1000)
	w := e.worker(cfg)
	job := &ap.Job{Type: "late"}
	e.enqueue(w.P, job)
	w.start(t)
	time.Sleep(200 * time.Millisecond) // a few requeues while no handler exists
	w.handle(t, "late", ok)            // the rolling deploy arrives
	e.waitFor("the late handler to run", func() bool { return e.rec.count(job.ID) == 1 })
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0})
}

func testExpired(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "e", ok)
	job := &ap.Job{Type: "e", Deadline: time.Now().Add(100 * time.Millisecond)}
	e.enqueue(w.P, job)
	time.Sleep(200 * time.Millisecond)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	if dl.Reason != ap.ReasonExpired || dl.Job.ID != job.ID {
		t.Errorf("dead letter reason %q job %s; want expired %s", dl.Reason, dl.Job.ID, job.ID)
	}
	if n := e.rec.count(job.ID); n != 0 {
		t.Errorf("an expired job ran %d times", n)
	}
}

func testForeignBytes(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "x", ok)
	garbage := [][]byte{[]byte("not a job"), {0xA5, 'J', 1, 0xff, 0xff}, {}}
	ctx := ctxT(t, e.opts.Wait)
	if err := w.B.Declare(ctx, e.queue); err != nil {
		t.Fatal(err)
	}
	for i, g := range garbage {
		if err := w.B.Enqueue(ctx, e.queue, []driverMessage{{ID: fmt.Sprintf("garbage-%d", i), Body: g}}); err != nil {
			t.Fatalf("writing garbage straight to the queue: %v", err)
		}
	}
	good := &ap.Job{Type: "x"}
	e.enqueue(w.P, good)
	w.start(t)
	dls := e.waitDead(w.P, len(garbage))
	found := map[string]bool{}
	for _, dl := range dls {
		if dl.Reason != ap.ReasonInvalid || dl.Raw == nil {
			t.Errorf("dead letter reason %q raw %v; want invalid with the raw bytes", dl.Reason, dl.Raw != nil)
		}
		found[string(dl.Raw)] = true
	}
	for _, g := range garbage {
		if !found[string(g)] {
			t.Errorf("garbage %q not kept in a dead letter", g)
		}
	}
	e.waitFor("the good job behind the garbage", func() bool { return e.rec.count(good.ID) == 1 })
}

// ---- crashes and poison ----

// blocker returns a handler that signals started and blocks until released
// (or its context ends).
func blocker() (ap.Handler, chan string, chan struct{}) {
	started, release := make(chan string, 16), make(chan struct{})
	return func(ctx context.Context, j *ap.Job) error {
		started <- j.ID
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}, started, release
}

// crashOnce runs a worker that takes the job and then dies (its backend is
// closed under it without an outcome).
func (e *env) crashOnce(t *testing.T, jobType string, policy ...ap.Policy) bool {
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 1, Prefetch: ap.Limit(0)}}
	h, started, release := blocker()
	w := e.worker(cfg).handle(t, jobType, h, policy...).start(t)
	defer close(release)
	select {
	case <-started:
		_ = w.B.Close() // the process dies
		return true
	case <-time.After(e.opts.Wait):
		return false
	}
}

func testCrashRedelivered(t *testing.T, e *env) {
	job := &ap.Job{Type: "c"}
	e.enqueue(e.producer(), job)
	if !e.crashOnce(t, "c") {
		t.Fatalf("the first worker never got the job")
	}
	w := e.worker(e.config()).handle(t, "c", ok).start(t)
	e.waitFor("redelivery after the crash", func() bool { return e.rec.count(job.ID) == 2 })
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0}, [3]int{2, 0, 1})
	e.settle()
	if n := e.rec.count(job.ID); n != 2 {
		t.Errorf("%d attempts after the redelivery succeeded, want 2", n)
	}
	_ = w
}

func testRetryZeroSurvivesCrash(t *testing.T, e *env) {
	job := &ap.Job{Type: "z", Policy: ap.Policy{RetryLimit: ap.Limit(0)}}
	e.enqueue(e.producer(), job)
	if !e.crashOnce(t, "z") {
		t.Fatalf("the first worker never got the job")
	}
	w := e.worker(e.config()).handle(t, "z", ok).start(t)
	// The dead worker's late "lease lost" may be recorded after the
	// success: look for the success anywhere.
	e.waitFor("the job to survive the crash", func() bool {
		for _, o := range e.rec.outcomes(job.ID) {
			if o.Outcome == ap.OutcomeSucceeded {
				return true
			}
		}
		return false
	})
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0}, [3]int{2, 0, 1})
	if len(e.dead(w.P)) != 0 {
		t.Errorf("a RetryLimit(0) job was dead-lettered after one crash")
	}
}

func poison(t *testing.T, e *env, limit int, policy ...ap.Policy) {
	bad := &ap.Job{Type: "poison"}
	e.enqueue(e.producer(), bad)
	for i := range limit + 1 {
		if !e.crashOnce(t, "poison", policy...) {
			t.Fatalf("crash %d: the worker never got the job", i+1)
		}
	}
	good := &ap.Job{Type: "good"}
	p := e.producer()
	e.enqueue(p, good)
	h, started, release := blocker()
	close(release)
	go func() {
		for range started {
		}
	}()
	w := e.worker(e.config()).handle(t, "poison", h, policy...).handle(t, "good", ok).start(t)
	dl := e.waitDead(w.P, 1)[0]
	e.waitFor("the good job", func() bool { return e.rec.count(good.ID) == 1 })
	if dl.Reason != ap.ReasonPoisoned || dl.Job.ID != bad.ID || dl.Job.Crashes != limit+1 || dl.Job.TryCount != limit+1 {
		t.Errorf("dead letter reason %q job %s crashes %d tries %d; want poisoned %s %d %d", dl.Reason, dl.Job.ID, dl.Job.Crashes, dl.Job.TryCount, bad.ID, limit+1, limit+1)
	}
	if n := e.rec.count(bad.ID); n != limit+1 {
		t.Errorf("the poison job was attempted %d times, want PoisonLimit+1 = %d", n, limit+1)
	}
	checkTries(t, e.rec.of(good.ID), [3]int{1, 0, 0})
}

func testPoison(t *testing.T, e *env) { poison(t, e, ap.DefaultPoisonLimit) }

func testPoisonPerType(t *testing.T, e *env) {
	poison(t, e, 1, ap.Policy{PoisonLimit: ap.Limit(1)})
}

// ---- leases ----

func testLeaseExtension(t *testing.T, e *env) {
	hold := 10 * e.lease
	slow := func(ctx context.Context, _ *ap.Job) error {
		select {
		case <-time.After(hold):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	job := &ap.Job{Type: "slow"}
	e.enqueue(e.producer(), job)
	for range 2 { // two workers compete for it
		e.worker(e.config()).handle(t, "slow", slow).start(t)
	}
	e.waitLonger(hold, "the slow job to finish", func() bool {
		o := e.rec.outcomes(job.ID)
		return len(o) > 0
	})
	e.settle()
	if o := e.rec.outcomes(job.ID); len(o) != 1 || o[0].Outcome != ap.OutcomeSucceeded {
		t.Errorf("outcomes %+v, want one success", o)
	}
	if n := e.rec.count(job.ID); n != 1 {
		t.Errorf("a handler running %v (10 leases) was delivered %d times, want 1", hold, n)
	}
}

func testStaleReceipt(t *testing.T, e *env) {
	ctx := ctxT(t, 2*e.opts.Wait)
	p := e.producer()
	job := &ap.Job{Type: "s"}
	e.enqueue(p, job)
	b1, b2 := e.backend(), e.backend()
	ds, err := b1.Receive(ctx, e.queue, 1, e.lease)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %v, %d deliveries", err, len(ds))
	}
	d1 := ds[0]
	if dis, ok := e.h.(Disconnecter); ok {
		if err := dis.Disconnect(ctx, b1); err != nil {
			t.Fatalf("Disconnect: %v", err)
		}
	}
	// b2 gets the job once b1's lease lapses (or its connection is cut).
	rctx, cancel := context.WithTimeout(ctx, e.opts.Wait)
	defer cancel()
	ds, err = b2.Receive(rctx, e.queue, 1, e.lease)
	if err != nil || len(ds) != 1 {
		t.Fatalf("the job never came back after the first lease was lost: %v", err)
	}
	d2 := ds[0]
	if d2.Deliveries != d1.Deliveries+1 {
		t.Errorf("second delivery counts %d, want %d", d2.Deliveries, d1.Deliveries+1)
	}
	for name, call := range map[string]func() error{
		"Ack":        func() error { return b1.Ack(ctx, d1) },
		"Extend":     func() error { return b1.Extend(ctx, d1, e.lease) },
		"Requeue":    func() error { return b1.Requeue(ctx, d1, driverMessage{ID: job.ID + ".x", Body: d1.Body}) },
		"DeadLetter": func() error { return b1.DeadLetter(ctx, d1, deadMessage{ID: job.ID, Body: []byte("x")}) },
	} {
		if err := call(); !errors.Is(err, errLeaseLost) {
			t.Errorf("%s with a stale receipt: got %v, want ErrLeaseLost", name, err)
		}
	}
	if err := b2.Ack(ctx, d2); err != nil {
		t.Fatalf("Ack of the live delivery: %v", err)
	}
	st, err := p.Stats(ctx, e.queue)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 && st.Ready != -1 || st.Dead > 0 {
		t.Errorf("after the live ack the queue has %+v; the stale calls must not have acted", st)
	}
}
