package faults

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// patience bounds every wait for an outcome: 90s, or 5m in the soak mode.
// Nothing is asserted on time: past it the run is checked as it stands.
var patience = func() time.Duration {
	if Soak() > 0 {
		return 5 * time.Minute
	}
	return 90 * time.Second
}()

type scenario struct {
	name string
	run  func(t *testing.T, r *run) *Report
}

var scenarios = []scenario{
	{"KillMidJob", killMidJob},
	{"PoisonJob", poisonJob},
	{"PoisonIsolation", poisonIsolation},
	{"BrokerRestart", func(t *testing.T, r *run) *Report { return brokerRestart(t, r, false) }},
	{"BrokerKill", func(t *testing.T, r *run) *Report { return brokerRestart(t, r, true) }},
	{"ConnectionCut", connectionCut},
	{"LeaseOutlived", leaseOutlived},
	{"Garbage", garbage},
	{"RejectStorm", rejectStorm},
	{"DeadLetterCrash", deadLetterCrash},
	{"DeadLetterConcurrent", deadLetterConcurrent},
	{"DeadLetterHolderKilled", deadLetterHolderKilled},
	{"SigtermMidJob", sigtermMidJob},
	{"WorkflowJoinKill", workflowJoinKill},
	{"BatchCallbackKill", batchCallbackKill},
	{"RandomFaults", randomFaults},
}

// scale multiplies a short-mode size for the soak mode.
func scale(n int) int {
	if Soak() > 0 {
		return 5 * n
	}
	return n
}

// pause sleeps a random duration in [lo, hi).
func pause(lo, hi time.Duration) { time.Sleep(lo + mrand.N(hi-lo)) }

// startsBy counts the attempts a worker started, per history.
func (r *run) startsBy(name string) int {
	n := 0
	for _, e := range r.history() {
		if e.Kind == KindStart && e.Worker == name {
			n++
		}
	}
	return n
}

// KillMidJob: workers are killed with SIGKILL at random points while they
// run jobs, and replaced. Every job completes; duplicates are allowed (a
// kill between the handler's commit and its ack).
func killMidJob(t *testing.T, r *run) *Report {
	r.lim.PoisonLimit = 50 // the kills are not the jobs' fault
	r.mustEnqueue(jobs("k", scale(60), Plan{SleepMin: 10, SleepMax: 80})...)
	live := []worker{r.start(r.spec(), true), r.start(r.spec(), true)}
	kills := 0
	for range scale(4) {
		i := mrand.IntN(len(live))
		v := live[i]
		if !r.waitFor(20*time.Second, func() bool { return r.startsBy(v.Name()) > 0 }) || r.resolved(r.history()) {
			break // nothing left to run
		}
		pause(0, 150*time.Millisecond)
		v.Kill()
		kills++
		live[i] = r.start(r.spec(), true)
	}
	t.Logf("%d workers killed mid-job", kills)
	r.waitResolved(patience)
	rep := r.finish(nil, true)
	r.judge(rep, true)
	return rep
}

