package decide

import (
	"strings"
	"testing"
	"time"
)

// TestDecide has a row for every outcome and for the order of the gate's
// checks; the root package's TestOutcomeTable runs the README's rows through
// the platform's own inputs.
func TestDecide(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	base := Input{
		Type: "t", HasHandler: true, Now: now, Jitter: 1,
		Policy:           Policy{RetryLimit: 2, PoisonLimit: 3, BackoffBase: time.Second, BackoffCap: time.Minute},
		UnhandledRetries: 2, UnhandledDelay: 5 * time.Second, RejectDelay: 7 * time.Second,
		GroupPoll: 11 * time.Second, LimitDelay: 4 * time.Second,
	}
	rows := []struct {
		name   string
		set    func(*Input)
		want   Outcome
		reason Reason
		after  time.Duration // RetryAt - Now; 0: RetryAt unset
		fails  int           // Decision.Failures
	}{
		{"gate: runs", func(*Input) {}, Run, "", 0, 0},
		{"gate: paused group first", func(in *Input) { in.Group, in.Cancelled, in.Crashes = GroupPaused, true, 9 }, Parked, "", 0, 0},
		{"gate: group unknown", func(in *Input) { in.Group = GroupUnknown }, Deferred, "", 11 * time.Second, 0},
		{"gate: cancelled before expiry", func(in *Input) { in.Cancelled, in.Deadline = true, now }, DeadLettered, Cancelled, 0, 0},
		{"gate: expired", func(in *Input) { in.Deadline = now }, DeadLettered, Expired, 0, 0},
		{"gate: not yet expired", func(in *Input) { in.Deadline = now.Add(time.Nanosecond) }, Run, "", 0, 0},
		{"gate: poisoned", func(in *Input) { in.Crashes = 4 }, DeadLettered, Poisoned, 0, 0},
		{"gate: at the poison limit", func(in *Input) { in.Crashes = 3 }, Run, "", 0, 0},
		{"gate: no handler", func(in *Input) { in.HasHandler, in.Unhandled = false, 1 }, Requeued, "", 5 * time.Second, 0},
		{"gate: no handler, spent", func(in *Input) { in.HasHandler, in.Unhandled = false, 2 }, DeadLettered, Unhandled, 0, 0},
		{"gate: over a limit", func(in *Input) { in.OverLimit = true }, Deferred, "", 6 * time.Second, 0},
		{"gate: over a rate", func(in *Input) { in.OverLimit, in.LimitWait = true, time.Second }, Deferred, "", 3 * time.Second, 0},
		{"gate: over a limit, no jitter", func(in *Input) { in.OverLimit, in.Jitter = true, 0 }, Deferred, "", 2 * time.Second, 0},
		{"gate: over a limit while stopping", func(in *Input) { in.OverLimit, in.Stopping = true, true }, HandedBack, "", 0, 0},
		{"gate: over a limit and poisoned", func(in *Input) { in.OverLimit, in.Crashes = true, 4 }, DeadLettered, Poisoned, 0, 0},
		{"ok", func(in *Input) { in.Result = OK }, Succeeded, "", 0, 0},
		{"ok after cancel", func(in *Input) { in.Result, in.Cancelled = OK, true }, Succeeded, "", 0, 0},
		{"payload gone", func(in *Input) { in.Result = PayloadGone }, DeadLettered, PayloadMissing, 0, 0},
		{"dependency failed", func(in *Input) { in.Result, in.Failures = DependencyFailed, 1 }, DeadLettered, DepFailed, 0, 1},
		{"dependency failed while stopping", func(in *Input) { in.Result, in.Stopping = DependencyFailed, true }, DeadLettered, DepFailed, 0, 0},
		{"workflow cancelled while running", func(in *Input) { in.Result = CancelledRun }, DeadLettered, Cancelled, 0, 0},
		{"failed after cancel", func(in *Input) { in.Result, in.Cancelled = Failed, true }, DeadLettered, Cancelled, 0, 0},
		{"failed while stopping", func(in *Input) { in.Result, in.Stopping, in.Failures = Failed, true, 2 }, HandedBack, "", 0, 2},
		{"rejected", func(in *Input) { in.Result = Rejection }, Rejected, "", 7 * time.Second, 0},
		{"rejected, own delay", func(in *Input) { in.Result, in.RejectAfter = Rejection, time.Minute }, Rejected, "", time.Minute, 0},
		{"invalid", func(in *Input) { in.Result = InvalidInput }, DeadLettered, Invalid, 0, 1},
		{"permanent", func(in *Input) { in.Result = PermanentFailure }, DeadLettered, Permanent, 0, 1},
		{"failed", func(in *Input) { in.Result, in.Failures = Failed, 1 }, Retried, "", 2 * time.Second, 2},
		{"failed past the limit", func(in *Input) { in.Result, in.Failures = Failed, 2 }, DeadLettered, RetriesExceeded, 0, 3},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			in := base
			r.set(&in)
			d := Decide(in)
			var after time.Duration
			if !d.RetryAt.IsZero() {
				after = d.RetryAt.Sub(now)
			}
			if d.Outcome != r.want || d.Reason != r.reason || after != r.after || d.Failures != r.fails {
				t.Errorf("got %s %q after %v, failures %d; want %s %q after %v, failures %d", d.Outcome, d.Reason, after, d.Failures, r.want, r.reason, r.after, r.fails)
			}
			if d.Crashes != in.Crashes || (d.Outcome != Requeued && d.Unhandled != in.Unhandled) {
				t.Errorf("counters changed: crashes %d→%d, unhandled %d→%d", in.Crashes, d.Crashes, in.Unhandled, d.Unhandled)
			}
		})
	}
	for o := Run; o <= Parked; o++ {
		if s := o.String(); s == "" || s[0] == 'o' {
			t.Errorf("outcome %d has no name: %q", int(o), s)
		}
	}
}

// The poison dead letter's reason counts its crashes in words a person
// reads: "once", never "1 times".
func TestPoisonWhy(t *testing.T) {
	for crashes, want := range map[int]string{1: "crashed or lost it once;", 2: "crashed or lost it twice;", 4: "crashed or lost it 4 times;"} {
		d := Decide(Input{Type: "t", HasHandler: true, Now: time.Unix(1, 0), Crashes: crashes, Policy: Policy{PoisonLimit: crashes - 1}})
		if d.Reason != Poisoned || !strings.Contains(d.Why, want) {
			t.Errorf("%d crashes: %s %q, want poisoned with %q", crashes, d.Reason, d.Why, want)
		}
	}
}
