package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// testScheduleOnePerTick: one schedule every second, run by 3 platforms for
// a few seconds: exactly one job per tick, and no tick missed from the
// first due to the last (the last one due may come too late to fire).
func testScheduleOnePerTick(t *testing.T, e *env) {
	var mu sync.Mutex
	ticks := map[string]int{}
	h := func(_ context.Context, j *ap.Job) error {
		mu.Lock()
		ticks[j.Headers[ap.ScheduleTickHeader]]++
		mu.Unlock()
		return nil
	}
	s := ap.Schedule{Name: e.queue, Every: time.Second, Job: ap.Job{Type: "tick", Queue: e.queue}}
	admin := e.producer()
	t.Cleanup(func() { // the schedule's records, which have no TTL
		ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
		defer cancel()
		if err := admin.DeleteSchedule(ctx, e.queue); err != nil {
			t.Errorf("DeleteSchedule: %v", err)
		}
	})
	var workers []*worker
	begin := time.Now() // the first scheduler runs from within its worker's start, after this
	for range 3 {
		cfg := e.config()
		cfg.Schedules = []ap.Schedule{s}
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
		workers = append(workers, e.worker(cfg).handle(t, "tick", h).start(t))
	}
	started := time.Now() // every scheduler runs from here (the first from earlier: starting three takes a while under load)
	time.Sleep(3500 * time.Millisecond)
	stopping := time.Now()
	for _, w := range workers { // the schedulers stop; the queued ticks are handed back
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = w.P.Stop(ctx)
		cancel()
	}
	stopped := time.Now()                                                // no scheduler runs from here
	e.worker(e.config()).handle(t, "tick", h).start(t)                   // works what is left
	secs := func(a, b time.Time) int { return int(b.Unix() - a.Unix()) } // whole-second ticks in (a, b]
	// Every tick due while the schedulers ran fires, but the last: on a
	// loaded machine a scheduler can be late for it and then stopped. The
	// ticks fired are waited for (they run on the last worker), not timed.
	lo, hi := secs(started, stopping)-1, secs(begin, stopped)+1
	e.waitFor(fmt.Sprintf("at least %d ticks to run", lo), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ticks) >= lo
	})
	e.settle()
	mu.Lock()
	defer mu.Unlock()
	var got []time.Time
	for s, n := range ticks {
		tt, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("tick header %q: %v", s, err)
		}
		if n != 1 {
			t.Errorf("tick %s: %d jobs; want 1", s, n)
		}
		got = append(got, tt)
	}
	sort.Slice(got, func(i, k int) bool { return got[i].Before(got[k]) })
	if len(got) < lo || len(got) > hi {
		t.Fatalf("%d ticks of a 1s schedule run for %v (stopped after %v; the workers took %v to start): %v; want %d to %d",
			len(got), stopping.Sub(started), stopped.Sub(started), started.Sub(begin), got, lo, hi)
	}
	// Only the last tick due may be missing: the first fires (the tick
	// just before started may fire too, the workers starting earlier).
	if first := time.Unix(started.Unix()+1, 0); len(got) > 0 && got[0].After(first) {
		t.Fatalf("ticks %v: the first tick due, %v, missed", got, first.UTC().Format(time.TimeOnly))
	}
	for i := 1; i < len(got); i++ {
		if got[i].Sub(got[i-1]) != time.Second {
			t.Fatalf("ticks %v: one missed", got)
		}
	}
}

// tickLog records the ticks of the scheduled jobs a case's worker handles,
// by the tick's Unix second, with the process that fired each. A job is
// counted once however often it is delivered (delivery is at least once:
// a redelivery is no second firing).
type tickLog struct {
	mu    sync.Mutex
	ticks map[int64][]string
	seen  map[string]bool // the jobs counted, by ID
	odd   []string        // headers that are not a whole-second tick
}

func newTickLog() *tickLog { return &tickLog{ticks: map[int64][]string{}, seen: map[string]bool{}} }

func (l *tickLog) handle(_ context.Context, j *ap.Job) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	tt, err := time.Parse(time.RFC3339Nano, j.Headers[ap.ScheduleTickHeader])
	if err != nil || tt.Nanosecond() != 0 {
		l.odd = append(l.odd, j.Headers[ap.ScheduleTickHeader])
		return nil
	}
	if l.seen[j.ID] {
		return nil
	}
	l.seen[j.ID] = true
	l.ticks[tt.Unix()] = append(l.ticks[tt.Unix()], j.Headers[procHeader])
	return nil
}