// PoisonIsolation: one job kills its worker on every attempt, among 40
// innocent ones, at Concurrency 10 with the default prefetch. The crashes are
// charged to the poison job alone (its later attempts run alone, as
// suspects): it is attempted exactly PoisonLimit+1 times and dead-lettered
// poisoned; no innocent job is dead-lettered, and none is seen with more than
// the one crash it was present at.
func poisonIsolation(t *testing.T, r *run) *Report {
	r.mustEnqueue(jobs("m", 5, Plan{SleepMin: 10, SleepMax: 30})...)
	r.mustEnqueue(newJob("poison", Plan{Kill: true}))
	r.mustEnqueue(jobs("n", scale(35), Plan{SleepMin: 10, SleepMax: 30})...)
	spec := func() WorkerSpec {
		s := r.spec()
		s.Concurrency, s.Prefetch = 10, 10 // the platform's default prefetch
		return s
	}
	live := r.start(spec(), true)
	restarts := 0
	deadline := time.Now().Add(patience)
	for !r.done() && time.Now().Before(deadline) && restarts < 4*(r.lim.PoisonLimit+1) {
		select {
		case <-live.Done():
			live = r.start(spec(), true)
			restarts++
		default:
		}
		r.polls.Add(1) // bounded by patience: progress (see run.polls)
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("workers restarted %d times", restarts)
	return r.judgePoison(1) // an innocent job may have been present at one crash
}

// judgePoison checks a poison scenario: the job "poison" dead-lettered
// poisoned after exactly PoisonLimit+1 attempts, no other job
// dead-lettered, and none seen with more than innocentCrashes crashes. A
// lease a live worker reported lost is a crash of the job's own (on a
// loaded machine a renewal can come too late): an attempt's loss excuses a
// crash of its job, and a loss only warned of (see excess) one crash of any
// job, or one attempt the poison job did not get. A duplicate is allowed
// only for a job whose lease an attempt reported lost (its ack was
// refused), or whose worker died between an attempt's commit and its
// outcome (the poison job killed it).
func (r *run) judgePoison(innocentCrashes int) *Report {
	rep := r.finish(nil, false)
	h := r.history()
	lost, unnamed := h.lostLeases()
	var ex excess
	want := r.lim.PoisonLimit + 1
	switch n := h.count(KindStart, "")["poison"]; {
	case n > want:
		rep.Wrong("poison", "attempted %d times, want exactly PoisonLimit+1 = %d", n, want)
	case n < want:
		ex.add("poison", want-n, "attempted %d times, want exactly PoisonLimit+1 = %d", n, want)
	}
	worst := map[string]int{} // crashes each innocent job was seen with
	for _, dl := range r.dead {
		switch {
		case dl.Job.ID == "poison" && dl.Reason != ap.ReasonPoisoned:
			rep.Wrong("poison", "dead-lettered %s, want poisoned", dl.Reason)
		case dl.Job.ID != "poison" && dl.Reason != ap.ReasonPoisoned:
			rep.Wrong(dl.Job.ID, "an innocent job was dead-lettered %s", dl.Reason)
		case dl.Job.ID != "poison":
			worst[dl.Job.ID] = max(worst[dl.Job.ID], dl.Job.Crashes)
		}
	}
	for _, e := range h {
		if e.Kind == KindStart && e.ID != "poison" {
			worst[e.ID] = max(worst[e.ID], e.Crashes)
		}
	}
	for _, id := range sortedKeys(worst) {
		if n := worst[id] - innocentCrashes - lost[id]; n > 0 {
			ex.add(id, n, "an innocent job saw %d crashes (%d leases reported lost)", worst[id], lost[id])
		}
	}
	ex.judge(r.t, rep, unnamed)
	dupsOK := true
	for _, id := range rep.dups {
		dupsOK = dupsOK && (lost[id] > 0 || h.diedAfterCommit(id, "poison"))
	}
	r.judge(rep, dupsOK)
	return rep
}

// diedAfterCommit reports whether an attempt of job id ended well (its work
// committed) and its worker reported no outcome after it, that worker
// having started job killer (which kills its worker): the worker died
// between the commit and the ack, so the job rightly ran again. A live
// worker's unreported end excuses nothing.
func (h History) diedAfterCommit(id, killer string) bool {
	killed := map[string]bool{}
	for _, e := range h.of(killer) {
		if e.Kind == KindStart {
			killed[e.Worker] = true
		}
	}
	unreported := map[string]int{} // per worker: attempts that ended well, no outcome yet
	for _, e := range h.of(id) {
		switch {
		case e.Kind == KindEnd && e.Result == ResultOK:
			unreported[e.Worker]++
		case e.Kind == KindAck && unreported[e.Worker] > 0:
			unreported[e.Worker]--
		}
	}
	for w, n := range unreported {
		if n > 0 && killed[w] {
			return true
		}
	}
	return false
}

// excess gathers the crashes a scenario cannot explain job by job. A live
// worker can lose a lease without naming the job (a delivery that waited
// for a worker, or for a suspect's isolation, while the broker or the
// machine stalled; a hand-back refused): its platform only warns (KindLost).
// Each such loss explains one crash of some job, so the excess is wrong
// only when it outnumbers them.
type excess struct {
	n     int
	notes []struct {
		id, text string
	}
}

// add records n crashes of job id that nothing of its own explains.
func (x *excess) add(id string, n int, format string, args ...any) {
	x.n += n
	x.notes = append(x.notes, struct{ id, text string }{id, fmt.Sprintf(format, args...)})
}

// judge marks every recorded job wrong when the excess outnumbers the
// unnamed lost leases, and logs them otherwise.
func (x *excess) judge(t *testing.T, rep *Report, unnamed int) {
	t.Helper()
	for _, n := range x.notes {
		if x.n > unnamed {
			rep.Wrong(n.id, "%s: a crash nothing explains was charged to it (%d such crashes in all, %d leases live workers reported lost naming no job)", n.text, x.n, unnamed)
		} else {
			t.Logf("job %s: %s: within the %d leases live workers reported lost naming no job (%d such crashes in all)", n.id, n.text, unnamed, x.n)
		}
	}
}

// PoisonJob: one job kills its worker on every attempt. It is attempted
// exactly PoisonLimit+1 times and dead-lettered poisoned; the jobs around it
// (one job per worker at a time) never see a crash and complete once.
func poisonJob(t *testing.T, r *run) *Report {
	r.mustEnqueue(newJob("poison", Plan{Kill: true}))
	r.mustEnqueue(jobs("n", scale(20), Plan{SleepMin: 5, SleepMax: 30})...)
	spec := func() WorkerSpec {
		s := r.spec()
		s.Concurrency = 1
		return s
	}
	live := []worker{r.start(spec(), true), r.start(spec(), true)}
	restarts := 0
	deadline := time.Now().Add(patience)
	for !r.done() && time.Now().Before(deadline) && restarts < 4*(r.lim.PoisonLimit+1) {
		for i, w := range live {
			select {
			case <-w.Done():
				live[i] = r.start(spec(), true)
				restarts++
			default:
			}
		}
		r.polls.Add(1) // bounded by patience: progress (see run.polls)
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("workers restarted %d times", restarts)
	return r.judgePoison(0) // one job per worker: its neighbours never see a crash
}

// BrokerRestart and BrokerKill: the broker restarts (stopped gracefully, or
// killed with SIGKILL) while jobs are enqueued and worked. Enqueues that fail
// during the outage are indeterminate; every acknowledged one completes.
func brokerRestart(t *testing.T, r *run, kill bool) *Report {
	if r.tg.InProcess != "" {
		t.Skipf("no broker to restart: %s", r.tg.InProcess)
	}
	if r.tg.Private == nil && r.tg.HostPort == nil {
		t.Skip("no broker of the test's own (Target.Private) and no network connection (Target.HostPort): nothing to restart")
	}
	var restart func() error
	var killAge time.Duration
	if r.tg.Private != nil {
		b := r.tg.Private(t)
		if kill && b.NoKill != "" {
			t.Skipf("not killed: %s", b.NoKill)
		}
		if kill && b.KillAge > 0 {
			killAge = b.KillAge
			t.Logf("the first kill waits until the queues are %v old", killAge)
		}
		r.addr, r.home = b.Addr, b.Addr
		restart = func() error { return b.Restart(kill) }
		t.Logf("restart: the test's own broker, stopped (kill=%v) and started again", kill)
	} else if kill {
		t.Skip("no broker of the test's own to kill (BrokerRestart cuts the connections through a proxy instead; the shared broker is never touched)")
	} else {
		px := startProxy(t, r.tg.HostPort(r.tg.Addr))
		r.addr = r.tg.Via(r.tg.Addr, px.Addr())
		r.home = r.addr
		restart = func() error {
			px.Outage(1500 * time.Millisecond)
			time.Sleep(1500 * time.Millisecond)
			return nil
		}
		t.Logf("restart: a proxy outage of 1.5s (every connection cut, new ones refused); the shared broker is not restarted")
	}
	r.lim.PoisonLimit = 50
	r.ad()
	r.start(r.spec(), false)
	r.start(r.spec(), false)
	declared := time.Now() // the workers have declared the queue

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < scale(100) && ctx.Err() == nil; i++ {
			batch := jobs(fmt.Sprintf("r%03d", i), 5, Plan{SleepMin: 5, SleepMax: 40})
			ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
			_ = r.enqueue(ectx, batch...) // a failure is recorded as indeterminate
			ecancel()
			time.Sleep(30 * time.Millisecond)
		}
	}()
	for range scale(1) {
		pause(500*time.Millisecond, time.Second)
		time.Sleep(time.Until(declared.Add(killAge)))
		if err := r.restarted(restart); err != nil {
			cancel()
			<-done
			t.Fatalf("restarting the broker: %v", err)
		}
	}
	// The broker must take jobs again: one acknowledged enqueue within a
	// minute of the last restart (which, acknowledged, must complete). A
	// queue that still answers but takes nothing (a RabbitMQ quorum queue left
	// without a leader by a kill) fails here.
	probe := jobs("probe", 1, Plan{})
	taken := false
	for deadline := time.Now().Add(time.Minute); !taken && time.Now().Before(deadline); {
		ectx, ecancel := context.WithTimeout(context.Background(), 5*time.Second)
		taken = r.enqueue(ectx, probe...) == nil
		ecancel()
		if !taken {
			time.Sleep(time.Second)
		}
	}
	if !taken {
		t.Errorf("no enqueue was acknowledged for a minute after the broker's restart")
	}
	time.Sleep(time.Second) // load after the restart too
	cancel()
	<-done
	r.waitResolved(patience)
	rep := r.finish(nil, true)
	r.judge(rep, true)
	return rep
}

// ConnectionCut: a TCP proxy between the workers and the broker cuts every
// connection a few times while jobs run.
func connectionCut(t *testing.T, r *run) *Report {
	if r.tg.InProcess != "" || r.tg.HostPort == nil {
		t.Skipf("no connection to cut: %s", r.tg.InProcess)
	}
	px := startProxy(t, r.tg.HostPort(r.tg.Addr))
	r.addr = r.tg.Via(r.tg.Addr, px.Addr())
	r.lim.PoisonLimit = 50
	r.mustEnqueue(jobs("c", scale(80), Plan{SleepMin: 10, SleepMax: 60})...)
	a, b := r.start(r.spec(), false), r.start(r.spec(), false)
	r.waitFor(20*time.Second, func() bool { return r.startsBy(a.Name())+r.startsBy(b.Name()) > 0 })
	for range scale(3) {
		pause(200*time.Millisecond, 600*time.Millisecond)
		px.Cut()
	}
	r.waitResolved(patience)
	rep := r.finish(nil, true)
	r.judge(rep, true)
	return rep
}

// LeaseOutlived: a worker with lease extension turned off (at the driver:
// Extend does nothing) runs a job three leases long. If the backend hands
// the job out again meanwhile (to the idle second worker, or to the first
// worker's own fetcher, which claims ahead while its handler runs), the
// late ack must be refused (lease_lost) and the redelivery, counted as a
// crash, must succeed; if it does not (a lease tied to the connection), the
// late ack must succeed. Either way exactly one ack succeeds.
func leaseOutlived(t *testing.T, r *run) *Report {
	sa := r.spec()
	sa.Concurrency, sa.NoExtend = 1, true
	a := r.start(sa, false)
	r.mustEnqueue(newJob("late", Plan{SlowFirst: int(3 * r.tg.Lease / time.Millisecond)}))
	if !r.waitFor(patience, func() bool { return r.startsBy(a.Name()) > 0 }) {
		t.Fatal("the first worker never started the job")
	}
	sb := r.spec()
	sb.Concurrency = 1
	r.start(sb, false)
	// The attempts of the job, in the order they were started, and each
	// one's ack ("" until it acked).
	type attempt struct {
		worker, ack string
		crashes     int
	}
	attempts := func(h History) []attempt {
		var out []attempt
		for _, e := range h {
			switch {
			case e.ID != "late":
			case e.Kind == KindStart:
				out = append(out, attempt{worker: e.Worker, crashes: e.Crashes})
			case e.Kind == KindAck:
				for i := range out {
					if out[i].worker == e.Worker && out[i].ack == "" {
						out[i].ack = e.Result
						break
					}
				}
			}
		}
		return out
	}
	r.waitFor(patience, func() bool { at := attempts(r.history()); return len(at) > 0 && at[0].ack != "" })
	rep := r.finish(nil, true)
	at := attempts(r.history())
	switch {
	case len(at) > 1:
		t.Logf("redelivered while the first attempt ran (to %s: %s); the late ack: %s", at[1].worker, at[1].ack, at[0].ack)
		if at[0].ack != string(ap.OutcomeLeaseLost) {
			rep.Wrong("late", "the late ack after a redelivery was not refused: outcome %q, want lease_lost", at[0].ack)
		}
		if at[1].ack != string(ap.OutcomeSucceeded) {
			rep.Wrong("late", "the redelivery's outcome is %q, want succeeded", at[1].ack)
		}
		// A redelivery the first worker took waited behind its slow
		// attempt with its lease unextended too (NoExtend is the worker's),
		// so each lease it outlived there is one more crash; one the
		// second worker took saw exactly the first lost lease.
		switch {
		case at[1].worker == a.Name() && at[1].crashes < 1:
			rep.Wrong("late", "the redelivery to %s (extension off) saw %d crashes, want at least 1 (the lost lease)", at[1].worker, at[1].crashes)
		case at[1].worker != a.Name() && at[1].crashes != 1:
			rep.Wrong("late", "the redelivery saw %d crashes, want 1 (the lost lease)", at[1].crashes)
		}
	default:
		oa := ""
		if len(at) == 1 {
			oa = at[0].ack
		}
		t.Logf("not redelivered while the handler ran past its lease (the backend's lease outlives it); the late ack: %s", oa)
		if oa != string(ap.OutcomeSucceeded) {
			rep.Wrong("late", "the only attempt's outcome is %q, want succeeded", oa)
		}
	}
	r.judge(rep, true)
	return rep
}

// Garbage: foreign bytes written straight to the queue with the broker's own
// client are each dead-lettered invalid with their bytes kept, and the jobs
// around them complete. A foreign message is dead-lettered once, or once
// more for each lease a live worker warned lost and no attempt reported (a
// move to the dead letters whose lease lapsed before its delete: the
// message came back and was moved again; a foreign message has no job to
// report the loss under). A job completes once, or again only where an
// attempt of it reported its lease lost. Any other duplicate fails the run.
func garbage(t *testing.T, r *run) *Report {
	if r.tg.Garbage == nil {
		t.Skip("the target has no Garbage writer: no raw bytes to put on the queue")
	}
	r.start(r.spec(), false) // declares the queue
	blobs := [][]byte{
		[]byte("hello, I am not a job"),
		{0xA5, 'J', 1},          // the envelope's header, then nothing
		{0xA5, 'J', 9, 1, 2, 3}, // an envelope version from the future
		[]byte(`{"id":"x","type":"fault","payload":"e30="}`),
		{0xff, 0xfe, 0x00, 0x01},
		{},
	}
	rnd := make([]byte, 200)
	_, _ = rand.Read(rnd)
	blobs = append(blobs, rnd)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range scale(1) {
		for _, g := range blobs {
			if err := r.tg.Garbage(ctx, r.home, r.queue, g); err != nil {
				t.Logf("writing %d garbage bytes %.20q: %v (left out)", len(g), g, err)
				continue
			}
			r.mu.Lock()
			r.garbage = append(r.garbage, g)
			r.mu.Unlock()
		}
	}
	r.mustEnqueue(jobs("g", scale(10), Plan{SleepMax: 10})...)
	r.waitResolved(patience)
	rep := r.finish(nil, false)
	r.judge(rep, garbageExcused(rep, r.history()))
	return rep
}

// garbageExcused reports whether every duplicate of a Garbage run follows
// a lease lost: a job completed twice only where an attempt of it reported
// its lease lost (as RejectStorm judges), and a foreign message
// dead-lettered again by no more extra records than the losses warned of
// that name no job.
func garbageExcused(rep *Report, h History) bool {
	if rep.Duplicated == 0 {
		return false
	}
	byJob, unnamed := h.lostLeases()
	return rep.dupsExplained(byJob) && rep.GarbageExtra <= unnamed
}

// RejectStorm: every job rejects (Reject: transient, uncounted) three times
// out of four during its first second. Every job completes once and no
// attempt sees a failure, nor a crash but for leases the platform reported
// lost (see SigtermMidJob), and no job completes twice unless its lease was
// reported lost.
func rejectStorm(t *testing.T, r *run) *Report {
	r.mustEnqueue(jobs("rj", scale(40), Plan{RejectFor: 1000, SleepMax: 10})...)
	r.start(r.spec(), false)
	r.start(r.spec(), false)
	r.waitResolved(patience)
	rep := r.finish(nil, true)
	h := r.history()
	rejects := 0
	lost := h.count(KindAck, string(ap.OutcomeLeaseLost))
	for _, e := range h {
		if e.Kind == KindEnd && e.Result == ResultReject {
			rejects++
		}
		if e.Kind == KindStart && (e.Failures > 0 || e.Crashes > lost[e.ID]) {
			rep.Wrong(e.ID, "an attempt after rejections saw TryCount %d (failures %d, crashes %d, leases reported lost %d), want no failure and no crash but lost leases", e.Try, e.Failures, e.Crashes, lost[e.ID])
		}
	}
	t.Logf("%d rejections in all", rejects)
	r.judge(rep, rep.dupsExplained(lost))
	return rep
}

// dupsExplained reports whether every duplicated job had an attempt whose
// lease the platform reported lost (lost counts them per job): its ack was
// refused, so the job rightly ran again.
func (r *Report) dupsExplained(lost map[string]int) bool {
	for _, id := range r.dups {
		if lost[id] == 0 {
			return false
		}
	}
	return true
}

// deadIDs counts the distinct job IDs in the dead-letter listing.
func (r *run) deadIDs() int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := map[string]bool{}
	for cursor := ""; ; {
		page, err := r.ad().DeadLetters(ctx, r.queue, cursor, 1000)
		if err != nil {
			return len(ids)
		}
		for _, dl := range page.Letters {
			ids[dl.Job.ID] = true
		}
		if cursor = page.Next; cursor == "" {
			return len(ids)
		}
	}
}

