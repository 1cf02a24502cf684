package conformance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// testPause: a queue paused from another platform (an admin process) takes
// nothing for 3 s — neither the jobs enqueued while it is paused nor those
// its worker had claimed ahead, which are handed back — while the handler
// running when it was paused finishes. After Resume every job runs once,
// with no try spent by the pause. A worker started while the queue is
// paused takes nothing either.
func testPause(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 1, Prefetch: ap.Limit(3)}}
	h, started, release := blocker()
	w := e.worker(cfg).handle(t, "p", func(ctx context.Context, j *ap.Job) error {
		if j.Headers["slow"] == "1" {
			return h(ctx, j)
		}
		return nil
	})
	admin := e.producer()
	slow := &ap.Job{Type: "p", Headers: map[string]string{"slow": "1"}}
	e.enqueue(admin, slow)
	w.start(t)
	select {
	case <-started:
	case <-time.After(e.opts.Wait):
		t.Fatalf("the first job never started\n%s", e.rec)
	}
	var jobs []*ap.Job
	for range 3 { // claimed ahead by the worker while its one handler is busy
		jobs = append(jobs, &ap.Job{Type: "p"})
	}
	e.enqueue(admin, jobs...)
	time.Sleep(e.scaled(200 * time.Millisecond))

	ctx := ctxT(t, e.opts.Wait)
	if err := admin.Pause(ctx, e.queue); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Cleanup(func() { _ = admin.Resume(context.Background(), e.queue) })
	if err := admin.Pause(ctx, e.queue); err != nil {
		t.Fatalf("Pause of a paused queue: %v, want nil", err)
	}
	time.Sleep(2*ap.PausePoll + e.scaled(200*time.Millisecond)) // every worker has read it
	close(release)                                              // the running handler finishes
	e.waitFor("the running job to finish", func() bool {
		o := e.rec.outcomes(slow.ID)
		return len(o) == 1 && o[0].Outcome == ap.OutcomeSucceeded
	})
	var more []*ap.Job
	for range 5 {
		more = append(more, &ap.Job{Type: "p"})
	}
	e.enqueue(admin, more...)
	jobs = append(jobs, more...)
	late := e.worker(e.config()).handle(t, "p", ok).start(t) // started while paused
	_ = late

	time.Sleep(3 * time.Second)
	for _, j := range jobs {
		if n := e.rec.count(j.ID); n != 0 {
			t.Fatalf("job %s ran %d times while its queue was paused\n%s", j.ID, n, e.rec)
		}
	}
	st, err := admin.Stats(ctx, e.queue)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if !st.Paused {
		t.Errorf("Stats of a paused queue: %+v, want Paused", st)
	}
	if st.Ready != -1 && st.Ready != int64(len(jobs)) {
		t.Errorf("Stats of a paused queue: Ready %d, want %d (every job waiting)", st.Ready, len(jobs))
	}
	if q, err := admin.PausedQueues(ctx); err != nil || !contains(q, e.queue) {
		t.Errorf("PausedQueues = %q, %v; want it to name %q", q, err, e.queue)
	}

	if err := admin.Resume(ctx, e.queue); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	for _, j := range jobs {
		e.waitFor("every job to run after Resume", func() bool { return e.rec.count(j.ID) > 0 })
	}
	e.settle()
	for _, j := range jobs {
		for _, at := range e.rec.of(j.ID) {
			if at.TryCount != 1 || at.Failures != 0 || at.Crashes != 0 {
				t.Errorf("job %s attempt %+v: a pause must not spend a try", j.ID, at)
			}
		}
		if n := e.rec.count(j.ID); n != 1 {
			t.Errorf("job %s ran %d times, want once", j.ID, n)
		}
	}
	if st, err := admin.Stats(ctx, e.queue); err != nil || st.Paused {
		t.Errorf("Stats after Resume: %+v, %v; want not paused", st, err)
	}
	if err := admin.Resume(ctx, e.queue); err != nil {
		t.Errorf("Resume of a running queue: %v, want nil", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// poolQueues names n queues of the case's own, highest priority first.
func poolQueues(e *env, n int) []string {
	qs := make([]string, n)
	for i := range qs {
		qs[i] = fmt.Sprintf("%s.p%d", e.queue, i)
	}
	e.alsoDelete(qs...)
	return qs
}

// starts returns the queues of the recorded attempts, in the order they
// started.
func starts(e *env) []string {
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	out := make([]string, len(e.rec.attempts))
	for i, a := range e.rec.attempts {
		out[i] = a.Job.Queue
	}
	return out
}

// testStrictOrder: a pool in strict order takes nothing from a lower queue
// while a higher one has work: with one handler and no prefetch, the jobs
// run queue by queue; and jobs that arrive on the highest queue while the
// lowest one is being worked run next, before the rest of the lowest (one
// job of the lowest already claimed may run before them).
func testStrictOrder(t *testing.T, e *env) {
	qs := poolQueues(e, 3)
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{qs[0]: {}, qs[1]: {}, qs[2]: {}}
	cfg.Pools = []ap.Pool{{Queues: qs, Concurrency: 1, Prefetch: ap.Limit(0)}}
	admin := e.producer()
	const each = 8
	var lows []*ap.Job
	for i := 2; i >= 0; i-- { // lowest first: enqueue order must not be what orders the runs
		var jobs []*ap.Job
		for range each {
			jobs = append(jobs, &ap.Job{Type: "o", Queue: qs[i]})
		}
		e.enqueue(admin, jobs...)
		if i == 2 {
			lows = jobs
		}
	}
	slow := make(chan struct{})
	var lowRuns atomic.Int32
	w := e.worker(cfg).handle(t, "o", func(ctx context.Context, j *ap.Job) error {
		if j.Queue == qs[2] && lowRuns.Add(1) == 3 { // the third job of the lowest queue to run waits for the late ones
			close(slow)
			time.Sleep(e.scaled(300 * time.Millisecond))
		}
		return nil
	})
	w.start(t)
	select {
	case <-slow:
	case <-time.After(e.opts.Wait):
		t.Fatalf("the lowest queue's jobs never ran\n%s", e.rec)
	}
	var late []*ap.Job
	for range 4 {
		late = append(late, &ap.Job{Type: "o", Queue: qs[0]})
	}
	e.enqueue(admin, late...)
	enqueued := len(starts(e))
	e.waitFor("every job to run", func() bool { return len(starts(e)) >= 3*each+len(late) })
	got := starts(e)
	want := make([]string, 0, 3*each)
	for i := range 3 {
		for range each {
			want = append(want, qs[i])
		}
	}
	if !slices.Equal(got[:3*each-len(lows)+3], want[:3*each-len(lows)+3]) {
		t.Fatalf("the jobs ran in this order of queues:\n%q\nwant every job of a queue before any of the next", got)
	}
	// After the late jobs were enqueued, at most one job of the lowest
	// queue (claimed already) runs before the last of them.
	lastLate := -1
	for i, q := range got {
		if q == qs[0] && i >= enqueued {
			lastLate = i
		}
	}
	lowBefore := 0
	for _, q := range got[enqueued:lastLate] {
		if q == qs[2] {
			lowBefore++
		}
	}
	if lowBefore > 1 {
		t.Errorf("%d jobs of the lowest queue ran after jobs arrived on the highest and before the last of them ran:\n%q (from %d)", lowBefore, got, enqueued)
	}
	if t.Failed() {
		t.Logf("%s", e.rec)
	}
}

// testWeighted: a pool with weights 3 and 1, both queues full, takes about
// three jobs of the first for one of the second, and starves neither.
func testWeighted(t *testing.T, e *env) {
	qs := poolQueues(e, 2)
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{qs[0]: {}, qs[1]: {}}
	cfg.Pools = []ap.Pool{{Queues: qs, Weights: []int{3, 1}, Concurrency: 1, Prefetch: ap.Limit(0)}}
	admin := e.producer()
	const each, observed = 40, 30
	for _, q := range qs {
		var jobs []*ap.Job
		for range each {
			jobs = append(jobs, &ap.Job{Type: "w", Queue: q})
		}
		e.enqueue(admin, jobs...)
	}
	e.worker(cfg).handle(t, "w", ok).start(t)
	e.waitFor("the first jobs to run", func() bool { return len(starts(e)) >= observed })
	heavy := 0
	for _, q := range starts(e)[:observed] {
		if q == qs[0] {
			heavy++
		}
	}
	// Binomial(30, 0.75): mean 22.5, sd 2.4; 15 is over 3 sd below, and
	// all 30 has a chance of 0.75^30 = 0.02 %.
	if heavy < 15 || heavy > 29 {
		t.Errorf("of the first %d jobs, %d came from the queue of weight 3; want about 22 (15 to 29)\n%q", observed, heavy, starts(e)[:observed])
	}
	e.waitLonger(e.opts.Wait, "every job to run", func() bool { return len(starts(e)) >= 2*each })
}

// testPauseGroup: while one group of a queue is paused, its 100 jobs are
// set aside as they are delivered and the queue's other jobs run; after
// ResumeGroup all 100 come back, each runs once, in the order they were
// enqueued, with no try spent.
func testPauseGroup(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 1, Prefetch: ap.Limit(0)}}
	// Leases are not what this case is about, and a lapse that a stalled
	// process cannot see (NATS: a stall past the guard at a lease's end)
	// reads as a try the pause spent: the lease is long enough that a
	// loaded machine's stalls stay inside its guard.
	cfg.Lease = 4 * e.lease
	// A lapsed delivery comes back within a lease and a half.
	lapse := max(3*cfg.Lease/2, e.scaled(300*time.Millisecond))
	settle := func() { time.Sleep(lapse) }
	var logged, unhealthy atomic.Int32 // leases the worker logged as lost; its health gate's closings
	cfg.Logger = slog.New(&lostLeases{dying: new(atomic.Bool), n: &logged, unhealthy: &unhealthy})
	e.worker(cfg).handle(t, "g", ok).start(t)
	admin := e.producer()
	// The admin calls' context outlasts the case's sleeps as well as its
	// waits: a settle, the wait for the workers to read the pause, and a
	// lapse's worth of room for ResumeGroup's own wait for the workers.
	ctx := ctxT(t, 2*e.opts.Wait+2*lapse+2*ap.PausePoll)
	e.alsoDelete(ap.HeldQueue(e.queue, "acme"))
	if err := admin.PauseGroup(ctx, e.queue, "acme"); err != nil {
		t.Fatalf("PauseGroup: %v", err)
	}
	t.Cleanup(func() { _, _ = admin.ResumeGroup(context.Background(), e.queue, "acme") })
	time.Sleep(2*ap.PausePoll + e.scaled(200*time.Millisecond)) // every worker has read it
	var acme, others []*ap.Job
	var all []*ap.Job
	for i := range 100 {
		j := &ap.Job{Type: "g", Group: "acme"}
		acme = append(acme, j)
		all = append(all, j)
		if i%5 == 0 {
			o := &ap.Job{Type: "g", Group: "globex"}
			if i%10 == 0 {
				o.Group = "" // no group at all
			}
			others = append(others, o)
			all = append(all, o)
		}
	}
	e.enqueue(admin, all...)
	for _, j := range others {
		e.waitFor("the other groups' jobs to run", func() bool { return e.rec.count(j.ID) == 1 })
	}
	// Every job of the group is set aside: waited for where the depths
	// tell it (the held queue holds them all, the queue none), not timed.
	e.waitFor("the paused group's jobs to be set aside", func() bool {
		held, err := admin.Stats(ctx, ap.HeldQueue(e.queue, "acme"))
		if err != nil || held.Ready >= 0 && held.Ready < int64(len(acme)) {
			return false
		}
		st, err := admin.Stats(ctx, e.queue)
		return err == nil && st.Ready <= 0 && st.Scheduled <= 0
	})
	settle()
	for _, j := range acme {
		if n := e.rec.count(j.ID); n != 0 {
			t.Fatalf("a job of the paused group ran %d times", n)
		}
	}
	if g, err := admin.PausedGroups(ctx, e.queue); err != nil || !slices.Equal(g, []string{"acme"}) {
		t.Errorf("PausedGroups = %q, %v; want [acme]", g, err)
	}
	ran := len(starts(e))
	n, err := admin.ResumeGroup(ctx, e.queue, "acme")
	if err != nil || n != len(acme) {
		t.Fatalf("ResumeGroup = %d, %v; want %d moved back", n, err, len(acme))
	}
	for _, j := range acme {
		e.waitFor("every job of the resumed group to run", func() bool { return e.rec.count(j.ID) > 0 })
	}
	settle()
	e.rec.mu.Lock()
	var order []string
	for _, a := range e.rec.attempts[ran:] {
		order = append(order, a.ID)
	}
	e.rec.mu.Unlock()
	// The pause itself spends nothing. A crash is a lease lost (a loaded
	// machine), a crash of the job's own by the contract: one an attempt
	// reported excuses a crash of its job; one the worker only logged (the
	// delivery was being set aside, moved back, or waited for the worker:
	// no attempt, and the warning names no job) excuses one crash of any
	// job, as Crash/PoisonIsolation judges.
	want := make([]string, len(acme))
	attributed, excess := 0, 0
	var over []string
	for i, j := range acme {
		want[i] = j.ID
		lost := 0
		for _, o := range e.rec.outcomes(j.ID) {
			if o.Outcome == ap.OutcomeLeaseLost {
				lost++
			}
		}
		attributed += lost
		worst := 0
		for _, at := range e.rec.of(j.ID) {
			if at.Failures != 0 || at.TryCount != 1+at.Crashes || at.Job.Group != "acme" {
				t.Errorf("job %s attempt %+v (group %q): a group pause must not spend a try, and the job keeps its group", j.ID, at, at.Job.Group)
			}
			worst = max(worst, at.Crashes)
		}
		if n := worst - lost; n > 0 {
			excess += n
			over = append(over, fmt.Sprintf("job %s ran with %d crashes behind it, %d of its leases reported lost by an attempt", j.ID, worst, lost))
		}
	}
	switch pool := max(int(logged.Load())-attributed, 0); {
	case excess > pool:
		t.Errorf("a group pause spent a try: %d crashes no lost lease explains (%d leases the worker logged lost beyond its attempts' %d):\n%s", excess, pool, attributed, strings.Join(over, "\n"))
	case excess > 0:
		t.Logf("%d crashes, within the %d leases the worker logged lost beyond its attempts': %v", excess, pool, over)
	}
	if e.opts.Unordered != "" {
		t.Logf("the order of the resumed jobs is not checked: %s", e.opts.Unordered)
		slices.Sort(order)
		slices.Sort(want)
	}
	// A job the broker delivered again (a lease lapsed on a loaded
	// machine) comes after the ones behind it, on every broker; so does
	// one handed back while the worker's health gate was closed (a health
	// check timed out under load): the delivery it held and what its
	// cancelled Receive took, two a closing at most.
	if out := outOfPlace(order, want); len(order) == len(want) && out > 0 && out <= 5+2*int(unhealthy.Load()) {
		t.Logf("%d of the resumed group's %d jobs ran out of their order (delivered again; the health gate closed %d times)", out, len(want), unhealthy.Load())
		order = want
	}
	if !slices.Equal(order, want) {
		at := 0
		for at < min(len(order), len(want)) && order[at] == want[at] {
			at++
		}
		t.Errorf("the resumed group's jobs ran out of order (or not once each): %d runs for %d jobs, the first difference at %d:\n got %q\nwant %q", len(order), len(want), at, order[at:min(at+5, len(order))], want[at:min(at+5, len(want))])
	}
	if g, err := admin.PausedGroups(ctx, e.queue); err != nil || len(g) != 0 {
		t.Errorf("PausedGroups after ResumeGroup = %q, %v; want none", g, err)
	}
}

