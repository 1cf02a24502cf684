package faults

import (
	"os"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// hist builds a synthetic history of job "j" from events in time order.
type hist struct {
	h  History
	at time.Time
}

func (b *hist) add(e Event) *hist {
	b.at = b.at.Add(time.Millisecond)
	e.ID, e.At = "j", b.at
	b.h = append(b.h, e)
	return b
}

func (b *hist) enqueue() *hist { return b.add(Event{Kind: KindEnqueue}) }
func (b *hist) maybe() *hist   { return b.add(Event{Kind: KindMaybe}) }

// start records an attempt by worker w on copy cp that saw f failures and c
// crashes.
func (b *hist) start(w string, cp uint64, f, c int) *hist {
	return b.add(Event{Kind: KindStart, Worker: w, Copy: cp, Try: f + c + 1, Failures: f, Crashes: c})
}

// end records the end of that attempt (the handler's result, then, when
// outcome is not empty, the platform's report).
func (b *hist) end(w string, cp uint64, f, c int, result string, outcome ap.Outcome) *hist {
	b.add(Event{Kind: KindEnd, Worker: w, Copy: cp, Try: f + c + 1, Failures: f, Crashes: c, Result: result})
	if outcome != "" {
		b.add(Event{Kind: KindAck, Worker: w, Copy: cp, Try: f + c + 1, Failures: f, Crashes: c, Result: string(outcome)})
	}
	return b
}

func check(t *testing.T, b *hist) *Report {
	t.Helper()
	r := Check(b.h, nil, nil, Limits{RetryLimit: 2, PoisonLimit: 3})
	t.Logf("%s", r)
	for _, n := range r.Notes {
		t.Logf("  %s", n)
	}
	return r
}

// A copy delivered again after an attempt on it reached an outcome (its
// report lost in the fault) is a duplicate delivery, not a wrong try count.
func TestCheckSameCopyAfterOutcomeIsDuplicate(t *testing.T) {
	for name, first := range map[string]struct {
		result  string
		outcome ap.Outcome
	}{
		"ack lost":           {ResultOK, ap.OutcomeLeaseLost},
		"ack seemed done":    {ResultOK, ap.OutcomeSucceeded},
		"retry report lost":  {ResultFail, ap.OutcomeLeaseLost},
		"reject report lost": {ResultReject, ap.OutcomeLeaseLost},
		"handed back":        {ResultCancel, ap.OutcomeHandedBack},
		"no report seen":     {ResultOK, ""}, // its worker died while reporting
	} {
		t.Run(name, func(t *testing.T) {
			b := new(hist).enqueue().
				start("w1", 0, 0, 0).end("w1", 0, 0, 0, first.result, first.outcome).
				start("w2", 0, 0, 0).end("w2", 0, 0, 0, ResultOK, ap.OutcomeSucceeded)
			r := check(t, b)
			if r.WrongTries != 0 {
				t.Errorf("wrong try counts %d, want 0: a duplicate delivery of one copy is not a wrong count", r.WrongTries)
			}
			if r.Redelivered != 1 {
				t.Errorf("redelivered %d, want 1", r.Redelivered)
			}
		})
	}
}

// A copy delivered again with the same counters after an attempt on it that
// reached no outcome (its worker died, or its lease was lost) is an
// uncounted crash: a wrong try count.
func TestCheckSameCopyAfterNoOutcomeIsWrong(t *testing.T) {
	for name, first := range map[string]struct {
		result  string
		outcome ap.Outcome
	}{
		"worker died":                   {"", ""},
		"lease lost, handler cancelled": {ResultCancel, ap.OutcomeLeaseLost},
		"cancelled, then died":          {ResultCancel, ""},
	} {
		t.Run(name, func(t *testing.T) {
			b := new(hist).enqueue().start("w1", 0, 0, 0)
			if first.result != "" {
				b.end("w1", 0, 0, 0, first.result, first.outcome)
			}
			b.start("w2", 0, 0, 0).end("w2", 0, 0, 0, ResultOK, ap.OutcomeSucceeded)
			r := check(t, b)
			if r.WrongTries != 1 {
				t.Errorf("wrong try counts %d, want 1: the first attempt's crash was not counted", r.WrongTries)
			}
			if r.Redelivered != 0 {
				t.Errorf("redelivered %d, want 0", r.Redelivered)
			}
		})
	}
}

// The crash counted on the next delivery is right.
func TestCheckCountedCrashIsRight(t *testing.T) {
	b := new(hist).enqueue().
		start("w1", 0, 0, 0).
		start("w2", 0, 0, 1).end("w2", 0, 0, 1, ResultOK, ap.OutcomeSucceeded)
	if r := check(t, b); r.WrongTries != 0 || r.Redelivered != 0 {
		t.Errorf("wrong %d, redelivered %d: want 0 and 0", r.WrongTries, r.Redelivered)
	}
}

// A newer copy with the counters of an attempt that failed is a wrong try
// count: the retry it wrote carries one more failure.
func TestCheckOtherCopyWithEqualCountersIsWrong(t *testing.T) {
	b := new(hist).enqueue().
		start("w1", 0, 0, 0).end("w1", 0, 0, 0, ResultFail, ap.OutcomeRetried).
		start("w2", 1, 0, 0).end("w2", 1, 0, 0, ResultOK, ap.OutcomeSucceeded)
	if r := check(t, b); r.WrongTries != 1 {
		t.Errorf("wrong try counts %d, want 1", r.WrongTries)
	}
}

// A crash is judged on its own copy. From a RabbitMQ soak: a Reject wrote
// copy 1 and its worker died before acking copy 0; copy 0 came back and
// crashed (its next delivery counted it), copy 1 crashed once too (its next
// delivery counted that): copy 0 and copy 1 both show one crash, both right.
// But copy 0 coming back without its crash counted is wrong.
func TestCheckCrashJudgedOnItsCopy(t *testing.T) {
	b := new(hist).enqueue().
		start("w1", 0, 0, 0).end("w1", 0, 0, 0, ResultReject, "").
		start("w2", 0, 0, 1).
		start("w3", 1, 0, 0).
		start("w4", 0, 0, 2).end("w4", 0, 0, 2, ResultOK, ap.OutcomeSucceeded).
		start("w4", 1, 0, 1).
		start("w5", 1, 0, 2).end("w5", 1, 0, 2, ResultOK, ap.OutcomeSucceeded)
	if r := check(t, b); r.WrongTries != 0 {
		t.Errorf("wrong try counts %d, want 0", r.WrongTries)
	}
	b = new(hist).enqueue().
		start("w1", 0, 0, 0).end("w1", 0, 0, 0, ResultReject, "").
		start("w2", 0, 0, 1).
		start("w3", 0, 0, 1).end("w3", 0, 0, 1, ResultOK, ap.OutcomeSucceeded)
	if r := check(t, b); r.WrongTries != 1 {
		t.Errorf("wrong try counts %d, want 1 (copy 0's second crash not counted)", r.WrongTries)
	}
}

// The next copy after a Reject or a hand-back keeps the counters; so does
// a copy newer than one that succeeded (it exists only because the
// succeeded copy was delivered again, its ack lost, and that delivery was
// handed back or rejected uncounted: a hand-back before the handler ran
// leaves no event).
func TestCheckUncountedCopyKeepsCounters(t *testing.T) {
	for name, first := range map[string]struct {
		result  string
		outcome ap.Outcome
	}{
		"reject":      {ResultReject, ap.OutcomeRejected},
		"handed back": {ResultCancel, ap.OutcomeHandedBack},
		"succeeded":   {ResultOK, ap.OutcomeSucceeded},
	} {
		t.Run(name, func(t *testing.T) {
			b := new(hist).enqueue().
				start("w1", 0, 0, 0).end("w1", 0, 0, 0, first.result, first.outcome).
				start("w2", 1, 0, 0).end("w2", 1, 0, 0, ResultFail, ap.OutcomeRetried).
				start("w2", 2, 1, 0).end("w2", 2, 1, 0, ResultOK, ap.OutcomeSucceeded)
			if r := check(t, b); r.WrongTries != 0 || r.Redelivered != 0 {
				t.Errorf("wrong %d, redelivered %d: want 0 and 0", r.WrongTries, r.Redelivered)
			}
		})
	}
}

// An indeterminate enqueue may store the job twice: both stored copies are
// copy 0 and start at zero, whatever became of the first.
func TestCheckIndeterminateEnqueueMayStoreTwice(t *testing.T) {
	b := new(hist).maybe().
		start("w1", 0, 0, 0).
		start("w2", 0, 0, 0).end("w2", 0, 0, 0, ResultOK, ap.OutcomeSucceeded)
	if r := check(t, b); r.WrongTries != 0 {
		t.Errorf("wrong try counts %d, want 0", r.WrongTries)
	}
}

// A duplicate is explained by the copies it was done on.
func TestCheckExplainsDuplicates(t *testing.T) {
	for name, tc := range map[string]struct {
		b    *hist
		want string
	}{
		"same copy, same counters": {
			new(hist).enqueue().
				start("w1", 0, 0, 0).end("w1", 0, 0, 0, ResultOK, ap.OutcomeLeaseLost).
				start("w2", 0, 0, 0).end("w2", 0, 0, 0, ResultOK, ap.OutcomeSucceeded),
			"copy 0 was delivered twice with the same counters",
		},
		"same copy, crash counted": {
			new(hist).enqueue().
				start("w1", 0, 0, 0).end("w1", 0, 0, 0, ResultOK, "").
				start("w2", 0, 0, 1).end("w2", 0, 0, 1, ResultOK, ap.OutcomeSucceeded),
			"copy 0 came back after its outcome was lost",
		},
		"older copy back": {
			new(hist).enqueue().
				start("w1", 0, 0, 0).end("w1", 0, 0, 0, ResultReject, ap.OutcomeLeaseLost).
				start("w2", 1, 0, 0).end("w2", 1, 0, 0, ResultOK, ap.OutcomeSucceeded).
				start("w3", 0, 0, 1).end("w3", 0, 0, 1, ResultOK, ap.OutcomeSucceeded),
			"an older copy came back",
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := check(t, tc.b)
			if r.Duplicated != 1 || r.WrongTries != 0 {
				t.Fatalf("duplicated %d, wrong %d: want 1 and 0", r.Duplicated, r.WrongTries)
			}
			found := false
			for _, n := range r.Notes {
				found = found || strings.HasPrefix(n, "duplicated:") && strings.Contains(n, tc.want)
			}
			if !found {
				t.Errorf("no duplicate note says %q", tc.want)
			}
		})
	}
}

