package faults

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/conformance/internal/casewatch"
	"github.com/asyncplatform/asyncplatform/driver"
)

// Target is one backend under test, and the means to hurt it.
type Target struct {
	// Name names the backend in reports.
	Name string

	// Addr is the address of the broker for the ordinary scenarios, in the
	// form Open takes.
	Addr string

	// Open opens a new connection to the broker at addr, as a worker
	// process would. It is called in child processes too, so it must
	// depend on nothing but addr.
	Open func(ctx context.Context, addr string) (driver.Backend, error)

	// InProcess, when non-empty, says why the broker lives in the test
	// process (the memory backend): workers are then goroutines, a crash is
	// a closed connection, and the scenarios that need a network log the
	// reason and skip.
	InProcess string

	// KnownDefects names scenarios the broker is known to fail, each with
	// the defect and where it is tracked (a server version's bug, say):
	// such a scenario is skipped with that text in the log, and the
	// checker itself stays as strict. Real brokers without a known defect
	// leave it nil.
	KnownDefects map[string]string

	// HostPort returns the TCP address in addr, and Via returns addr with
	// that TCP address replaced by hostport (a proxy's). Nil when the
	// backend has no network connection.
	HostPort func(addr string) string
	Via      func(addr, hostport string) string

	// Private starts a broker instance of the test's own, stopped when the
	// test ends, for the BrokerRestart and BrokerKill scenarios (StartServer
	// runs one; SharedPrivate boots a slow one once for every scenario).
	// Nil: BrokerRestart restarts the broker as the worker sees it, through
	// a proxy that cuts every connection and refuses new ones for a while
	// (the shared broker itself is never touched), and BrokerKill skips;
	// with HostPort nil too (a database file, no server), both skip.
	Private func(t *testing.T) *Broker

	// Garbage writes raw bytes straight to the queue with the broker's own
	// client, as a foreign producer would.
	Garbage func(ctx context.Context, addr, queue string, raw []byte) error

	// Lease is the lease the scenarios' workers hold jobs under. Defaults
	// to one second.
	Lease time.Duration

	// Deadline bounds how long one scenario may run. A scenario still
	// running then has stalled: it fails, naming the scenario, with the
	// stacks of the goroutines it started (what each was waiting for), and
	// the rest of the report prints. Defaults to two patiences and a minute
	// (4 minutes; 11 in the soak mode).
	Deadline time.Duration

	// Idle bounds how long a scenario may go without progress (no event
	// logged by its workers or by the scenario itself, and no poll of one
	// of its bounded waits) before it has stalled, with the same report as
	// Deadline. Defaults to a patience and ten seconds (100 s: a stall
	// fails within two minutes; 5m10s in the soak mode). A wait bounded by
	// a time of its own (an outcome awaited for a patience, the queue's
	// quiescence, a broker's restart) is progress while it polls, so waits
	// in a row with nothing logged are not an idle stall; only Deadline
	// bounds their sum.
	Idle time.Duration
}

// Broker is a broker instance of a test's own.
type Broker struct {
	// Addr is its address, in the form Target.Open takes.
	Addr string
	// Restart stops the broker, abruptly (SIGKILL) when kill is true and
	// gracefully (SIGTERM) otherwise, and starts it again on the same port
	// with the same data, returning when it accepts connections. It must
	// return within a bound of its own (Server's: 30 s to stop, then
	// ServerConfig.Boot to listen): the scenario counts it as progress
	// while it runs, so only the scenario's Deadline stops a hung one.
	Restart func(kill bool) error
	// NoKill, when non-empty, says why killing this broker tells nothing
	// about the backend (an emulator that persists every few seconds): the
	// BrokerKill scenario then logs it and skips.
	NoKill string
	// KillLeaves, when non-empty, says what a SIGKILL of this broker can do
	// at a random moment that the backend cannot make up for (a broker
	// fact, shown by a fact test of its own). RandomFaults, whose faults
	// land at random moments, then restarts it gracefully only; BrokerKill
	// still kills it.
	KillLeaves string
	// KillAge, when non-zero, is how old the queues must be before a
	// SIGKILL of this broker tells something about the backend: BrokerKill
	// kills it no sooner than that after its workers declared their queues.
	KillAge time.Duration
}