// testPriorityWithinQueue: jobs of one queue at priorities 0 to MaxPriority,
// enqueued lowest first, run highest level first at one handler, and each
// handler sees its job's Priority; a job of a bad priority is refused.
func testPriorityWithinQueue(t *testing.T, e *env) {
	admin := e.producer()
	for l := 1; l <= ap.MaxPriority; l++ {
		e.alsoDelete(ap.PriorityQueue(e.queue, l))
	}
	const each = 3
	var jobs []*ap.Job
	for l := 0; l <= ap.MaxPriority; l++ {
		for range each {
			jobs = append(jobs, &ap.Job{Type: "pr", Priority: l})
		}
	}
	e.enqueue(admin, jobs...)
	if err := admin.Enqueue(ctxT(t, e.opts.Wait), &ap.Job{Type: "pr", Queue: e.queue, Priority: ap.MaxPriority + 1}); !errors.Is(err, ap.ErrInvalidJob) {
		t.Errorf("Enqueue with Priority %d: %v, want ErrInvalidJob", ap.MaxPriority+1, err)
	}
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 1, Prefetch: ap.Limit(0), Priorities: true}}
	e.worker(cfg).handle(t, "pr", ok).start(t)
	e.waitFor("every job to run", func() bool { return len(starts(e)) >= len(jobs) })
	e.rec.mu.Lock()
	var got []int
	for _, a := range e.rec.attempts {
		got = append(got, a.Job.Priority)
		if want := ap.PriorityQueue(e.queue, a.Job.Priority); a.Job.Queue != want {
			t.Errorf("a job of priority %d came from queue %q, want %q", a.Job.Priority, a.Job.Queue, want)
		}
	}
	e.rec.mu.Unlock()
	want := make([]int, 0, len(jobs))
	for l := ap.MaxPriority; l >= 0; l-- {
		for range each {
			want = append(want, l)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("the jobs ran at priorities %v, want %v", got, want)
	}
}