// An older copy that comes back after a newer one ran with the same
// counters is not a wrong count: the newer copy was written uncounted by a
// delivery of the older one.
func TestCheckOlderCopyBack(t *testing.T) {
	for name, newer := range map[string]struct {
		result  string
		outcome ap.Outcome
	}{
		"newer succeeded": {ResultOK, ap.OutcomeSucceeded},
		"newer failed":    {ResultFail, ap.OutcomeRetried},
	} {
		t.Run(name, func(t *testing.T) {
			b := new(hist).enqueue().
				start("w1", 1, 0, 0).end("w1", 1, 0, 0, newer.result, newer.outcome).
				start("w2", 0, 0, 0).end("w2", 0, 0, 0, ResultOK, ap.OutcomeSucceeded)
			if r := check(t, b); r.WrongTries != 0 {
				t.Errorf("wrong try counts %d, want 0", r.WrongTries)
			}
		})
	}
}

// Two deliveries of one copy that run at once (a broker that forgot the
// first): the first is judged by how it ended, after the second started.
func TestCheckConcurrentDuplicate(t *testing.T) {
	b := new(hist).enqueue().
		start("w1", 0, 0, 0).
		start("w2", 0, 0, 0).end("w2", 0, 0, 0, ResultOK, ap.OutcomeSucceeded).
		end("w1", 0, 0, 0, ResultOK, ap.OutcomeSucceeded)
	r := check(t, b)
	if r.WrongTries != 0 || r.Redelivered != 1 {
		t.Errorf("wrong %d, redelivered %d: want 0 and 1", r.WrongTries, r.Redelivered)
	}
}