// SoakEnv names the variable that turns on the soak mode: a Go duration
// ("10m") for the random-fault run of each backend, or "1" for two minutes.
// The scenarios then run with more jobs and more faults.
const SoakEnv = "ASYNCPLATFORM_SOAK"

// Soak returns the soak duration, zero when the soak mode is off.
func Soak() time.Duration {
	v := os.Getenv(SoakEnv)
	if v == "" || v == "0" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil {
		return d
	}
	return 2 * time.Minute
}

// ReportEnv names a file to which every scenario appends its figures as a
// Markdown table row (backend, scenario, figures, duration). Each backend's
// suite runs in its own test binary, and go test runs several at once: each
// row is one write to a file opened for appending, so the rows of every
// backend gather in the file whole.
const ReportEnv = "ASYNCPLATFORM_FAULTS_REPORT"

// Run runs every fault scenario on the target, each as a named subtest. A
// backend calls it from its own folder, in a test of its own (TestFaults in
// its conformance_test.go), with a Target that opens the backend:
//
//	func TestFaults(t *testing.T) {
//		t.Parallel()
//		faults.Run(t, faults.Target{Name: "mybackend", Addr: addr, Open: open, ...})
//	}
//
// Scenarios that kill worker processes re-execute the test binary with
// -test.run set to t.Name(): the child reaches Run again and becomes a
// worker instead, so t.Name() must lead to this call with nothing else of
// consequence on the way, and the Target must be built the same way in the
// child (its environment is the parent's).
func Run(t *testing.T, tg Target) {
	if js := os.Getenv(childEnv); js != "" {
		runChild(tg, js)
	}
	if tg.Lease == 0 {
		tg.Lease = time.Second
	}
	if tg.Deadline <= 0 {
		tg.Deadline = 2*patience + time.Minute
	}
	if tg.Idle <= 0 {
		tg.Idle = patience + 10*time.Second
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			if why := tg.KnownDefects[sc.name]; why != "" {
				t.Skipf("known defect: %s", why)
			}
			dir := t.TempDir()
			var polls atomic.Int64
			casewatch.RunIdle(t, tg.Deadline, tg.Idle, progress(dir, &polls), 10*time.Second, nil, func() {
				start := time.Now()
				r := newRun(t, tg, sc.name, dir, &polls)
				if rep := sc.run(t, r); rep != nil {
					r.record(rep, time.Since(start))
				}
			})
		})
	}
}

// stopWait bounds how long the end of a scenario waits for its workers to
// stop.
const stopWait = 30 * time.Second

// run is one scenario on one backend.
type run struct {
	t     *testing.T
	tg    Target
	name  string
	path  string // the test to re-execute for a child worker
	addr  string // where workers connect
	home  string // where the admin platform connects (the broker itself)
	queue string
	dir   string
	// polls counts the polls of the run's bounded waits (waitFor, quiesce,
	// a broker's restart, the loops that restart workers for a patience).
	// With the bytes logged, it is the progress the idle deadline watches:
	// a wait bounded by a time of its own is not an idle stall, however
	// long nothing is logged during it, so waits in a row never add up to
	// one. The scenario's Deadline still bounds them all together.
	polls *atomic.Int64
	log   *Log // the parent's own events
	admin *ap.Platform
	caps  driver.Capabilities
	lim   Limits

	mu      sync.Mutex
	n       int
	workers []worker
	beat    time.Duration        // the workers' Heartbeat, once spec has asked Stats
	beating map[string]bool      // workers whose record workersIdle has seen
	ended   map[string]time.Time // when workersIdle first saw each worker gone
	garbage [][]byte
	dead    []ap.DeadLetter // every dead letter found, once finish has run
}