// outOfPlace is how many jobs of got must move to put it in want's order
// (its length less its longest run in want's order), or len(want) when got
// does not hold each job of want once.
func outOfPlace(got, want []string) int {
	pos := make(map[string]int, len(want))
	for i, id := range want {
		pos[id] = i
	}
	var tails []int // patience sorting: the longest increasing subsequence of positions
	seen := make(map[string]bool, len(got))
	for _, id := range got {
		p, ok := pos[id]
		if !ok || seen[id] {
			return len(want)
		}
		seen[id] = true
		i, _ := slices.BinarySearch(tails, p)
		if i == len(tails) {
			tails = append(tails, p)
		} else {
			tails[i] = p
		}
	}
	return len(got) - len(tails)
}

// testPauseGroupSignedLevels: a paused group holds its jobs at every
// priority level of its queue, as signed workers wrote them; a platform
// without the SigningKey (asyncctl, a dashboard) resumes the group, and
// each job runs once, at its own level, none refused as unsigned.
func testPauseGroupSignedLevels(t *testing.T, e *env) {
	const group = "acme"
	for l := 0; l <= ap.MaxPriority; l++ {
		e.alsoDelete(ap.PriorityQueue(e.queue, l), ap.HeldQueue(ap.PriorityQueue(e.queue, l), group))
	}
	cfg := e.config()
	cfg.SigningKey = []byte("conformance: a 32-byte test key.")
	cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 1, Priorities: true}}
	w := e.worker(cfg).handle(t, "g", ok).start(t)
	admin := e.producer() // no SigningKey
	ctx := ctxT(t, 2*e.opts.Wait)
	if err := admin.PauseGroup(ctx, e.queue, group); err != nil {
		t.Fatalf("PauseGroup: %v", err)
	}
	t.Cleanup(func() { _, _ = admin.ResumeGroup(context.Background(), e.queue, group) })
	time.Sleep(2*ap.PausePoll + e.scaled(200*time.Millisecond)) // every worker has read it
	held := []*ap.Job{{Type: "g", Group: group}, {Type: "g", Group: group, Priority: 2}}
	other := &ap.Job{Type: "g", Group: "globex", Priority: 2}
	e.enqueue(w.P, append(slices.Clone(held), other)...) // signed
	e.waitFor("the other group's job to run", func() bool { return e.rec.count(other.ID) == 1 })
	for _, j := range held {
		hq := ap.HeldQueue(ap.PriorityQueue(e.queue, j.Priority), group)
		e.waitFor("the paused group's job to be held on "+hq, func() bool {
			st, err := admin.Stats(ctx, hq)
			return err == nil && st.Ready != 0
		})
	}
	e.settle()
	for _, j := range held {
		if n := e.rec.count(j.ID); n != 0 {
			t.Fatalf("a job of the paused group at priority %d ran %d times", j.Priority, n)
		}
	}
	n, err := admin.ResumeGroup(ctx, e.queue, group)
	if err != nil || n != len(held) {
		t.Fatalf("ResumeGroup without the SigningKey = %d, %v; want %d moved back", n, err, len(held))
	}
	for _, j := range held {
		e.waitFor("the resumed job to run (not dead-lettered as unsigned)", func() bool { return e.rec.count(j.ID) > 0 })
	}
	e.settle()
	for _, j := range held {
		for _, a := range e.rec.of(j.ID) {
			if a.Job.Priority != j.Priority || a.Job.Group != group {
				t.Errorf("job %s of priority %d ran at priority %d, group %q; want its own level and group", j.ID, j.Priority, a.Job.Priority, a.Job.Group)
			}
		}
	}
	for l := 0; l <= ap.MaxPriority; l++ {
		if st, err := admin.Stats(ctx, ap.PriorityQueue(e.queue, l)); err == nil && st.Dead != 0 {
			t.Errorf("queue %s has %d dead letters; want none", ap.PriorityQueue(e.queue, l), st.Dead)
		}
	}
}
