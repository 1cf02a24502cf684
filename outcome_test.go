package asyncplatform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/executor"
	"github.com/asyncplatform/asyncplatform/internal/status"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// outcomeRow is one row of the README's failure-semantics table, as the
// pipeline decides it: decode, gate, run, decide.
type outcomeRow struct {
	readme string // the README row's first cell

	notAJob     bool  // the message is not a job
	failures    int   // the job's failures before this delivery
	crashes     int   // crashes before this delivery (its deliveries ended with no outcome)
	unhandled   int   // requeues for want of a handler so far
	noHandler   bool  // no handler registered for its type
	expired     bool  // its Deadline has passed
	err         error // what the handler returned
	stopping    bool  // the platform is stopping
	payloadGone bool  // its offloaded payload is gone
	timedOut    bool  // the handler ran past its timeout
	cancelled   bool  // Platform.Cancel was called for it
	overLimit   bool  // admission refused it (its type's limit)
	limitWait   time.Duration
	group       decide.Group
	retryLimit  int

	want        Outcome
	wantReason  Reason
	wantCounted bool // the attempt counts as a failure
	wantDelay   time.Duration
}

// TestOutcomeTable has one row per row of the README's failure-semantics
// table (TestReadmeTableMatches checks the two agree). Each row goes through
// the platform's own decision path, not a copy of it.
func TestOutcomeTable(t *testing.T) {
	rows := []outcomeRow{
		{readme: "returns nil", want: OutcomeSucceeded},
		{readme: "returns an ordinary error", err: errors.New("boom"), failures: 2, retryLimit: 3, want: OutcomeRetried, wantCounted: true},
		{readme: "fails more often than `RetryLimit` allows", err: errors.New("boom"), failures: 3, retryLimit: 3, want: OutcomeDeadLettered, wantReason: ReasonRetriesExceeded, wantCounted: true},
		{readme: "fails more often than `RetryLimit` allows", err: errors.New("boom"), retryLimit: 0, want: OutcomeDeadLettered, wantReason: ReasonRetriesExceeded, wantCounted: true},
		{readme: "panics", err: &PanicError{Value: "oops"}, failures: 2, retryLimit: 3, want: OutcomeRetried, wantCounted: true},
		{readme: "panics", err: &PanicError{Value: "oops"}, failures: 3, retryLimit: 3, want: OutcomeDeadLettered, wantReason: ReasonRetriesExceeded, wantCounted: true},
		{readme: "runs past its timeout", err: context.DeadlineExceeded, timedOut: true, failures: 2, retryLimit: 3, want: OutcomeRetried, wantCounted: true},
		{readme: "runs past its timeout", err: context.DeadlineExceeded, timedOut: true, failures: 3, retryLimit: 3, want: OutcomeDeadLettered, wantReason: ReasonRetriesExceeded, wantCounted: true},
		{readme: "returns `Invalid(err)`", err: fmt.Errorf("wrapped: %w", Invalid(errors.New("bad"))), retryLimit: 3, want: OutcomeDeadLettered, wantReason: ReasonInvalid, wantCounted: true},
		{readme: "returns `Permanent(err)`", err: Permanent(errors.New("gone")), retryLimit: 3, want: OutcomeDeadLettered, wantReason: ReasonPermanent, wantCounted: true},
		{readme: "returns `Reject(err)`", err: Reject(errors.New("db down")), failures: 3, retryLimit: 3, want: OutcomeRejected, wantDelay: DefaultRejectDelay},
		{readme: "returns `Reject(err)`", err: RejectAfter(errors.New("db down"), time.Minute), want: OutcomeRejected, wantDelay: time.Minute},
		{readme: "never reports (killed, OOM, lost lease)", crashes: DefaultPoisonLimit, want: OutcomeSucceeded},
		{readme: "never reports (killed, OOM, lost lease)", crashes: DefaultPoisonLimit + 1, want: OutcomeDeadLettered, wantReason: ReasonPoisoned},
		{readme: "(no handler registered for its type)", noHandler: true, unhandled: DefaultUnhandledRetries - 1, want: OutcomeHandedBack, wantDelay: DefaultUnhandledDelay},
		{readme: "(no handler registered for its type)", noHandler: true, unhandled: DefaultUnhandledRetries, want: OutcomeDeadLettered, wantReason: ReasonUnhandled},
		{readme: "(its `Deadline` passed before it could run)", expired: true, want: OutcomeDeadLettered, wantReason: ReasonExpired},
		{readme: "(its offloaded payload is gone)", payloadGone: true, failures: 1, want: OutcomeDeadLettered, wantReason: ReasonPayloadMissing},
		{readme: "(the message is not a job at all)", notAJob: true, want: OutcomeDeadLettered, wantReason: ReasonInvalid},
		{readme: "(the platform stops before it finishes)", err: context.Canceled, stopping: true, failures: 2, retryLimit: 2, want: OutcomeHandedBack},
		{readme: "(it is cancelled with `Cancel`)", cancelled: true, retryLimit: 3, want: OutcomeDeadLettered, wantReason: ReasonCancelled},
		{readme: "(it is cancelled with `Cancel`)", cancelled: true, err: ErrJobCancelled, failures: 1, retryLimit: 3, want: OutcomeDeadLettered, wantReason: ReasonCancelled},
		{readme: "(it is cancelled with `Cancel`)", cancelled: true, crashes: DefaultPoisonLimit + 1, want: OutcomeDeadLettered, wantReason: ReasonCancelled},
		{readme: "(its type is over a `Config.Limits` limit)", overLimit: true, failures: 1, crashes: 1, want: outcomeDeferred, wantDelay: DefaultLimitDelay * 3 / 2},
		{readme: "(its type is over a `Config.Limits` limit)", overLimit: true, limitWait: time.Minute, want: outcomeDeferred, wantDelay: time.Minute + DefaultLimitDelay/2},
		{readme: "(its type is over a `Config.Limits` limit)", overLimit: true, cancelled: true, want: OutcomeDeadLettered, wantReason: ReasonCancelled},
		{readme: "(its group is paused with `PauseGroup`)", group: decide.GroupPaused, cancelled: true, crashes: DefaultPoisonLimit + 1, want: outcomeParked},
		{readme: "(its group is paused with `PauseGroup`)", group: decide.GroupUnknown, want: outcomeDeferred, wantDelay: PausePoll},
		{readme: "(a workflow step whose dependency was dead-lettered, policy `FailOnDependency`)", err: &stepResult{result: decide.DependencyFailed, text: "dependency failed"}, failures: 1, retryLimit: 3, want: OutcomeDeadLettered, wantReason: ReasonDependencyFailed},
	}
	mem, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(mem, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	h := &handlerEntry{typ: "t"}
	now := time.Now()
	for _, r := range rows {
		name := fmt.Sprintf("%s/failures=%d,crashes=%d,unhandled=%d", r.readme, r.failures, r.crashes, r.unhandled)
		t.Run(name, func(t *testing.T) {
			got, reason, counted, delay := decideRow(p, h, r, now)
			if got != r.want || reason != r.wantReason || counted != r.wantCounted {
				t.Errorf("got %s %q (counted %v), want %s %q (counted %v)", got, reason, counted, r.want, r.wantReason, r.wantCounted)
			}
			if r.wantDelay > 0 && delay != r.wantDelay {
				t.Errorf("offered again after %v, want %v", delay, r.wantDelay)
			}
			if r.want == OutcomeRetried && (delay < 0 || delay > DefaultBackoffBase<<r.failures) {
				t.Errorf("retry after %v, outside the backoff window", delay)
			}
		})
	}
}

// The gate's outcomes that no Attempt reports (the handler never runs).
const (
	outcomeDeferred Outcome = "(deferred)"
	outcomeParked   Outcome = "(parked)"
)

// decideRow runs a row through the pipeline's steps: decode, gate (the
// handler is assumed to run when the gate says Run), classify, decide.
func decideRow(p *Platform, h *handlerEntry, r outcomeRow, now time.Time) (Outcome, Reason, bool, time.Duration) {
	if r.notAJob {
		var j Job
		if decodeJob([]byte("{\"not\": \"a job\"}"), &j, nil) == nil {
			return OutcomeSucceeded, "", false, 0
		}
		return OutcomeDeadLettered, ReasonInvalid, false, 0 // deadRaw
	}
	j := &executor.Job{Job: wire.Job{Type: "t", Failures: r.failures, Crashes: r.crashes, Unhandled: r.unhandled}, Queue: "q"}
	if r.expired {
		j.Deadline = now.Add(-time.Second)
	}
	var entry executor.Handler[Job] = h
	if r.noHandler {
		entry = nil
	}
	j.Policy.RetryLimit = Limit(r.retryLimit) // the row's limit, as the job's own
	in := p.exec.Input(j, entry)
	in.Now, in.Jitter = now, 1
	in.Cancelled = r.cancelled
	in.Group = r.group
	d := decide.Decide(in)
	if d.Outcome == decide.Run && r.overLimit { // admission refused it: the gate again
		in.OverLimit, in.LimitWait = true, r.limitWait
		d = decide.Decide(in)
	}
	switch d.Outcome {
	case decide.Deferred:
		return outcomeDeferred, "", d.Failures > r.failures, d.RetryAt.Sub(now)
	case decide.Parked:
		return outcomeParked, "", d.Failures > r.failures, 0
	}
	if d.Outcome == decide.Run {
		in.Result, in.RejectAfter = classify(r.err)
		if r.payloadGone {
			in.Result = decide.PayloadGone
		}
		in.Stopping = r.stopping
		in.Now, in.Jitter = now, 1
		d = decide.Decide(in)
	}
	o, reason := outcomeOf(d)
	var delay time.Duration
	if !d.RetryAt.IsZero() {
		delay = d.RetryAt.Sub(now)
	}
	return o, reason, d.Failures > r.failures, delay
}

// TestReadmeTableMatches checks that every row of the README's
// failure-semantics table has rows in TestOutcomeTable, and the reverse.
func TestReadmeTableMatches(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var readme []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "| the handler"):
			in = true
		case in && strings.HasPrefix(line, "|--"):
		case in && strings.HasPrefix(line, "|"):
			readme = append(readme, strings.TrimSpace(strings.Split(line, "|")[1]))
		case in:
			in = false
		}
	}
	if len(readme) == 0 {
		t.Fatal(`the README has no failure-semantics table (a header row starting "| the handler")`)
	}
	src, err := os.ReadFile("outcome_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, cell := range readme {
		if !strings.Contains(string(src), fmt.Sprintf("{readme: %q", cell)) {
			t.Errorf("README row %q has no row in TestOutcomeTable", cell)
		}
	}
	seen := map[string]bool{}
	for _, cell := range readme {
		seen[cell] = true
	}
	for _, line := range strings.Split(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "\t\t{readme: \""); ok {
			cell, _, _ := strings.Cut(rest, `"`)
			if !seen[cell] {
				t.Errorf("TestOutcomeTable row %q is not a row of the README's table", cell)
			}
		}
	}
}