// logged is how many bytes the scenario's logs in dir hold: it grows while
// the scenario makes progress.
func logged(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && !fi.IsDir() {
			n += fi.Size()
		}
	}
	return n
}

// progress is the figure a scenario's idle deadline watches: the bytes its
// logs in dir hold, and its bounded waits' polls.
func progress(dir string, polls *atomic.Int64) func() int64 {
	return func() int64 { return logged(dir) + polls.Load() }
}

func newRun(t *testing.T, tg Target, name, dir string, polls *atomic.Int64) *run {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	r := &run{
		t:     t,
		tg:    tg,
		name:  name,
		path:  t.Name()[:strings.LastIndex(t.Name(), "/")],
		addr:  tg.Addr,
		home:  tg.Addr,
		queue: "f-" + strings.ToLower(name) + "-" + hex.EncodeToString(rnd[:]),
		dir:   dir,
		polls: polls,
		lim:   Limits{RetryLimit: 2, PoisonLimit: 3},
	}
	var err error
	if r.log, err = OpenLog(filepath.Join(r.dir, "parent.jsonl")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.log.Close() })
	t.Cleanup(func() { r.stopAll() }) // runs before the queue is deleted
	return r
}

// ad returns the admin platform (opening it on first use, on r.home): it
// enqueues, drains dead letters and reads stats.
func (r *run) ad() *ap.Platform {
	r.t.Helper()
	if r.admin == nil {
		var b driver.Backend
		r.admin, b = r.platform(r.home, true)
		r.caps = b.Capabilities()
	}
	return r.admin
}

// platform opens a platform on addr that only enqueues and administers,
// closed at the end of the test; the owner also deletes the run's queue.
func (r *run) platform(addr string, owner bool) (*ap.Platform, driver.Backend) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := r.tg.Open(ctx, addr)
	if err != nil {
		r.t.Fatalf("opening %s: %v", r.tg.Name, err)
	}
	r.t.Cleanup(func() {
		r.stopAll() // before the queue goes
		if d, ok := b.(driver.QueueDeleter); ok && owner {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := d.DeleteQueue(ctx, r.queue); err != nil && !errors.Is(err, driver.ErrClosed) {
				r.t.Logf("deleting queue %s: %v", r.queue, err)
			}
		}
		b.Close()
	})
	p, err := ap.New(b, ap.Config{Logger: quiet(), Queues: map[string]ap.QueueConfig{r.queue: {}}})
	if err != nil {
		r.t.Fatal(err)
	}
	return p, b
}

// spec returns the default worker spec of the run, with a fresh name.
func (r *run) spec() WorkerSpec {
	r.mu.Lock()
	r.n++
	n := r.n
	r.mu.Unlock()
	name := fmt.Sprintf("w%d", n)
	return WorkerSpec{
		Heartbeat:   r.heartbeat(),
		Name:        name,
		Addr:        r.addr,
		Queue:       r.queue,
		Log:         filepath.Join(r.dir, name+".jsonl"),
		Concurrency: 4,
		Prefetch:    0,
		Lease:       r.tg.Lease,
		RetryLimit:  r.lim.RetryLimit,
		PoisonLimit: r.lim.PoisonLimit,
		RejectDelay: 20 * time.Millisecond,
		StopTimeout: 2 * time.Second,
	}
}

// start starts a worker: a child process when proc is true and the target
// can, else a platform in this process.
func (r *run) start(spec WorkerSpec, proc bool) worker {
	r.t.Helper()
	var w worker
	if proc && r.tg.InProcess == "" {
		c, err := startChild(r.path, spec, r.dir)
		if err != nil {
			r.t.Fatalf("starting worker %s: %v", spec.Name, err)
		}
		w = c
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ip, err := startInproc(ctx, r.tg, spec)
		if err != nil {
			r.t.Fatalf("starting worker %s: %v", spec.Name, err)
		}
		w = ip
	}
	r.mu.Lock()
	r.workers = append(r.workers, w)
	r.mu.Unlock()
	return w
}

