package conformance

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// testPoisonIsolation: one poison job among 40 innocent ones, at
// Concurrency 10 with the default prefetch, its worker dying (its backend
// closed under it) each time the poison job runs, a new worker started after
// each death. The crashes must be charged to the poison job alone: every
// innocent job succeeds, none is dead-lettered, none is seen with more than
// one crash (the one it was present at) plus one for each lease of its own
// that a live worker reported lost (OutcomeLeaseLost: a broker or machine
// stalled past the lease, a crash of the job's own by the contract), and the
// poison job is dead-lettered poisoned after its handler ran exactly
// PoisonLimit+1 times. A lease can also be lost before its handler starts
// (the delivery waited while the broker stalled): the platform then reports
// no attempt, only a warning without the job's ID, so such losses are a
// pool of excuses for the case as a whole: the lost leases a live worker
// logged, less those an attempt reported. An attempt or warning a worker
// reports after its death began (its settles refused because its backend
// is closed) is the crash it was present at, never an excuse.
func testPoisonIsolation(t *testing.T, e *env) {
	const innocents = 40
	var jobs []*ap.Job
	bad := &ap.Job{Type: "poison"}
	for i := range innocents {
		jobs = append(jobs, &ap.Job{Type: "good", Payload: fmt.Appendf(nil, "%d", i)})
		if i == 4 {
			jobs = append(jobs, bad) // it runs with others beside it and claimed behind it
		}
	}
	e.enqueue(e.producer(), jobs...)

	var succeeded sync.Map
	var poisonRuns atomic.Int32
	var lostMu sync.Mutex
	lost := map[string]int{} // job ID: leases a live worker reported lost in an attempt
	var logged atomic.Int32  // leases a live worker logged as lost
	deadline := time.Now().Add(e.opts.Wait * 4)
	for round := 0; ; round++ {
		if round > ap.DefaultPoisonLimit+5 || time.Now().After(deadline) {
			t.Fatalf("after %d workers: %d innocent jobs succeeded, the poison job ran %d times\n%s", round, count(&succeeded), poisonRuns.Load(), e.rec)
		}
		crashed := make(chan struct{})
		var once sync.Once
		var dying atomic.Bool // set before the backend is closed
		cfg := e.config()
		cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 10}}
		cfg.Logger = slog.New(&lostLeases{dying: &dying, n: &logged})
		cfg.Hooks.AfterAttempt = func(_ context.Context, a ap.Attempt) {
			if a.Outcome == ap.OutcomeLeaseLost && !dying.Load() {
				lostMu.Lock()
				lost[a.Job.ID]++
				lostMu.Unlock()
			}
		}
		var w *worker
		w = e.worker(cfg).
			handle(t, "good", func(ctx context.Context, j *ap.Job) error {
				time.Sleep(e.scaled(30 * time.Millisecond))
				succeeded.Store(j.ID, true)
				return nil
			}).
			handle(t, "poison", func(ctx context.Context, j *ap.Job) error {
				poisonRuns.Add(1)
				once.Do(func() {
					dying.Store(true)
					_ = w.B.Close() // the process dies with everything it holds
					close(crashed)
				})
				<-ctx.Done()
				return ctx.Err()
			})
		w.start(t)
		done := false
		for !done {
			select {
			case <-crashed:
				done = true
			case <-time.After(20 * time.Millisecond):
				if count(&succeeded) == innocents && len(e.rec.deathsOf(bad.ID)) == 1 {
					done = true
				}
				if time.Now().After(deadline) {
					t.Fatalf("worker %d neither crashed nor finished the jobs in %v: %d innocent jobs succeeded, the poison job ran %d times\n%s",
						round+1, e.opts.Wait*4, count(&succeeded), poisonRuns.Load(), e.rec)
				}
			}
		}
		go func() { // the dead worker's leftovers; its backend is closed
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = w.P.Stop(ctx)
		}()
		if count(&succeeded) == innocents && len(e.rec.deathsOf(bad.ID)) == 1 {
			break
		}
	}
	for _, dl := range e.rec.allDeaths() {
		if dl.Job.ID != bad.ID {
			t.Errorf("innocent job %s dead-lettered %s after %d crashes", dl.Job.ID, dl.Reason, dl.Job.Crashes)
		}
	}
	lostMu.Lock()
	defer lostMu.Unlock()
	attributed := 0
	for id, n := range lost {
		attributed += n
		t.Logf("job %s: %d leases reported lost by a live worker (the machine or the broker stalled), each counted as a crash of its own", id, n)
	}
	pool := max(int(logged.Load())-attributed, 0)
	var over []string
	excess := 0
	for _, j := range jobs {
		if j == bad {
			continue
		}
		worst := attempt{}
		for _, a := range e.rec.of(j.ID) {
			if a.Crashes > worst.Crashes {
				worst = a
			}
		}
		if n := worst.Crashes - 1 - lost[j.ID]; n > 0 {
			excess += n
			over = append(over, fmt.Sprintf("innocent job %s ran with %d crashes behind it (try %d), %d of its leases reported lost by a live worker", j.ID, worst.Crashes, worst.TryCount, lost[j.ID]))
		}
	}
	switch {
	case excess > pool:
		for _, o := range over {
			t.Errorf("%s; a crash it did not cause was charged to it (%d leases lost before their handler started, for %d such crashes)", o, pool, excess)
		}
	case excess > 0:
		t.Logf("%d crashes beyond the one each innocent job was present at, within the %d leases live workers logged lost before their handler started: %v", excess, pool, over)
	}
	dl := e.rec.deathsOf(bad.ID)[0]
	limit := ap.DefaultPoisonLimit
	if dl.Reason != ap.ReasonPoisoned || int(poisonRuns.Load()) != limit+1 || dl.Job.Crashes != limit+1 {
		t.Errorf("poison job: %s with %d crashes after %d runs; want poisoned after PoisonLimit+1 = %d", dl.Reason, dl.Job.Crashes, poisonRuns.Load(), limit+1)
	}
}

// lostLeases is the log handler of the case's workers: it counts the
// platform's warnings that a lease was lost while the worker lived.
type lostLeases struct {
	dying *atomic.Bool
	n     *atomic.Int32
	// unhealthy, when set, counts the warnings that the health gate closed
	// (the worker hands back what it claimed, as new copies).
	unhealthy *atomic.Int32
}

func (l *lostLeases) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }

func (l *lostLeases) Handle(_ context.Context, r slog.Record) error {
	if !l.dying.Load() && (strings.Contains(r.Message, "lease lost") || strings.Contains(r.Message, "could not extend a lease")) {
		l.n.Add(1)
	}
	if l.unhealthy != nil && strings.Contains(r.Message, "unhealthy; no new jobs") {
		l.unhealthy.Add(1)
	}
	return nil
}

func (l *lostLeases) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lostLeases) WithGroup(string) slog.Handler      { return l }

func count(m *sync.Map) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}