// DeadLetterCrash: workers die inside DeadLetter: before the write, right
// after it, and at a random instant during it. Every job ends in the
// dead-letter queue at least once (a duplicate record is allowed, a loss is
// not); one whose dead-lettering killed more than PoisonLimit workers is
// dead-lettered poisoned by the next.
func deadLetterCrash(t *testing.T, r *run) *Report {
	n := scale(6)
	r.mustEnqueue(jobs("dl", n, Plan{Permanent: true})...)
	modes := []string{dieBefore, dieAfter, dieDuring, dieDuring, dieDuring}
	for range scale(1) - 1 {
		modes = append(modes, dieDuring, dieBefore, dieAfter)
	}
	for _, m := range modes {
		s := r.spec()
		s.Concurrency, s.DieInDeadLetter = 1, m
		w := r.start(s, true)
		died := r.waitFor(patience, func() bool {
			select {
			case <-w.Done():
				return true
			default:
				return r.deadIDs() >= n // nothing left to die on
			}
		})
		if !died {
			t.Fatalf("worker %s (dying %s DeadLetter) never died", w.Name(), m)
		}
	}
	r.start(r.spec(), true)
	if !r.waitFor(patience, func() bool { return r.deadIDs() >= n }) {
		t.Logf("only %d of %d jobs in the dead-letter queue after %v", r.deadIDs(), n, patience)
	}
	rep := r.finish(nil, true)
	for _, dl := range r.dead {
		// A job whose dead-lettering killed its worker more than
		// PoisonLimit times is rightly poisoned.
		if dl.Reason != ap.ReasonPermanent && dl.Reason != ap.ReasonPoisoned {
			rep.Wrong(dl.Job.ID, "dead-lettered %s, want permanent (or poisoned)", dl.Reason)
		}
	}
	r.judge(rep, true)
	return rep
}