// stopAll stops every worker still running, gracefully.
func (r *run) stopAll() {
	r.mu.Lock()
	ws := r.workers
	r.workers = nil
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.Term()
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(stopWait):
		r.t.Errorf("the scenario's workers had not stopped %v after they were told to: a platform is stuck (see the scenario's other failures); they are left behind", stopWait)
	}
}

// enqueue enqueues the jobs one batch at a time, recording each outcome.
func (r *run) enqueue(ctx context.Context, jobs ...*ap.Job) error {
	for _, j := range jobs {
		j.Queue = r.queue
	}
	from := time.Now()
	err := r.ad().EnqueueBatch(ctx, jobs)
	k := KindEnqueue
	if err != nil {
		k = KindMaybe
	}
	for _, j := range jobs {
		r.log.Add(Event{Kind: k, ID: j.ID, From: from})
	}
	return err
}

// restarted runs restart, recording the outage in the history.
// A restart is bounded by its Broker (a stop's wait and a boot's), so it
// is progress while it runs, however long the broker takes to boot.
func (r *run) restarted(restart func() error) error {
	from := time.Now()
	errc := make(chan error, 1)
	go func() {
		err := errors.New("the restart ended without returning (t.FailNow or t.Skip in a Broker's Restart)")
		defer func() { errc <- err }()
		err = restart()
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var err error
	for done := false; !done; {
		select {
		case err = <-errc:
			done = true
		case <-tick.C:
			r.polls.Add(1)
		}
	}
	r.log.Add(Event{Kind: KindRestart, From: from})
	return err
}

// mustEnqueue enqueues jobs, failing the test on error.
func (r *run) mustEnqueue(jobs ...*ap.Job) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(jobs) > 0 {
		n := min(len(jobs), 50)
		if err := r.enqueue(ctx, jobs[:n]...); err != nil {
			r.t.Fatalf("enqueue: %v", err)
		}
		jobs = jobs[n:]
	}
}

// jobs makes n jobs with the plan, named from prefix.
func jobs(prefix string, n int, p Plan) []*ap.Job {
	out := make([]*ap.Job, n)
	for i := range out {
		out[i] = newJob(fmt.Sprintf("%s-%04d", prefix, i), p)
	}
	return out
}

// history loads the run's history.
func (r *run) history() History {
	r.t.Helper()
	h, err := LoadHistory(r.dir)
	if err != nil {
		r.t.Fatalf("loading the history: %v", err)
	}
	return h
}