// TestStatusDuplicateOlderCopy: an older copy that comes again after a later
// copy ended (a crash between storing a copy and settling the one before)
// runs untracked: its attempt leaves the later copy's end in place.
func TestStatusDuplicateOlderCopy(t *testing.T) {
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog, TrackStatus: true,
		Policy: Policy{RetryLimit: Limit(5), BackoffBase: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ran := make(chan uint64, 1)
	if err := p.Handle("t", func(_ context.Context, j *Job) error {
		ran <- j.CopyNumber()
		return errors.New("fails")
	}); err != nil {
		t.Fatal(err)
	}
	// Copy 2 ran and succeeded.
	done, _ := p.status.Begin(ctx, status.Job{ID: "j1", Queue: "default", Type: "t", Copy: 2, TryCount: 1})
	if done == nil || done.Running(ctx) {
		t.Fatal("copy 2 was not tracked")
	}
	done.Settled(ctx, decide.Decision{Outcome: decide.Succeeded}, 2, nil, "")
	old := &Job{ID: "j1", Type: "t", Queue: "default", EnqueuedAt: time.Now(), copyNo: 1}
	if err := p.backend.Enqueue(ctx, "default", []driver.Message{encodeMessage(p.codec, old)}); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-ran:
		if c != 1 {
			t.Fatalf("copy %d ran, want 1", c)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the old copy did not run")
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Status(ctx, "j1"); err != nil || st.State != StateSucceeded || st.Copy != 2 {
		t.Errorf("status after an old copy ran again: %+v, %v; want copy 2's succeeded kept", st, err)
	}
}

// TestReenqueueDeadLetterOfCopyZero: a dead letter's job enqueued again is a
// new copy even when the dead one was the first (copy 0): its message ID
// differs from the first's (a deduplicating broker would drop it), and its
// status replaces the dead one's.
func TestReenqueueDeadLetterOfCopyZero(t *testing.T) {
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog, TrackStatus: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	copies := make(chan uint64, 2)
	if err := p.Handle("t", func(_ context.Context, j *Job) error {
		copies <- j.CopyNumber()
		if j.CopyNumber() == 0 {
			return Permanent(errors.New("first life"))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	job := &Job{Type: "t"}
	if err := p.Enqueue(ctx, job); err != nil {
		t.Fatal(err)
	}
	first := messageID(job)
	drain := func(p *Platform) uint64 {
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer p.Stop(ctx)
		select {
		case c := <-copies:
			return c
		case <-time.After(30 * time.Second):
			t.Fatal("no run")
		}
		return 0
	}
	if c := drain(p); c != 0 {
		t.Fatalf("first run: copy %d", c)
	}
	var dl DeadLetter
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := p.NextDeadLetter(ctx, "default", func(_ context.Context, d DeadLetter) (bool, error) {
			dl = d
			return true, nil
		})
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNoDeadLetters) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	again := dl.Job
	if err := p.Enqueue(ctx, &again); err != nil {
		t.Fatal(err)
	}
	if again.CopyNumber() != 1 || messageID(&again) == first {
		t.Errorf("re-enqueued dead letter: copy %d, message ID %q (first %q); want copy 1, a new ID", again.CopyNumber(), messageID(&again), first)
	}
	if st, err := p.Status(ctx, again.ID); err != nil || st.State != StateWaiting || st.Copy != 1 {
		t.Errorf("status of the re-enqueued job: %+v, %v; want waiting, copy 1", st, err)
	}
	p2, err := New(p.backend, Config{Logger: quietLog, TrackStatus: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Handle("t", func(_ context.Context, j *Job) error { copies <- j.CopyNumber(); return nil }); err != nil {
		t.Fatal(err)
	}
	if c := drain(p2); c != 1 {
		t.Errorf("second life ran copy %d, want 1", c)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := p2.Status(ctx, again.ID)
		if err == nil && st.State == StateSucceeded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status of the second life: %+v, %v; want succeeded", st, err)
		}
	}
}

// The public status is the engine's record: every field carried over, the
// same JSON, and the same states.
func TestJobStatusIsTheRecord(t *testing.T) {
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	r := status.Record{ID: "j1", Queue: "q", Type: "t", State: status.DeadLettered, Tries: 3, Failures: 2, Crashes: 1,
		Reason: "retries_exceeded", Error: "boom", Result: []byte("r"), ResultSize: 1, RetryAt: at,
		EnqueuedAt: at.Add(-time.Hour), StartedAt: at.Add(-time.Minute), UpdatedAt: at, Worker: "w", CancelRequested: true, Copy: 4}
	rb, _ := json.Marshal(&r)
	sb, _ := json.Marshal(jobStatus(&r))
	if string(rb) != string(sb) {
		t.Errorf("JobStatus\n%s\nwant the record's\n%s", sb, rb)
	}
	states := map[JobState]status.State{
		StateWaiting: status.Waiting, StateScheduled: status.Scheduled, StateRunning: status.Running,
		StateRetrying: status.Retrying, StateSucceeded: status.Succeeded, StateDeadLettered: status.DeadLettered,
		StateCancelled: status.Cancelled,
	}
	for pub, in := range states {
		if string(pub) != string(in) || pub.Terminal() != in.Terminal() {
			t.Errorf("state %q (terminal %v) is %q (terminal %v) in the engine", pub, pub.Terminal(), in, in.Terminal())
		}
	}
}
