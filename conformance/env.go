package conformance

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// env is one case's world: a harness, a queue of its own, the backends and
// platforms it opened, and a record of what happened.
type env struct {
	t     *testing.T
	h     Harness
	opts  Options
	queue string
	caps  driver.Capabilities
	lease time.Duration
	scale float64   // ASYNCPLATFORM_CONFORMANCE_SCALE
	start time.Time // when the case began
	rec   *recorder

	mu       sync.Mutex
	backends []driver.Backend
	extra    []string // queues of the case's own beside queue, deleted with it
}

// alsoDelete names queues the case made beside its own (a pool's, a
// priority level's, a group's held queue), deleted at the end with it.
func (e *env) alsoDelete(queues ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.extra = append(e.extra, queues...)
}

func newEnv(t *testing.T, makeHarness HarnessMaker, opts Options, scale float64, queue string) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opts.Wait)
	defer cancel()
	h, err := makeHarness(ctx, t)
	if err != nil {
		t.Fatalf("making the harness: %v", err)
	}
	e := &env{t: t, h: h, opts: opts, queue: queue, scale: scale, start: time.Now(), rec: &recorder{}}
	t.Cleanup(e.close) // registered first, so it runs after the platforms stop
	b := e.backend()
	e.caps = b.Capabilities()
	e.lease = max(opts.Lease, e.caps.MinLease)
	return e
}

func (e *env) close() {
	e.mu.Lock()
	bs := e.backends
	e.backends = nil
	queues := append([]string{e.queue}, e.extra...)
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, q := range queues {
		for _, b := range bs { // the case may have closed some: use a live one
			d, ok := b.(driver.QueueDeleter)
			if !ok {
				break
			}
			err := d.DeleteQueue(ctx, q)
			if err == nil {
				break
			}
			if !errors.Is(err, driver.ErrClosed) {
				e.t.Errorf("deleting queue %s: %v", q, err)
				break
			}
		}
	}
	for _, b := range bs {
		_ = b.Close()
	}
	e.h.Close()
}

// abort closes every backend the case opened, so that whatever a stalled
// case waits on ends (with driver.ErrClosed). The env's own cleanup still
// runs.
func (e *env) abort() {
	e.mu.Lock()
	bs := append([]driver.Backend(nil), e.backends...)
	e.mu.Unlock()
	for _, b := range bs {
		_ = b.Close()
	}
}

// backend opens a new backend (a new "process") that the env closes at the end.
func (e *env) backend() driver.Backend {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
	defer cancel()
	b, err := e.h.MakeBackend(ctx)
	if err != nil {
		e.t.Fatalf("making a backend: %v", err)
	}
	e.mu.Lock()
	e.backends = append(e.backends, b)
	e.mu.Unlock()
	return b
}

// config returns the suite's platform settings: short delays so every case
// runs in seconds, one queue, and the recorder's hooks.
func (e *env) config() ap.Config {
	return ap.Config{
		Queues: map[string]ap.QueueConfig{e.queue: {Concurrency: 4}},
		Policy: ap.Policy{
			BackoffBase: 20 * time.Millisecond,
			BackoffCap:  100 * time.Millisecond,
		},
		Lease:            e.lease,
		RejectDelay:      50 * time.Millisecond,
		UnhandledDelay:   50 * time.Millisecond,
		UnhandledRetries: ap.Limit(2),
		HealthInterval:   50 * time.Millisecond,
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		// Every process of the suite runs this version: unique keys are
		// taken with the enqueue where the backend can.
		UniqueClaimsInEnqueue: true,
	}
}

// worker is a platform over a backend of its own.
type worker struct {
	P *ap.Platform
	B driver.Backend
	n int
}

// worker makes a platform with cfg (from e.config, adjusted by the case) and
// the recorder wired in. It is not started.
func (e *env) worker(cfg ap.Config) *worker {
	e.t.Helper()
	b := e.backend()
	w := &worker{B: b}
	e.mu.Lock()
	w.n = len(e.backends)
	e.mu.Unlock()
	cfg.Middleware = append([]ap.Middleware{e.rec.middleware(w.n)}, cfg.Middleware...)
	after, onDead := cfg.Hooks.AfterAttempt, cfg.Hooks.OnDeadLetter
	cfg.Hooks.AfterAttempt = func(ctx context.Context, a ap.Attempt) {
		e.rec.attempted(a)
		if after != nil {
			after(ctx, a)
		}
	}
	cfg.Hooks.OnDeadLetter = func(ctx context.Context, dl ap.DeadLetter) {
		e.rec.died(dl)
		if onDead != nil {
			onDead(ctx, dl)
		}
	}
	p, err := ap.New(b, cfg)
	if err != nil {
		e.t.Fatalf("ap.New: %v", err)
	}
	w.P = p
	return w
}