// TestCheckKept re-checks the history of a run directory kept with
// ASYNCPLATFORM_FAULTS_KEEP, named by ASYNCPLATFORM_FAULTS_CHECK, and logs
// its wrong try counts and duplicate deliveries (the dead letters drained at
// its end are not kept, so lost and duplicated are not meaningful here).
func TestCheckKept(t *testing.T) {
	dir := os.Getenv("ASYNCPLATFORM_FAULTS_CHECK")
	if dir == "" {
		t.Skip("set ASYNCPLATFORM_FAULTS_CHECK to a kept run directory")
	}
	h, err := LoadHistory(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := Check(h, nil, nil, Limits{RetryLimit: 2, PoisonLimit: 3})
	t.Logf("wrong try counts %d, redelivered %d", r.WrongTries, r.Redelivered)
	for id := range r.wrong {
		t.Logf("  wrong: job %s: %s", id, h.of(id).brief())
	}
	for _, n := range r.Notes {
		if strings.HasPrefix(n, "wrong") || strings.HasPrefix(n, "duplicate delivery") {
			t.Logf("  %s", n)
		}
	}
}

// An acknowledged enqueue under way while the broker restarted may have
// been stored twice (a client that sent it again after its connection was
// reset; seen on Azurite in a soak): two stored messages of copy 0, each
// starting at zero, so an attempt that saw the counters of an attempt on
// the other one that died is right. The same history with the restart
// before the enqueue is a wrong count (an uncounted crash).
func TestCheckEnqueueAcrossRestart(t *testing.T) {
	for name, c := range map[string]struct {
		restartFirst bool
		wantWrong    int
	}{
		"across": {false, 0},
		"before": {true, 1},
	} {
		t.Run(name, func(t *testing.T) {
			b := new(hist)
			restart := func() {
				from := b.at.Add(time.Millisecond)
				b.at = b.at.Add(3 * time.Millisecond)
				b.h = append(b.h, Event{Kind: KindRestart, From: from, At: b.at})
			}
			if c.restartFirst {
				restart()
			}
			from := b.at.Add(time.Millisecond)
			if !c.restartFirst {
				restart()
			}
			b.add(Event{Kind: KindEnqueue, From: from})
			b.start("w1", 0, 0, 0). // its worker died: no end
						start("w2", 0, 0, 0).end("w2", 0, 0, 0, ResultOK, ap.OutcomeSucceeded)
			r := check(t, b)
			if r.WrongTries != c.wantWrong || r.StoredTwice != 1-c.wantWrong {
				t.Errorf("wrong try counts %d, stored twice %d; want %d and %d", r.WrongTries, r.StoredTwice, c.wantWrong, 1-c.wantWrong)
			}
		})
	}
}

// The lost leases of a history: an attempt's loss names its job, and each
// warning beyond the attempts' losses is one that names none.
func TestLostLeases(t *testing.T) {
	b := new(hist).enqueue().
		start("w1", 0, 0, 0).end("w1", 0, 0, 0, ResultOK, ap.OutcomeLeaseLost)
	for range 3 {
		b.h = append(b.h, Event{Kind: KindLost, Worker: "w1", At: b.at})
	}
	byJob, unnamed := b.h.lostLeases()
	if byJob["j"] != 1 || unnamed != 2 {
		t.Errorf("lost leases: %v and %d naming no job; want j: 1 and 2", byJob, unnamed)
	}
}

// A job whose attempt ended well with no outcome reported after it rightly
// ran again only when its worker died there (it started the job that
// kills); a live worker's unreported end, or a success reported, excuses no
// second run.
func TestDiedAfterCommit(t *testing.T) {
	for name, c := range map[string]struct {
		outcome ap.Outcome
		killed  bool
		want    bool
	}{
		"no outcome, worker killed": {"", true, true},
		"no outcome, worker alive":  {"", false, false},
		"succeeded, worker killed":  {ap.OutcomeSucceeded, true, false},
	} {
		t.Run(name, func(t *testing.T) {
			b := new(hist).enqueue().
				start("w1", 0, 0, 0).end("w1", 0, 0, 0, ResultOK, c.outcome)
			if c.killed {
				b.h = append(b.h, Event{Kind: KindStart, ID: "poison", Worker: "w1", Try: 1, At: b.at})
			}
			b.start("w2", 0, 0, 1).end("w2", 0, 0, 1, ResultOK, ap.OutcomeSucceeded)
			if got := b.h.diedAfterCommit("j", "poison"); got != c.want {
				t.Errorf("diedAfterCommit = %v, want %v", got, c.want)
			}
		})
	}
}

// A join started twice on a first delivery is wrong, unless a parent lost
// a lease: that parent's redelivery, holding the join's claim, enqueues
// the join again while its first delivery's enqueue may be under way
// (docs/contract.md section 16 rule 4).
func TestRunsOnceExcusesParentLeaseLost(t *testing.T) {
	twice := func(parentLost bool) History {
		var h History
		at := time.Unix(0, 0)
		add := func(e Event) {
			at = at.Add(time.Millisecond)
			e.At = at
			h = append(h, e)
		}
		add(Event{Kind: KindEnqueue, ID: "join"})
		add(Event{Kind: KindStart, ID: "p0", Worker: "w1", Try: 1})
		add(Event{Kind: KindEnd, ID: "p0", Worker: "w1", Try: 1, Result: ResultOK})
		if parentLost {
			add(Event{Kind: KindAck, ID: "p0", Worker: "w1", Try: 1, Result: string(ap.OutcomeLeaseLost)})
		} else {
			add(Event{Kind: KindAck, ID: "p0", Worker: "w1", Try: 1, Result: string(ap.OutcomeSucceeded)})
		}
		for cp := range uint64(2) {
			add(Event{Kind: KindStart, ID: "join", Worker: "w1", Copy: cp, Try: 1})
		}
		for cp := range uint64(2) {
			add(Event{Kind: KindEnd, ID: "join", Worker: "w1", Copy: cp, Try: 1, Result: ResultOK})
			add(Event{Kind: KindAck, ID: "join", Worker: "w1", Copy: cp, Try: 1, Result: string(ap.OutcomeSucceeded)})
		}
		return h
	}
	if w := twice(false).runsOnce("join", nil, []string{"p0"}); len(w) != 2 {
		t.Errorf("no parent lease lost: got %q, want two complaints (completed twice, started twice)", w)
	}
	if w := twice(true).runsOnce("join", nil, []string{"p0"}); len(w) != 0 {
		t.Errorf("a parent's lease lost: got %q, want none", w)
	}
	if w := twice(true).runsOnce("join", nil, nil); len(w) != 2 {
		t.Errorf("a lease lost by a job that is not a parent: got %q, want two complaints", w)
	}
}

// A Garbage run's duplicates are excused only when every one is a foreign
// message dead-lettered again, by no more extra records than the lease
// losses warned of that name no job.
func TestGarbageExcused(t *testing.T) {
	foreign := []byte("not a job")
	twice := []ap.DeadLetter{
		{Raw: foreign, Reason: ap.ReasonInvalid},
		{Raw: foreign, Reason: ap.ReasonInvalid},
	}
	for name, c := range map[string]struct {
		warned   int  // lease losses warned of
		jobLost  bool // one of them reported by a job's attempt
		jobTwice bool // a job completed twice as well
		want     bool
	}{
		"a loss warned":                   {warned: 1, want: true},
		"no loss warned":                  {warned: 0, want: false},
		"the only loss is a job's":        {warned: 1, jobLost: true, want: false},
		"a job duplicated too":            {warned: 3, jobTwice: true, want: false},
		"more losses than extra records":  {warned: 2, want: true},
		"a job duplicated after its loss": {warned: 2, jobLost: true, want: true},
	} {
		t.Run(name, func(t *testing.T) {
			b := new(hist).enqueue()
			outcome := ap.OutcomeSucceeded
			if c.jobLost {
				outcome = ap.OutcomeLeaseLost
			}
			b.start("w1", 0, 0, 0).end("w1", 0, 0, 0, ResultOK, outcome)
			if c.jobTwice || c.jobLost {
				b.start("w2", 0, 0, 0).end("w2", 0, 0, 0, ResultOK, ap.OutcomeSucceeded)
			}
			for range c.warned {
				b.h = append(b.h, Event{Kind: KindLost, Worker: "w1", At: b.at})
			}
			rep := Check(b.h, twice, [][]byte{foreign}, Limits{RetryLimit: 2, PoisonLimit: 3})
			if rep.GarbageExtra != 1 {
				t.Fatalf("GarbageExtra %d, want 1 (%s)", rep.GarbageExtra, rep)
			}
			if got := garbageExcused(rep, b.h); got != c.want {
				t.Errorf("excused %v, want %v (%s)", got, c.want, rep)
			}
		})
	}
}