// DeadLetterConcurrent: four NextDeadLetter callers, on connections of their
// own, drain a dead-letter queue at once; one always pops, one pops, one
// declines half the time, one fails half the time and vanishes once (its
// connection closes while it holds a record). No record is ever held by two
// callers, each is popped exactly once, none is lost.
//
// The callers go on until every record is popped, however long the record
// of the vanished caller stays hidden (a backend whose holds are leases
// shows it again only when its hold lapses: Azure's blob leases last 15 s
// at least); patience bounds the wait, and a record still hidden then is
// reported as a hold that outlived its caller. A job dead-lettered twice
// (two records: its first DeadLetter's lease was lost before the delivery
// was removed, and it ran again) is the at-least-once duplicate the
// contract allows when the history shows that lost lease; two callers
// holding the same record at once never is.
func deadLetterConcurrent(t *testing.T, r *run) *Report {
	n := scale(24)
	r.mustEnqueue(jobs("dc", n, Plan{Permanent: true})...)
	r.start(r.spec(), false)
	r.waitResolved(patience)
	r.stopAll()
	records := r.deadRecords()

	// A record is told apart from another of the same job by the attempt
	// that wrote it.
	type recKey struct {
		id     string
		tries  int
		deadAt int64
	}
	var (
		mu       sync.Mutex
		held     = map[recKey]int{}
		popped   []ap.DeadLetter
		maybe    []ap.DeadLetter // the callback asked to pop, and NextDeadLetter then failed
		twice    []string
		declined int
		vanished time.Time
		lostRec  recKey
	)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 4 {
		p, b := r.platform(r.home, false)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				all := len(popped)+len(maybe) >= records
				mu.Unlock()
				if all {
					return
				}
				var got *ap.DeadLetter
				err := p.NextDeadLetter(ctx, r.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
					k := recKey{dl.Job.ID, dl.Job.TryCount, dl.DeadAt.UnixNano()}
					mu.Lock()
					if held[k] > 0 {
						twice = append(twice, dl.Job.ID)
					}
					held[k]++
					vanish := i == 3 && vanished.IsZero()
					if vanish {
						vanished, lostRec = time.Now(), k
					}
					mu.Unlock()
					pause(0, 5*time.Millisecond)
					pop, err := true, error(nil)
					switch {
					case vanish:
						// The caller's connection dies while it holds the
						// record: from then on it holds nothing.
						mu.Lock()
						held[k]--
						mu.Unlock()
						b.Close()
						return true, nil
					case i == 2 && mrand.IntN(2) == 0:
						pop = false
					case i == 3 && mrand.IntN(2) == 0:
						err = errAdmin
					}
					mu.Lock()
					held[k]--
					if !pop || err != nil {
						declined++
					}
					mu.Unlock()
					if pop && err == nil {
						got = &dl
					}
					return pop, err
				})
				switch {
				case err == nil && got != nil:
					mu.Lock()
					popped = append(popped, *got)
					mu.Unlock()
				case errors.Is(err, driver.ErrNoDeadLetters):
					time.Sleep(20 * time.Millisecond) // the rest are held by others, or by the vanished caller
				case errors.Is(err, driver.ErrClosed):
					p, b = r.platform(r.home, false) // the vanished caller comes back
				case got != nil:
					// The pop was asked for and its settle failed: it may
					// have happened (a reply lost on a loaded machine).
					t.Logf("NextDeadLetter: the callback popped %s, then: %v", got.Job.ID, err)
					mu.Lock()
					maybe = append(maybe, *got)
					mu.Unlock()
				case err != nil && !errors.Is(err, errAdmin):
					t.Logf("NextDeadLetter: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if len(maybe) > 0 {
		// A record whose pop failed but is gone was popped; one still
		// listed is drained below.
		listed := map[recKey]bool{} // still there, or popped by another caller since
		for _, dl := range append(r.deadList(), popped...) {
			listed[recKey{dl.Job.ID, dl.Job.TryCount, dl.DeadAt.UnixNano()}] = true
		}
		for _, dl := range maybe {
			if k := (recKey{dl.Job.ID, dl.Job.TryCount, dl.DeadAt.UnixNano()}); !listed[k] {
				listed[k] = true
				t.Logf("the record of %s whose pop failed is gone: it was popped", dl.Job.ID)
				popped = append(popped, dl)
			}
		}
	}
	t.Logf("%d records, %d popped, %d declined or failed, a caller vanished: %v", records, len(popped), declined, !vanished.IsZero())
	if !vanished.IsZero() {
		back := false
		for _, dl := range popped {
			back = back || recKey{dl.Job.ID, dl.Job.TryCount, dl.DeadAt.UnixNano()} == lostRec
		}
		if back {
			t.Logf("the record the vanished caller held (%s) was popped again", lostRec.id)
		} else {
			t.Errorf("the record the vanished caller held (%s) was still hidden %v after it vanished: a hold outlived its caller",
				lostRec.id, time.Since(vanished).Round(time.Millisecond))
		}
	}
	rep := r.finish(popped, false)
	for _, id := range twice {
		rep.Duplicated++
		rep.note("duplicated: a dead letter of %s held by two callers at once", id)
		t.Errorf("a dead letter of %s was held by two callers at once", id)
	}
	// Each record is popped once, whatever happened; a job with two
	// records needs a lost lease for each record past its first.
	recs := map[recKey]int{}
	perJob := map[string]int{}
	for _, dl := range r.dead { // popped above, then drained
		k := recKey{dl.Job.ID, dl.Job.TryCount, dl.DeadAt.UnixNano()}
		if recs[k]++; recs[k] == 1 {
			perJob[k.id]++
		} else {
			t.Errorf("a dead letter of %s (try %d) was popped %d times", k.id, k.tries, recs[k])
		}
	}
	lost := r.history().count(KindAck, string(ap.OutcomeLeaseLost))
	explained := len(twice) == 0
	for _, id := range rep.dups {
		if perJob[id]-1 > lost[id] {
			explained = false
			rep.note("job %s has %d dead letters and %d leases reported lost: a record past its first needs a lost lease", id, perJob[id], lost[id])
		}
	}
	r.judge(rep, explained)
	return rep
}

// DeadLetterHolderKilled: a dead-letter caller in a process of its own
// takes a record with NextDeadLetter and is killed with SIGKILL while its
// callback still holds it, before any settle. Two callers in the test
// process drain the queue meanwhile: they never get the held record while
// its holder lives, and once it is dead the record comes back (when its
// hold lapses: Capabilities.DeadHold, or at once where a hold ends with
// its holder's connection) and is handed out exactly once; every record
// is popped exactly once, none is lost.
func deadLetterHolderKilled(t *testing.T, r *run) *Report {
	if r.tg.InProcess != "" {
		t.Skipf("a dead-letter caller killed needs a process of its own: %s", r.tg.InProcess)
	}
	n := scale(6)
	r.mustEnqueue(jobs("hk", n, Plan{Permanent: true})...)
	r.start(r.spec(), false)
	r.waitResolved(patience)
	r.stopAll()
	records := r.deadRecords()
	if records == 0 {
		t.Fatalf("no dead letters to hold (%d jobs enqueued)", n)
	}

	spec := r.spec()
	spec.HoldDead = true
	holder := r.start(spec, true)
	var held Event
	if !r.waitFor(patience, func() bool {
		for _, e := range r.history() {
			if e.Kind == KindHeld && e.Worker == spec.Name {
				held = e
				return true
			}
		}
		return false
	}) {
		t.Fatalf("the dead-letter caller %s held no record within %v", spec.Name, patience)
	}
	t.Logf("%s holds the dead letter of %s (try %d)", spec.Name, held.ID, held.Try)

	type recKey struct {
		id     string
		tries  int
		deadAt int64
	}
	var (
		mu       sync.Mutex
		killedAt time.Time // zero while the holder lives
		popped   []ap.DeadLetter
		pops     = map[recKey]int{}
		early    []string // the held record, handed out while its holder lived
		backAt   time.Duration
	)
	ctx, cancel := context.WithTimeout(context.Background(), patience+r.caps.DeadHold)
	defer cancel()
	heldPopped := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for k := range pops {
			if k.id == held.ID && k.tries == held.Try {
				return true
			}
		}
		return false
	}
	var wg sync.WaitGroup
	for range 2 {
		p, _ := r.platform(r.home, false)
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				all := len(popped) >= records
				mu.Unlock()
				if all {
					return
				}
				err := p.NextDeadLetter(ctx, r.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
					k := recKey{dl.Job.ID, dl.Job.TryCount, dl.DeadAt.UnixNano()}
					mu.Lock()
					defer mu.Unlock()
					if k.id == held.ID && k.tries == held.Try {
						if killedAt.IsZero() {
							early = append(early, k.id)
						} else if backAt == 0 {
							backAt = time.Since(killedAt)
						}
					}
					pops[k]++
					popped = append(popped, dl)
					return true, nil
				})
				switch {
				case err == nil:
				case errors.Is(err, driver.ErrNoDeadLetters):
					time.Sleep(20 * time.Millisecond) // the rest are held
				default:
					t.Logf("NextDeadLetter: %v", err)
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	// Kill the holder once every other record is popped (or, should
	// the callers be slow, after a while), so that what the callers do
	// while it lives shows its hold.
	r.waitFor(patience/2, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(popped) >= records-1
	})
	if !heldPopped() {
		time.Sleep(time.Second) // the callers asked for it at least once more
	}
	mu.Lock()
	holder.Kill()
	killedAt = time.Now()
	mu.Unlock()
	wg.Wait()

	t.Logf("%d records, %d popped; the held one (%s) back %v after its holder was killed (DeadHold %v)",
		records, len(popped), held.ID, backAt.Round(time.Millisecond), r.caps.DeadHold)
	for _, id := range early {
		t.Errorf("the dead letter of %s was handed out while %s, alive, held it", id, spec.Name)
	}
	if backAt == 0 && len(early) == 0 {
		t.Errorf("the dead letter of %s was not handed out again within %v of its holder's death: lost or held for ever",
			held.ID, time.Since(killedAt).Round(time.Millisecond))
	}
	for k, c := range pops {
		if c > 1 {
			t.Errorf("the dead letter of %s (try %d) was handed out and popped %d times", k.id, k.tries, c)
		}
	}
	rep := r.finish(popped, false)
	// A job dead-lettered twice while the queue was filled (its lease lost
	// on a loaded machine) is no fault of the holds: each record past a
	// job's first needs a lost lease.
	perJob := map[string]int{}
	for k := range pops {
		perJob[k.id]++
	}
	lost := r.history().count(KindAck, string(ap.OutcomeLeaseLost))
	explained := true
	for _, id := range rep.dups {
		if perJob[id]-1 > lost[id] {
			explained = false
			rep.note("job %s has %d dead letters and %d leases reported lost: a record past its first needs a lost lease", id, perJob[id], lost[id])
		}
	}
	r.judge(rep, explained)
	return rep
}