// resolved reports whether every acknowledged enqueue has completed or been
// seen dead-lettered, and every garbage message dead-lettered, per history.
func (r *run) resolved(h History) bool {
	enq, ok, dead := h.count(KindEnqueue, ""), h.count(KindEnd, ResultOK), h.count(KindDead, "")
	for id := range enq {
		if ok[id] == 0 && dead[id] == 0 {
			return false
		}
	}
	foreign := 0
	for id := range dead {
		if enq[id] == 0 {
			foreign++
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return foreign >= len(r.garbage)
}

// waitFor polls cond every 50ms until it holds or d passes; it reports
// whether it held.
func (r *run) waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		r.polls.Add(1)
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// waitResolved waits until the history shows every job resolved, or the
// run has gone quiet (see quiet), or d.
func (r *run) waitResolved(d time.Duration) {
	r.t.Helper()
	if !r.waitFor(d, r.done) {
		r.t.Logf("not every job resolved within %v; checking anyway", d)
	}
}

// done reports whether the run is over: every job resolved per history, or
// quiet. A worker killed right after a dead-letter write never records it,
// so under random kills the history alone may never say "resolved".
func (r *run) done() bool {
	h := r.history()
	return r.resolved(h) || r.quiet(h)
}

// quiet reports whether nothing has happened for two leases and a second
// and the queue shows nothing ready, scheduled or in flight (as far as Stats
// can tell). Where Stats cannot tell what is in flight (InFlight -1), the
// workers' own records must show that none of them holds a job: a worker
// that hands its buffer back before a suspect runs alone holds jobs the
// queue does not count as ready, for seconds on a loaded machine. There
// the records are read before Stats too, and Stats is not called while
// they say busy.
func (r *run) quiet(h History) bool {
	if len(h) == 0 {
		return false
	}
	last := h[len(h)-1].At
	if time.Since(last) < 2*r.tg.Lease+time.Second {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.mu.Lock()
	unknown := r.beat == quietBeat // the workers beat fast: Stats could not tell what is in flight, or could not be read
	r.mu.Unlock()
	if unknown && !r.workersIdle(ctx, last, r.ad().Workers) {
		// No Stats while the records say busy: on RabbitMQ it opens a
		// channel for every delay step the queue does not have.
		return false
	}
	st, err := r.ad().Stats(ctx, r.queue)
	if err != nil || st.Ready > 0 || st.Scheduled > 0 || st.InFlight > 0 {
		return false
	}
	// The records again, after Stats: a job taken from the queue after
	// the first read shows in a record beaten after the take.
	return st.InFlight == 0 || r.workersIdle(ctx, last, r.ad().Workers)
}

// quietBeat is the workers' heartbeat where Stats cannot tell what is in
// flight: workersIdle reads what each holds from its record.
const quietBeat = 250 * time.Millisecond

// heartbeat returns the workers' Heartbeat: quietBeat where the queue's
// Stats cannot tell what is in flight (or could not be read), else 0 (the
// platform's default), asked once per run.
func (r *run) heartbeat() time.Duration {
	r.mu.Lock()
	beat := r.beat
	r.mu.Unlock()
	if beat != 0 {
		return max(beat, 0)
	}
	beat = quietBeat
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if st, err := r.ad().Stats(ctx, r.queue); err == nil && st.InFlight >= 0 {
		beat = -1 // known: the default
	}
	r.mu.Lock()
	r.beat = beat
	r.mu.Unlock()
	return max(beat, 0)
}

// workersIdle reports whether no worker of the run still running held a
// job at a heartbeat after since (without a store that cannot be known,
// and only the workers that went are waited for). A running worker whose
// record is missing (a late beat drops it from Platform.Workers) is idle
// only if it never had one: a worker that holds dead letters, or one still
// starting. A worker that has gone counts as busy for two leases and a
// second after workersIdle first saw it gone: the broker puts back what it
// held in its own time, and until then the queue shows it nowhere. The
// records are read on every call, whatever the answer, so that each
// running worker's first record is noted (see judgeIdle). records lists
// the workers' records (Platform.Workers).
func (r *run) workersIdle(ctx context.Context, since time.Time, records func(context.Context) ([]ap.WorkerInfo, error)) bool {
	var running []string
	goneBusy := false
	r.mu.Lock()
	if r.beating == nil {
		r.beating, r.ended = map[string]bool{}, map[string]time.Time{}
	}
	for _, w := range r.workers {
		select {
		case <-w.Done():
			at, ok := r.ended[w.Name()]
			if !ok {
				at = time.Now()
				r.ended[w.Name()] = at
			}
			if time.Since(at) < 2*r.tg.Lease+time.Second {
				goneBusy = true
			}
		default:
			running = append(running, w.Name())
		}
	}
	r.mu.Unlock()
	ws, err := records(ctx)
	if errors.Is(err, ap.ErrNoStore) {
		return !goneBusy
	}
	if err != nil {
		return false
	}
	rec := map[string]ap.WorkerInfo{}
	for _, w := range ws {
		if slices.Contains(w.Queues, r.queue) {
			rec[w.Name] = w
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return judgeIdle(running, rec, r.beating, since) && !goneBusy
}

// judgeIdle reports whether every running worker is idle by its record rec:
// nothing held at a beat after since, or no record and never one before.
// It notes in beating every running worker that has a record, all of them
// before it judges, so that a worker whose record goes missing later is
// known to have had one.
func judgeIdle(running []string, rec map[string]ap.WorkerInfo, beating map[string]bool, since time.Time) bool {
	for _, name := range running {
		if _, ok := rec[name]; ok {
			beating[name] = true
		}
	}
	for _, name := range running {
		in, ok := rec[name]
		switch {
		case ok:
			if in.Held > 0 || !in.BeatAt.After(since) {
				return false
			}
		case beating[name]:
			return false
		}
	}
	return true
}

// finish stops the workers, drains the dead letters, checks the history and
// the queues' emptiness, and reports. extraDead are dead letters the
// scenario popped itself. Duplicates fail the test unless allowDup.
func (r *run) finish(extraDead []ap.DeadLetter, allowDup bool) *Report {
	r.t.Helper()
	r.quiesce()
	r.stopAll()
	dead := append(extraDead, r.drain()...)
	r.dead = dead
	r.mu.Lock()
	garbage := r.garbage
	r.mu.Unlock()
	rep := Check(r.history(), dead, garbage, r.lim)
	rep.Empty, rep.Leftover = r.empty()
	if !rep.Empty {
		r.explainLeftover()
	}
	return rep
}

// explainLeftover runs a worker on what was left in the queue and logs what
// it got, to tell what the leftover messages were.
func (r *run) explainLeftover() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if page, err := r.ad().DeadLetters(ctx, r.queue, "", 100); err == nil {
		r.t.Logf("left: %d dead letters listed", len(page.Letters))
		for _, dl := range page.Letters {
			r.t.Logf("left in the dead-letter queue: %s %s (%d tries)", dl.Job.ID, dl.Reason, dl.Job.TryCount)
		}
	}
	err := r.ad().NextDeadLetter(ctx, r.queue, func(context.Context, ap.DeadLetter) (bool, error) { return false, nil })
	r.t.Logf("left: NextDeadLetter says %v", err)
	s := r.spec()
	s.Name, s.Log = "leftover", filepath.Join(r.dir, "leftover.jsonl")
	w := r.start(s, false)
	time.Sleep(2*r.tg.Lease + time.Second)
	w.Term()
	for _, e := range r.history() {
		if e.Worker == "leftover" && e.Kind == KindStart {
			r.t.Logf("left in the queue: job %s (try %d, failures %d, crashes %d); its history: %s",
				e.ID, e.Try, e.Failures, e.Crashes, r.history().of(e.ID).brief())
		}
	}
}

// quiesce lets deliveries abandoned by dead workers come back and be worked
// (a pending duplicate is not a leftover): it waits until the queue shows
// nothing ready, scheduled or in flight twice in a row. Where the backend
// cannot tell what is in flight, it first waits out one lease.
func (r *run) quiesce() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	idle := func() (bool, bool) {
		st, err := r.ad().Stats(ctx, r.queue)
		if err != nil {
			return false, false
		}
		return st.Ready <= 0 && st.Scheduled <= 0 && st.InFlight <= 0, st.Ready < 0 || st.Scheduled < 0 || st.InFlight < 0
	}
	if _, unknown := idle(); unknown && !r.caps.RedeliversOnClose {
		time.Sleep(r.tg.Lease + 500*time.Millisecond)
	}
	quiet := 0
	for quiet < 2 && ctx.Err() == nil {
		if ok, _ := idle(); ok {
			quiet++
		} else {
			quiet = 0
		}
		r.polls.Add(1)
		time.Sleep(200 * time.Millisecond)
	}
}

// judge logs the report and fails the test on a bad figure.
func (r *run) judge(rep *Report, allowDup bool) {
	r.t.Helper()
	r.t.Logf("%s %s: %s", r.tg.Name, r.name, rep)
	bad := rep.Lost > 0 || rep.Unexpected > 0 || rep.WrongTries > 0 || !rep.Empty || (!allowDup && rep.Duplicated > 0)
	for _, n := range rep.Notes {
		if bad {
			r.t.Errorf("  %s", n)
		} else {
			r.t.Logf("  %s", n)
		}
	}
	if bad && len(rep.Notes) == 0 {
		r.t.Errorf("bad figures: %s", rep)
	}
	if dir := os.Getenv(KeepEnv); bad && dir != "" {
		r.keep(dir)
	}
}

// KeepEnv names a directory into which a run with bad figures copies its
// run directory (the history files and the child workers' output), since
// the test's own is removed at its end.
const KeepEnv = "ASYNCPLATFORM_FAULTS_KEEP"

// keep copies the run directory under dir.
func (r *run) keep(dir string) {
	dst, err := os.MkdirTemp(dir, strings.ReplaceAll(r.t.Name(), "/", "_")+"-")
	if err == nil {
		err = os.CopyFS(dst, os.DirFS(r.dir))
	}
	if err != nil {
		r.t.Logf("keeping the run directory: %v", err)
		return
	}
	r.t.Logf("run directory kept in %s", dst)
}

// drain pops every dead letter of the queue.
func (r *run) drain() []ap.DeadLetter {
	r.t.Helper()
	var out []ap.DeadLetter
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 100000 {
		err := r.ad().NextDeadLetter(ctx, r.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
			out = append(out, dl)
			return true, nil
		})
		if errors.Is(err, driver.ErrNoDeadLetters) {
			break
		}
		if err != nil {
			r.t.Errorf("draining dead letters: %v", err)
			break
		}
	}
	return out
}

// empty reports whether the queue and its dead-letter queue are empty, once
// every worker is gone. Where Stats cannot tell how many are ready (-1), it
// tries to receive for a while; what is in flight or scheduled is not looked
// for when Stats cannot tell (quiesce has let it come back).
func (r *run) empty() (bool, string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := r.ad().Stats(ctx, r.queue)
	if err != nil {
		return false, "stats: " + err.Error()
	}
	var left []string
	unknown := st.Ready < 0
	for _, f := range []struct {
		name string
		n    int64
	}{{"ready", st.Ready}, {"scheduled", st.Scheduled}, {"in flight", st.InFlight}, {"dead", st.Dead}} {
		if f.n > 0 {
			left = append(left, fmt.Sprintf("%d %s", f.n, f.name))
		}
	}
	if unknown && len(left) == 0 {
		if n := r.probe(); n > 0 {
			left = append(left, fmt.Sprintf("%d received by a probe", n))
		}
	}
	return len(left) == 0, strings.Join(left, ", ")
}

// probe receives from the queue for two leases (plus a second) and counts
// what it got; every message is requeued as it was.
func (r *run) probe() int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := r.tg.Open(ctx, r.addr)
	if err != nil {
		r.t.Errorf("probe: %v", err)
		return 0
	}
	defer b.Close()
	n := 0
	pctx, pcancel := context.WithTimeout(ctx, 2*r.tg.Lease+time.Second)
	defer pcancel()
	for pctx.Err() == nil {
		ds, _ := b.Receive(pctx, r.queue, 10, r.tg.Lease)
		n += len(ds)
	}
	return n
}

// record appends the figures to the report file, when one is named.
func (r *run) record(rep *Report, took time.Duration) {
	path := os.Getenv(ReportEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		r.t.Logf("report file: %v", err)
		return
	}
	defer f.Close()
	empty := "yes"
	if !rep.Empty {
		empty = "no: " + rep.Leftover
	}
	// One write per row: other backends' test processes append to the
	// same file at the same time (see ReportEnv).
	row := fmt.Sprintf("| %s | %s | %d | %d | %d | %d | %d | %d | %s | %d | %d | %d | %s |\n", r.tg.Name, r.name,
		rep.Lost, rep.Duplicated, rep.Redelivered, rep.StoredTwice, rep.Unexpected, rep.WrongTries, empty,
		rep.Enqueued, rep.Completed, rep.DeadLettered, took.Round(100*time.Millisecond))
	if _, err := f.WriteString(row); err != nil {
		r.t.Logf("report file: %v", err)
	}
}