func (l *tickLog) has(sec int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ticks[sec]) > 0
}

func (l *tickLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ticks)
}

// check fails the case for a tick enqueued more than once, or a job whose
// tick is not a whole second, and returns the ticks seen, sorted.
func (l *tickLog) check(t *testing.T) []int64 {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.odd) > 0 {
		t.Errorf("jobs with ticks that are not whole seconds: %q", l.odd)
	}
	var secs []int64
	for s, by := range l.ticks {
		if len(by) != 1 {
			t.Errorf("tick %s: %d jobs (fired by processes %v); want 1", time.Unix(s, 0).UTC().Format(time.TimeOnly), len(by), by)
		}
		secs = append(secs, s)
	}
	slices.Sort(secs)
	return secs
}

func (l *tickLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, s := range slices.Sorted(maps.Keys(l.ticks)) {
		fmt.Fprintf(&b, " %s%v", time.Unix(s, 0).UTC().Format(time.TimeOnly), l.ticks[s])
	}
	return b.String()
}

// procHeader names, in a scheduled job, the process that fired its tick.
const procHeader = "conformance-process"

// startedLog waits for a child's scheduler to say it started, and returns
// the record: from is the instant whose later ticks the scheduler fires
// as they come; the missed ticks are those after the last tick fired and
// at or before from.
type startedLog struct {
	From     time.Time `json:"from"`
	LastTick time.Time `json:"last_tick"`
	Missed   int       `json:"missed"`
	CaughtUp int       `json:"caught_up"`
}

func (c *child) schedulerStarted(t *testing.T, d time.Duration) startedLog {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		line := c.expect(t, "LOG", time.Until(deadline))
		var rec struct {
			Msg string `json:"msg"`
			startedLog
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("child process %d: a log line that is not JSON: %s", c.n, line)
		}
		if rec.Msg == "asyncplatform: schedule started" {
			return rec.startedLog
		}
	}
}

// schedulers starts a scheduler process for each of idx: the case's
// schedule, every second, with catchUp; it returns them once each said its
// scheduler started, with the instant it started from.
func (e *env) schedulers(t *testing.T, catchUp int, idx ...int) ([]*child, []startedLog) {
	t.Helper()
	var kids []*child
	for _, i := range idx {
		kids = append(kids, e.spawn(t, i, fmt.Sprintf("%d %d", catchUp, i)))
	}
	var logs []startedLog
	for _, k := range kids {
		logs = append(logs, k.schedulerStarted(t, e.opts.Wait))
	}
	return kids, logs
}

// tickWorker starts a worker that records the case's ticks, removes the
// schedule's records at the end of the case, and the queue its scheduler
// processes work (an idle one).
func (e *env) tickWorker(t *testing.T) *tickLog {
	l := newTickLog()
	w := e.worker(e.config()).handle(t, "tick", l.handle).start(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
		defer cancel()
		if err := w.P.DeleteSchedule(ctx, e.queue); err != nil {
			t.Errorf("DeleteSchedule: %v", err)
		}
		if d, ok := w.B.(driver.QueueDeleter); ok {
			if err := d.DeleteQueue(ctx, idleQueue(e.queue)); err != nil {
				t.Errorf("deleting queue %s: %v", idleQueue(e.queue), err)
			}
		}
	})
	return l
}

// idleQueue is the queue the scheduler processes work: nothing goes there.
func idleQueue(q string) string { return q + "-idle" }

// stopChildren tells the children to stop their platforms and waits until
// each said it did.
func (e *env) stopChildren(t *testing.T, kids []*child) {
	t.Helper()
	for _, k := range kids {
		k.finish()
	}
	for _, k := range kids {
		k.expect(t, "STOPPED", e.opts.Wait)
	}
}

// clock prints Unix seconds as times of day (UTC).
func clock(secs []int64) []string {
	out := []string{}
	for _, s := range secs {
		out = append(out, time.Unix(s, 0).UTC().Format(time.TimeOnly))
	}
	return out
}