// errAdmin is DeadLetterConcurrent's failing admin's own error.
var errAdmin = errors.New("the admin's own failure")

// deadRecords counts the records in the dead-letter listing.
func (r *run) deadRecords() int { return len(r.deadList()) }

// deadList lists the dead-letter queue.
func (r *run) deadList() []ap.DeadLetter {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var all []ap.DeadLetter
	for cursor := ""; ; {
		page, err := r.ad().DeadLetters(ctx, r.queue, cursor, 1000)
		if err != nil {
			r.t.Fatalf("listing the dead letters: %v", err)
		}
		all = append(all, page.Letters...)
		if cursor = page.Next; cursor == "" {
			return all
		}
	}
}

// SigtermMidJob: a worker gets SIGTERM while its handlers run; it calls Stop,
// which hands their jobs back uncounted. Another worker completes them:
// nothing lost, and no try spent: no attempt sees a failure, nor a crash
// but for leases the platform reported lost (OutcomeLeaseLost: on a loaded
// machine an extension can come too late; the SPEC counts that as a crash;
// a loss only warned of excuses one crash of any job, see excess), and no
// job completes twice unless its lease was reported lost.
func sigtermMidJob(t *testing.T, r *run) *Report {
	n := scale(8)
	r.mustEnqueue(jobs("st", n, Plan{SleepMin: 1500, SleepMax: 2000})...)
	s := r.spec()
	s.StopTimeout = 200 * time.Millisecond
	w := r.start(s, true)
	if !r.waitFor(patience, func() bool { return r.startsBy(w.Name()) >= s.Concurrency }) {
		t.Logf("the worker started only %d jobs", r.startsBy(w.Name()))
	}
	pause(0, 300*time.Millisecond)
	w.Term()
	if c, ok := w.(*child); ok && c.p.Err() != nil {
		t.Errorf("the worker did not exit cleanly on SIGTERM: %v", c.p.Err())
	}
	s2 := r.spec()
	s2.Concurrency = n
	r.start(s2, true)
	r.waitResolved(patience)
	rep := r.finish(nil, true)
	cancels := 0
	h := r.history()
	lost, unnamed := h.lostLeases()
	worst := map[string]Event{} // each job's attempt (or dead letter) with the most crashes
	for _, e := range h {
		if e.Kind == KindEnd && e.Result == ResultCancel {
			cancels++
		}
		if e.Kind != KindStart {
			continue
		}
		if e.Failures > 0 {
			rep.Wrong(e.ID, "an attempt after the shutdown saw TryCount %d (failures %d, crashes %d): the shutdown spent a try", e.Try, e.Failures, e.Crashes)
		}
		if w, seen := worst[e.ID]; !seen || e.Crashes > w.Crashes {
			worst[e.ID] = e
		}
	}
	for _, dl := range r.dead { // a job may end with crashes no attempt saw
		if w, seen := worst[dl.Job.ID]; !seen || dl.Job.Crashes > w.Crashes {
			worst[dl.Job.ID] = Event{ID: dl.Job.ID, Try: dl.Job.TryCount, Failures: dl.Job.Failures, Crashes: dl.Job.Crashes}
		}
	}
	var ex excess
	for _, id := range sortedKeys(worst) {
		if e := worst[id]; e.Crashes > lost[id] {
			ex.add(id, e.Crashes-lost[id], "an attempt after the shutdown saw TryCount %d (failures %d, crashes %d, leases reported lost %d)", e.Try, e.Failures, e.Crashes, lost[id])
		}
	}
	ex.judge(t, rep, unnamed)
	t.Logf("%d running handlers cancelled by the shutdown", cancels)
	r.judge(rep, rep.dupsExplained(lost))
	return rep
}