func (w *worker) handle(t *testing.T, jobType string, h ap.Handler, policy ...ap.Policy) *worker {
	t.Helper()
	if err := w.P.Handle(jobType, h, policy...); err != nil {
		t.Fatalf("Handle(%q): %v", jobType, err)
	}
	return w
}

// start starts the platform and stops it at the end of the case.
func (w *worker) start(t *testing.T) *worker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.P.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { w.stop(t, 10*time.Second) })
	return w
}

// stop stops the platform, giving its handlers up to grace. A Stop that
// does not return soon after its ctx ends (the platform is stuck, as a
// backend that breaks a rule can make it: a Receive that hands out more
// than it was asked for, for one) fails the case instead of hanging it.
func (w *worker) stop(t *testing.T, grace time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.P.Stop(ctx)
	}()
	select {
	case <-done:
	case <-time.After(grace + 5*time.Second):
		t.Errorf("Platform.Stop had not returned %v after its ctx ended: the platform is stuck (see the case's other failures)", 5*time.Second)
	}
}

// producer is a platform that only enqueues and administers.
func (e *env) producer() *ap.Platform {
	e.t.Helper()
	cfg := e.config()
	cfg.Queues = nil
	return e.worker(cfg).P
}

func (e *env) enqueue(p *ap.Platform, jobs ...*ap.Job) {
	e.t.Helper()
	for _, j := range jobs {
		if j.Queue == "" {
			j.Queue = e.queue
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
	defer cancel()
	if err := p.EnqueueBatch(ctx, jobs); err != nil {
		e.t.Fatalf("EnqueueBatch: %v", err)
	}
}

// waitFor polls cond until it holds or the case's wait runs out.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	e.waitLonger(0, what, cond)
}

// waitLonger is waitFor with extra time on top of the case's wait, for cases
// that take a known time by design.
func (e *env) waitLonger(extra time.Duration, what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(e.opts.Wait + extra)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %v waiting for %s%s\n%s", e.opts.Wait+extra, what, e.stallNote(), e.rec)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settle waits a little to let anything that should not happen show itself.
func (e *env) settle() { time.Sleep(max(3*e.lease/2, e.scaled(300*time.Millisecond))) }

// scaled stretches one of the suite's own delays by
// ASYNCPLATFORM_CONFORMANCE_SCALE.
func (e *env) scaled(d time.Duration) time.Duration { return scaled(d, e.scale) }

// bound stretches a bound on how soon something must happen by
// ASYNCPLATFORM_CONFORMANCE_SCALE and by the machine's load factor now
// (see loadFactor).
func (e *env) bound(d time.Duration) time.Duration { return scaled(d, e.scale*loadFactor()) }

// stallExcuse returns, when this process stalled long enough during the case
// for a held lease to lapse before its next renewal (a quarter of the lease
// or more, as the stall watch sees it), why a duplicate delivery is then no
// fault of the backend's; else "". A lease that lapses while its process is
// not running may be handed to another worker: at least once.
func (e *env) stallExcuse() string {
	if d := stalls.longest(e.start); d >= e.lease/4 {
		return fmt.Sprintf("this test process stalled for up to %v during the case (lease %v): a lease may have lapsed while it was not running",
			d.Round(time.Millisecond), e.lease)
	}
	return ""
}

// stallNote says, for a failure message, how long this process stalled
// during the case, when that was long enough to matter.
func (e *env) stallNote() string {
	if d := stalls.longest(e.start); d >= 100*time.Millisecond {
		return fmt.Sprintf(" (this test process stalled for up to %v during the case: the machine is loaded; %s=2 or more stretches the suite's timings)",
			d.Round(time.Millisecond), scaleEnv)
	}
	return ""
}

// dead lists every dead letter of the queue.
func (e *env) dead(p *ap.Platform) []ap.DeadLetter {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
	defer cancel()
	var all []ap.DeadLetter
	seen := map[string]bool{}
	for cursor := ""; ; {
		page, err := p.DeadLetters(ctx, e.queue, cursor, 100)
		if err != nil {
			e.t.Fatalf("DeadLetters: %v", err)
		}
		all = append(all, page.Letters...)
		if cursor = page.Next; cursor == "" {
			return all
		}
		e.cursorAdvances(seen, cursor)
	}
}

// cursorAdvances fails the case when a dead-letter listing hands out a
// cursor it handed out before: paging would never end.
func (e *env) cursorAdvances(seen map[string]bool, cursor string) {
	e.t.Helper()
	if seen[cursor] {
		e.t.Fatalf("ListDead returned the cursor %q a second time: paging never ends (ListDead pages on from its cursor)", cursor)
	}
	seen[cursor] = true
}

// waitDead waits until the queue holds n dead letters and returns them.
func (e *env) waitDead(p *ap.Platform, n int) []ap.DeadLetter {
	e.t.Helper()
	var dls []ap.DeadLetter
	e.waitFor(fmt.Sprintf("%d dead letters", n), func() bool {
		dls = e.dead(p)
		return len(dls) >= n
	})
	if len(dls) != n {
		e.t.Fatalf("want %d dead letters, got %d", n, len(dls))
	}
	return dls
}

// attempt is one handler call as the recorder saw it.
type attempt struct {
	ID, Type                    string
	TryCount, Failures, Crashes int
	Worker                      int
	At                          time.Time
	Job                         ap.Job
}

type recorder struct {
	mu       sync.Mutex
	attempts []attempt
	results  []ap.Attempt
	deaths   []ap.DeadLetter
}

func (r *recorder) middleware(worker int) ap.Middleware {
	return func(next ap.Handler) ap.Handler {
		return func(ctx context.Context, j *ap.Job) error {
			r.mu.Lock()
			r.attempts = append(r.attempts, attempt{ID: j.ID, Type: j.Type, TryCount: j.TryCount, Failures: j.Failures,
				Crashes: j.Crashes, Worker: worker, At: time.Now(), Job: *j})
			r.mu.Unlock()
			return next(ctx, j)
		}
	}
}

func (r *recorder) attempted(a ap.Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results = append(r.results, a)
}

func (r *recorder) died(dl ap.DeadLetter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deaths = append(r.deaths, dl)
}

// deathsOf returns the dead letters of one job.
func (r *recorder) deathsOf(id string) []ap.DeadLetter {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ap.DeadLetter
	for _, dl := range r.deaths {
		if dl.Job.ID == id {
			out = append(out, dl)
		}
	}
	return out
}

// allDeaths returns every dead letter recorded.
func (r *recorder) allDeaths() []ap.DeadLetter {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ap.DeadLetter(nil), r.deaths...)
}

// of returns the attempts of one job.
func (r *recorder) of(id string) []attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []attempt
	for _, a := range r.attempts {
		if a.ID == id {
			out = append(out, a)
		}
	}
	return out
}