// sleepUntil sleeps until the instant at.
func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// nextHalf is the first instant at half a second past a whole second after
// t: ticks fire at whole seconds, so nothing fires near it.
func nextHalf(t time.Time) time.Time {
	h := t.Truncate(time.Second).Add(500 * time.Millisecond)
	if !h.After(t) {
		h = h.Add(time.Second)
	}
	return h
}

// testScheduleProcesses: one schedule every second, run by 3 real processes
// (the test binary again) through 10 ticks. The ticks that count are the
// ten whole seconds after the last of the three schedulers started (the
// instant it logs: it fires every tick after it): each has exactly one
// job. The three run on for a second after the tenth, and no tick before or
// after the ten, fired while fewer ran, has more than one.
func testScheduleProcesses(t *testing.T, e *env) {
	if e.opts.SingleProcess != "" {
		t.Skipf("the backend declares it cannot share queues across processes: %s (Schedule/OnePerTick runs in one)", e.opts.SingleProcess)
	}
	l := e.tickWorker(t)
	kids, logs := e.schedulers(t, 0, 0, 1, 2)
	var from time.Time
	for _, lg := range logs {
		if lg.From.After(from) {
			from = lg.From
		}
	}
	first := from.Truncate(time.Second).Add(time.Second) // the first tick after every scheduler's start
	last := first.Add(9 * time.Second)
	sleepUntil(last.Add(time.Second))
	e.stopChildren(t, kids)
	for deadline := time.Now().Add(e.opts.Wait); ; time.Sleep(10 * time.Millisecond) {
		var missing []int64
		for s := first.Unix(); s <= last.Unix(); s++ {
			if !l.has(s) {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			var said strings.Builder
			for _, k := range kids {
				fmt.Fprintf(&said, "\nprocess %d said:\n%s", k.n, k)
			}
			t.Fatalf("no job after %v for the ticks %v of the ten from %s to %s%s\nticks seen:%s%s", e.opts.Wait, clock(missing),
				first.UTC().Format(time.TimeOnly), last.UTC().Format(time.TimeOnly), e.stallNote(), l, said.String())
		}
	}
	e.settle()
	secs := l.check(t)
	var in int
	for _, s := range secs {
		if s >= first.Unix() && s <= last.Unix() {
			in++
		}
	}
	if in != 10 {
		t.Fatalf("%d jobs for the 10 ticks %s to %s; ticks seen:%s", in, first.UTC().Format(time.TimeOnly), last.UTC().Format(time.TimeOnly), l)
	}
	t.Logf("ticks (fired by process):%s", l)
}

// testScheduleRestart: a scheduler process (CatchUp catchUp) killed with
// SIGKILL at half past a second, after it fired two ticks or more, and a
// new one started three seconds later: the new one counts as missed exactly
// the ticks after the last one fired (read from the store) and at or
// before the instant it started from (its log), enqueues the latest
// catchUp of them and none of the others, and then every tick after.
func testScheduleRestart(t *testing.T, e *env, catchUp int) {
	if e.opts.SingleProcess != "" {
		t.Skipf("the backend declares it cannot share queues across processes: %s", e.opts.SingleProcess)
	}
	l := e.tickWorker(t)
	admin := e.producer()
	a, logs := e.schedulers(t, catchUp, 0)
	firstA := logs[0].From.Truncate(time.Second).Add(time.Second)
	e.waitFor("two ticks of the first scheduler", func() bool { return l.count() >= 2 })
	sleepUntil(nextHalf(time.Now()))
	a[0].kill(t)
	killed := time.Now()
	// ~3 ticks with no scheduler; the last tick fired is read after them,
	// so that a write the dead process had in flight has landed.
	sleepUntil(nextHalf(killed.Add(2500 * time.Millisecond)))
	ctx := ctxT(t, e.opts.Wait)
	infos, err := admin.Schedules(ctx, e.queue)
	if err != nil || len(infos) != 1 || infos[0].Last.IsZero() {
		t.Fatalf("Schedules(%q) = %+v, %v; want its last tick", e.queue, infos, err)
	}
	lastA := infos[0].Last
	if lastA.Nanosecond() != 0 || lastA.After(killed) || lastA.Before(firstA) {
		t.Fatalf("the last tick fired is %v; want a whole second from %v to the kill at %v", lastA, firstA, killed)
	}
	b, logs := e.schedulers(t, catchUp, 1)
	from := logs[0].From
	wantMissed := int(from.Unix() - lastA.Unix()) // the whole seconds in (lastA, from]
	if logs[0].Missed != wantMissed || !logs[0].LastTick.Equal(lastA) {
		t.Errorf("the restarted scheduler says %d ticks missed after %v; want %d: those after %v and at or before its start %v",
			logs[0].Missed, logs[0].LastTick, wantMissed, lastA, from)
	}
	regular := from.Truncate(time.Second).Add(time.Second)
	e.waitFor("two ticks after the restart", func() bool { return l.has(regular.Unix()) && l.has(regular.Unix()+1) })
	e.stopChildren(t, b)
	e.settle()

	secs := l.check(t)
	var before, missed []int64
	for _, s := range secs {
		switch {
		case s <= lastA.Unix():
			before = append(before, s)
		case s <= from.Unix():
			missed = append(missed, s)
		}
	}
	var want []int64
	for s := max(lastA.Unix()+1, from.Unix()-int64(catchUp)+1); s <= from.Unix() && catchUp > 0; s++ {
		want = append(want, s)
	}
	if !slices.Equal(missed, want) {
		t.Fatalf("CatchUp %d: the ticks missed after %v and up to %v that were enqueued: %v; want %v (the latest %d)\nticks seen:%s",
			catchUp, lastA.UTC().Format(time.TimeOnly), from.UTC().Format(time.TimeOnly+".000"), clock(missed), clock(want), catchUp, l)
	}
	for s := firstA.Unix(); s < lastA.Unix(); s++ {
		if !slices.Contains(before, s) {
			t.Errorf("tick %v, before the kill, has no job; ticks seen:%s", time.Unix(s, 0).UTC().Format(time.TimeOnly), l)
		}
	}
	if !slices.Contains(before, lastA.Unix()) {
		// The kill fell between the record's write and the enqueue: the
		// tick is lost, as the contract says. Rare: the kill is at half
		// past the second.
		t.Logf("the last tick before the kill, %v, was recorded but not enqueued (killed in between)", lastA)
	}
	t.Logf("killed after %v, restarted from %v; ticks seen:%s", lastA.UTC().Format(time.TimeOnly), from.UTC().Format(time.TimeOnly+".000"), l)
}

func testScheduleRestartSkips(t *testing.T, e *env)   { testScheduleRestart(t, e, 0) }
func testScheduleRestartCatchUp(t *testing.T, e *env) { testScheduleRestart(t, e, 2) }

// scheduleChild is a scheduler process: arg is "catchUp index". It runs
// the case's schedule (every second, its jobs to the case's queue) with its
// log for the parent, until its stdin closes; then it stops its platform
// and says so.
func scheduleChild(t *testing.T, k *kid, arg string) {
	var catchUp int
	var idx string
	if _, err := fmt.Sscanf(arg, "%d %s", &catchUp, &idx); err != nil {
		t.Fatalf("argument %q: %v", arg, err)
	}
	cfg := ap.Config{
		Queues: map[string]ap.QueueConfig{idleQueue(k.queue): {Concurrency: 1}},
		Logger: slog.New(scheduleLog{slog.NewJSONHandler(logWriter{}, &slog.HandlerOptions{Level: slog.LevelDebug})}),
		Schedules: []ap.Schedule{{Name: k.queue, Every: time.Second, CatchUp: catchUp,
			Job: ap.Job{Type: "tick", Queue: k.queue, Headers: map[string]string{procHeader: idx}}}},
	}
	p := k.platform(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), k.opts.Wait)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	k.waitStdin()
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	_ = p.Stop(sctx)
	say("STOPPED")
}

// scheduleLog passes on the scheduler's records and warnings, not the
// platform's debug chatter.
type scheduleLog struct{ slog.Handler }

func (h scheduleLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn || strings.HasPrefix(r.Message, "asyncplatform: schedule") {
		return h.Handler.Handle(ctx, r)
	}
	return nil
}

func (h scheduleLog) WithAttrs(as []slog.Attr) slog.Handler {
	return scheduleLog{h.Handler.WithAttrs(as)}
}

func (h scheduleLog) WithGroup(name string) slog.Handler {
	return scheduleLog{h.Handler.WithGroup(name)}
}