// RandomFaults (soak mode only): jobs of every kind are enqueued while
// random faults hit the workers and the broker for the soak duration.
func randomFaults(t *testing.T, r *run) *Report {
	d := Soak()
	if d == 0 {
		t.Skipf("soak mode only (set %s)", SoakEnv)
	}
	var restart func() error
	var cut func()
	switch {
	case r.tg.InProcess != "":
	case r.tg.Private == nil && r.tg.HostPort == nil:
		// Faults hit the workers only: no broker, no connection.
	case r.tg.Private != nil:
		b := r.tg.Private(t)
		px := startProxy(t, r.tg.HostPort(b.Addr))
		r.addr, r.home = r.tg.Via(b.Addr, px.Addr()), b.Addr
		restart = func() error { return b.Restart(b.NoKill == "" && b.KillLeaves == "" && mrand.IntN(2) == 0) }
		cut = px.Cut
	default:
		px := startProxy(t, r.tg.HostPort(r.tg.Addr))
		r.addr = r.tg.Via(r.tg.Addr, px.Addr())
		restart = func() error { px.Outage(time.Second); time.Sleep(time.Second); return nil }
		cut = px.Cut
	}
	r.lim.PoisonLimit = 50
	r.ad()
	live := []worker{r.start(r.spec(), true), r.start(r.spec(), true), r.start(r.spec(), true)}

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make(chan struct{})
	go func() { // the producer
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			var batch []*ap.Job
			for k := range 5 {
				var p Plan
				var pol ap.Policy
				switch x := mrand.IntN(100); {
				case x < 65:
					p = Plan{SleepMax: 50}
				case x < 75:
					p = Plan{Fail: 1, SleepMax: 20}
				case x < 80:
					p = Plan{Fail: 5} // past the retry limit
				case x < 85:
					p = Plan{Permanent: true}
				case x < 97:
					p = Plan{RejectFor: 500, SleepMax: 20}
				default:
					p, pol = Plan{Kill: true}, ap.Policy{PoisonLimit: ap.Limit(1)}
				}
				j := newJob(fmt.Sprintf("s%05d-%d", i, k), p)
				j.Policy = pol
				batch = append(batch, j)
			}
			ectx, ecancel := context.WithTimeout(ctx, 5*time.Second)
			_ = r.enqueue(ectx, batch...)
			ecancel()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	faults := map[string]int{}
	lastRestart := time.Now()
	for ctx.Err() == nil {
		pause(300*time.Millisecond, 1500*time.Millisecond)
		for i, w := range live { // poison jobs kill workers too
			select {
			case <-w.Done():
				live[i] = r.start(r.spec(), true)
			default:
			}
		}
		i := mrand.IntN(len(live))
		switch x := mrand.IntN(10); {
		case x < 4:
			live[i].Kill()
			live[i] = r.start(r.spec(), true)
			faults["kill"]++
		case x < 6:
			live[i].Term()
			live[i] = r.start(r.spec(), true)
			faults["sigterm"]++
		case x < 8 && cut != nil:
			cut()
			faults["cut"]++
		case x < 9 && restart != nil && time.Since(lastRestart) > 10*time.Second:
			if err := r.restarted(restart); err != nil {
				t.Errorf("restarting the broker: %v", err)
			}
			lastRestart = time.Now()
			faults["restart"]++
		default:
			g := make([]byte, 1+mrand.IntN(100))
			_, _ = rand.Read(g)
			gctx, gcancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := r.tg.Garbage(gctx, r.home, r.queue, g); err == nil {
				r.mu.Lock()
				r.garbage = append(r.garbage, g)
				r.mu.Unlock()
				faults["garbage"]++
			}
			gcancel()
		}
	}
	<-done
	t.Logf("soak of %v: faults %v", d, faults)
	deadline := time.Now().Add(2 * patience)
	for !r.done() && time.Now().Before(deadline) {
		for i, w := range live {
			select {
			case <-w.Done():
				live[i] = r.start(r.spec(), true)
			default:
			}
		}
		r.polls.Add(1) // bounded by two patiences: progress (see run.polls)
		time.Sleep(100 * time.Millisecond)
	}
	rep := r.finish(nil, true)
	r.judge(rep, true)
	return rep
}