func (r *recorder) count(id string) int { return len(r.of(id)) }

// outcomes returns the reported outcomes of one job's attempts in the
// order of the attempts: by copy, then by TryCount (a redelivery of one
// copy counts a crash), then as reported. Hooks.AfterAttempt runs after
// the settle, so the next copy's attempt can be reported before the one
// that wrote it.
func (r *recorder) outcomes(id string) []ap.Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ap.Attempt
	for _, a := range r.results {
		if a.Job.ID == id {
			out = append(out, a)
		}
	}
	slices.SortStableFunc(out, func(a, b ap.Attempt) int {
		return cmp.Or(cmp.Compare(a.Job.CopyNumber(), b.Job.CopyNumber()), cmp.Compare(a.Job.TryCount, b.Job.TryCount))
	})
	return out
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "recorded %d attempts, %d outcomes, %d dead letters", len(r.attempts), len(r.results), len(r.deaths))
	for i, a := range r.attempts {
		if i == 20 {
			b.WriteString("\n  ...")
			break
		}
		fmt.Fprintf(&b, "\n  attempt %s type=%s try=%d failures=%d crashes=%d worker=%d", a.ID, a.Type, a.TryCount, a.Failures, a.Crashes, a.Worker)
	}
	for i, a := range r.results {
		if i == 20 {
			b.WriteString("\n  ...")
			break
		}
		fmt.Fprintf(&b, "\n  outcome %s copy=%d try=%d %s", a.Job.ID, a.Job.CopyNumber(), a.Job.TryCount, a.Outcome)
	}
	return b.String()
}

// queueName makes a queue name from a case name: short, lower-case, unique.
func queueName(name string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(name) {
		if b.Len() >= 24 {
			break
		}
		if 'a' <= c && c <= 'z' || '0' <= c && c <= '9' {
			b.WriteRune(c)
		}
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	return "ct-" + b.String() + "-" + hex.EncodeToString(r[:])
}

// checkTries compares one job's attempts with the counters they should show.
func checkTries(t *testing.T, got []attempt, want ...[3]int) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("want %d attempts, got %d: %+v", len(want), len(got), got)
	}
	for i, w := range want {
		a := got[i]
		if a.TryCount != w[0] || a.Failures != w[1] || a.Crashes != w[2] {
			t.Errorf("attempt %d: TryCount/Failures/Crashes = %d/%d/%d, want %d/%d/%d", i+1, a.TryCount, a.Failures, a.Crashes, w[0], w[1], w[2])
		}
	}
}
