package asyncplatform

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// flakyStore is a memory connection whose store List fails while down is set.
type flakyStore struct {
	*memory.Backend
	down atomic.Bool
}

func (f *flakyStore) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if f.down.Load() {
		return nil, errors.New("store unreachable")
	}
	return f.Backend.List(ctx, prefix, after, limit)
}

// TestGroupNotStrandedByFailingPolls: a worker whose pause polls fail (its
// view of the paused groups is stale) reads the pause again before it sets
// a job aside, so a resumed group's jobs run instead of waiting on the held
// queue with no pause in force. (Found by review.)
func TestGroupNotStrandedByFailingPolls(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	wb := &flakyStore{Backend: br.Connect()}
	w, err := New(wb, Config{Logger: quietLog, Queues: map[string]QueueConfig{"q": {}}})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	_ = w.Handle("t", func(ctx context.Context, j *Job) error { ran.Add(1); return nil })
	admin, _ := New(br.Connect(), Config{Logger: quietLog})
	if err := admin.PauseGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	wb.down.Store(true) // the worker's store reads fail for a while
	n, err := admin.ResumeGroup(ctx, "q", "g")
	t.Logf("ResumeGroup = %d, %v", n, err)
	for range 5 {
		_ = admin.Enqueue(ctx, &Job{Type: "t", Queue: "q", Group: "g"})
	}
	time.Sleep(time.Second)
	wb.down.Store(false) // the store is back
	time.Sleep(3 * PausePoll)
	g, _ := admin.PausedGroups(ctx, "q")
	st, _ := admin.Stats(ctx, HeldQueue("q", "g"))
	t.Logf("after recovery: paused groups %q, ran %d, held queue %+v", g, ran.Load(), st)
	if ran.Load() != 5 {
		t.Errorf("%d of 5 jobs of a resumed group ran; %d wait on %s with no pause in force", ran.Load(), st.Ready, HeldQueue("q", "g"))
	}
}

type failingHeld struct {
	*memory.Backend
	queue string
	fail  atomic.Bool
	tries atomic.Int32
}

func (b *failingHeld) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if queue == b.queue {
		b.tries.Add(1)
		if b.fail.Load() {
			return errors.New("the broker refused the write")
		}
	}
	return b.Backend.Enqueue(ctx, queue, msgs)
}

// A job of a paused group whose held copy cannot be written must be
// requeued (deferred, uncounted), not left unsettled to come back as a crash.
func TestParkFailureIsNoCrash(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	b := &failingHeld{Backend: br.Connect(), queue: HeldQueue("q", "g")}
	b.fail.Store(true)
	p, err := New(b, Config{Logger: quietLog, Lease: 2 * time.Second, Queues: map[string]QueueConfig{"q": {Concurrency: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var crashes atomic.Int32
	var ran atomic.Int32
	_ = p.Handle("t", func(ctx context.Context, j *Job) error { crashes.Store(int32(j.Crashes)); ran.Add(1); return nil })
	if err := p.PauseGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	time.Sleep(2 * PausePoll)
	if err := p.Enqueue(ctx, &Job{Type: "t", Queue: "q", Group: "g"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a park attempt", func() bool { return b.tries.Load() > 0 })
	b.fail.Store(false)
	if _, err := p.ResumeGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the job ran", func() bool { return ran.Load() > 0 })
	if c := crashes.Load(); c != 0 {
		t.Fatalf("the job ran with Crashes = %d after a failed park; want 0 (a failed park is requeued, deferred, uncounted)", c)
	}
}

// Failed parks are no crashes: they never poison a job that never ran.
func TestParkFailuresDoNotPoison(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	b := &failingHeld{Backend: br.Connect(), queue: HeldQueue("q", "g")}
	b.fail.Store(true)
	var dead atomic.Pointer[DeadLetter]
	cfg := Config{Logger: quietLog, Lease: 300 * time.Millisecond, Queues: map[string]QueueConfig{"q": {Concurrency: 1}}}
	cfg.Hooks.OnDeadLetter = func(_ context.Context, d DeadLetter) { dead.Store(&d) }
	p, err := New(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	_ = p.Handle("t", func(ctx context.Context, j *Job) error { ran.Add(1); return nil })
	_ = p.PauseGroup(ctx, "q", "g")
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	time.Sleep(2 * PausePoll)
	_ = p.Enqueue(ctx, &Job{Type: "t", Queue: "q", Group: "g"})
	waitUntil(t, "several failed parks", func() bool { return b.tries.Load() > int32(DefaultPoisonLimit)+1 })
	b.fail.Store(false)
	_, _ = p.ResumeGroup(ctx, "q", "g")
	waitUntil(t, "the job ended", func() bool { return ran.Load() > 0 || dead.Load() != nil })
	if d := dead.Load(); d != nil {
		t.Fatalf("a job that never ran was dead-lettered: reason %s, crashes %d (%d park attempts)", d.Reason, d.Job.Crashes, b.tries.Load())
	}
}

// A platform without the SigningKey (asyncctl, the dashboard) resumes a
// group whose held jobs are signed: they go back as they were written, so
// the signed workers run them (issue 34: they were written again unsigned
// and dead-lettered "bad signature").
func TestKeylessResumeGroupKeepsSignatures(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	key := []byte("0123456789abcdef0123456789abcdef")
	w, err := New(br.Connect(), Config{Logger: quietLog, SigningKey: key, Queues: map[string]QueueConfig{"q": {Concurrency: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	_ = w.Handle("t", func(context.Context, *Job) error { ran.Add(1); return nil })
	if err := w.PauseGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	time.Sleep(2 * PausePoll)
	for range 3 {
		if err := w.Enqueue(ctx, &Job{Type: "t", Queue: "q", Group: "g"}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the jobs held", func() bool { st, _ := w.Stats(ctx, HeldQueue("q", "g")); return st.Ready == 3 })
	keyless, _ := New(br.Connect(), Config{Logger: quietLog})
	if n, err := keyless.ResumeGroup(ctx, "q", "g"); n != 3 || err != nil {
		t.Fatalf("keyless ResumeGroup = %d, %v; want 3 moved", n, err)
	}
	waitUntil(t, "the resumed jobs to run", func() bool { return ran.Load() == 3 })
	if st, _ := w.Stats(ctx, "q"); st.Dead != 0 {
		t.Errorf("%d resumed jobs dead-lettered; want none", st.Dead)
	}
}

// A group header off the broker is checked as it is decoded: a name that
// is no group name is no group, and the log says so (issue 34: handlers saw
// "../../etc/passwd", a 100,000-byte group, bidi characters).
func TestGroupHeaderCheckedOnDecode(t *testing.T) {
	ctx := context.Background()
	b := memory.NewBroker().Connect()
	var log logBuffer
	p, err := New(b, Config{Logger: slog.New(slog.NewTextHandler(&log, nil)), Queues: map[string]QueueConfig{"q": {Concurrency: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	groups := map[string]string{}
	_ = p.Handle("t", func(_ context.Context, j *Job) error { mu.Lock(); groups[j.ID] = j.Group; mu.Unlock(); return nil })
	want := map[string]string{"dots": "", "long": "", "bidi": "", "ok": "acme"}
	header := map[string]string{"dots": "../../etc/passwd", "long": strings.Repeat("g", 100_000), "bidi": "acme\u202egnp", "ok": "acme"}
	for id, g := range header {
		body := p.codec.Encode("q", &wire.Job{ID: id, Type: "t", Headers: map[string]string{GroupHeader: g}})
		if err := b.Enqueue(ctx, "q", []driver.Message{{ID: id, Body: body}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	waitUntil(t, "every job to run", func() bool { mu.Lock(); defer mu.Unlock(); return len(groups) == len(want) })
	mu.Lock()
	defer mu.Unlock()
	for id, g := range want {
		if groups[id] != g {
			t.Errorf("job %s with group header %.20q ran with Group %.20q; want %q", id, header[id], groups[id], g)
		}
	}
	if n := strings.Count(log.String(), "group header is not a group name"); n != 3 {
		t.Errorf("%d warnings of a bad group header; want 3:\n%.2000s", n, log.String())
	}
	// Enqueue refuses what decoding would drop.
	if err := p.Enqueue(ctx, &Job{Type: "t", Queue: "q", Headers: map[string]string{GroupHeader: "../x"}}); !errors.Is(err, ErrInvalidJob) {
		t.Errorf("Enqueue with a bad group header: %v, want ErrInvalidJob", err)
	}
}

// Names the platform derives from a queue's are no user's queue: a real
// queue named like a held queue or a level would be taken for one (issue
// 34: ResumeGroup(bill, eu) moved the jobs of a real queue "bill.held.eu").
func TestDerivedQueueNamesReserved(t *testing.T) {
	ctx := context.Background()
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range []*Job{
		{Type: "t", Queue: "bill.held.eu"}, {Type: "t", Queue: "a.held.b.c"}, {Type: "t", Queue: "bill.prio2"},
		{Type: "t", Queue: "bill.prio2", Priority: 1}, {Type: "t", Queue: "bill.prio9"}, {Type: "t", Queue: "bill.prio02", Priority: 2},
	} {
		if err := p.Enqueue(ctx, j); !errors.Is(err, ErrInvalidJob) || !errors.Is(err, driver.ErrBadQueue) {
			t.Errorf("Enqueue to %q at priority %d: %v; want ErrInvalidJob and driver.ErrBadQueue", j.Queue, j.Priority, err)
		}
	}
	for _, j := range []*Job{
		{Type: "t", Queue: "bill.prio2", Priority: 2}, // enqueued again as it was delivered
		{Type: "t", Queue: "held.prio"}, {Type: "t", Queue: "x.priority1"}, {Type: "t", Queue: "x.held"}, {Type: "t", Queue: "prio2"},
	} {
		if err := p.Enqueue(ctx, j); err != nil {
			t.Errorf("Enqueue to %q at priority %d: %v", j.Queue, j.Priority, err)
		}
	}
	for _, q := range []string{"bill.held.eu", "bill.prio1"} {
		if err := p.PauseGroup(ctx, q, "eu"); !errors.Is(err, driver.ErrBadQueue) {
			t.Errorf("PauseGroup(%q): %v; want driver.ErrBadQueue", q, err)
		}
		if _, err := p.ResumeGroup(ctx, q, "eu"); !errors.Is(err, driver.ErrBadQueue) {
			t.Errorf("ResumeGroup(%q): %v; want driver.ErrBadQueue", q, err)
		}
		if _, err := New(memory.NewBroker().Connect(), Config{Queues: map[string]QueueConfig{q: {}}}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Config.Queues[%q]: %v; want ErrInvalidConfig", q, err)
		}
		if _, err := New(memory.NewBroker().Connect(), Config{Queues: map[string]QueueConfig{"in": {Output: q}}}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Config.Queues[in].Output %q: %v; want ErrInvalidConfig", q, err)
		}
	}
}

// A paused group holds its jobs at every priority level of its queue, and
// ResumeGroup brings each back to its level (issue 34: a priority-2 job of
// a paused group ran on bill.prio2).
func TestPauseGroupHoldsEveryLevel(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	w, err := New(br.Connect(), Config{Logger: quietLog, Queues: map[string]QueueConfig{"bill": {Concurrency: 1, Priorities: true}}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ran := map[string]int{} // job ID → its Priority as run
	_ = w.Handle("t", func(_ context.Context, j *Job) error { mu.Lock(); ran[j.ID] = j.Priority; mu.Unlock(); return nil })
	admin, _ := New(br.Connect(), Config{Logger: quietLog})
	if err := admin.PauseGroup(ctx, "bill", "eu"); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	time.Sleep(2 * PausePoll)
	jobs := []*Job{{ID: "p0", Priority: 0}, {ID: "p2", Priority: 2}, {ID: "p3", Priority: 3}}
	for _, j := range jobs {
		j.Type, j.Queue, j.Group = "t", "bill", "eu"
		if err := admin.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	held := func() int64 {
		n := int64(0)
		for l := range MaxPriority + 1 {
			st, _ := admin.Stats(ctx, HeldQueue(PriorityQueue("bill", l), "eu"))
			n += st.Ready
		}
		return n
	}
	waitUntil(t, "every level's job held", func() bool { return held() == 3 })
	mu.Lock()
	if len(ran) != 0 {
		t.Errorf("jobs of the paused group ran: %v", ran)
	}
	mu.Unlock()
	if n, err := admin.ResumeGroup(ctx, "bill", "eu"); n != 3 || err != nil {
		t.Fatalf("ResumeGroup = %d, %v; want 3 moved", n, err)
	}
	waitUntil(t, "the resumed jobs to run", func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) == 3 })
	mu.Lock()
	defer mu.Unlock()
	for _, j := range jobs {
		if ran[j.ID] != j.Priority {
			t.Errorf("job %s ran at priority %d; want %d", j.ID, ran[j.ID], j.Priority)
		}
	}
}

// Queues reports a paused group on its queue, with the jobs it holds, and
// never its held queue as a queue of its own; after the resume the group
// and its held queue are gone from the listing.
func TestQueuesReportHeldGroups(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	w, err := New(br.Connect(), Config{Logger: quietLog, Queues: map[string]QueueConfig{"reports": {Concurrency: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Handle("t", func(context.Context, *Job) error { return nil })
	admin, _ := New(br.Connect(), Config{Logger: quietLog})
	if err := admin.PauseGroup(ctx, "reports", "acme"); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	time.Sleep(2 * PausePoll) // the workers read the pause
	for range 2 {
		if err := admin.Enqueue(ctx, &Job{Type: "t", Queue: "reports", Group: "acme"}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "both jobs held", func() bool {
		st, _ := admin.Stats(ctx, HeldQueue("reports", "acme"))
		return st.Ready == 2
	})
	list := func() map[string]QueueInfo {
		qs, err := admin.Queues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]QueueInfo{}
		for _, q := range qs {
			out[q.Name] = q
		}
		return out
	}
	qs := list()
	if _, ok := qs[HeldQueue("reports", "acme")]; ok {
		t.Errorf("the held queue is listed as a queue: %+v", qs)
	}
	if g := qs["reports"].Groups; len(g) != 1 || g[0] != (HeldGroup{Group: "acme", Paused: true, Held: 2}) {
		t.Errorf("reports' groups: %+v, want acme paused holding 2", g)
	}
	if g, err := admin.HeldGroups(ctx, "reports"); err != nil || len(g) != 1 || g[0] != (HeldGroup{Group: "acme", Paused: true, Held: 2}) {
		t.Errorf("HeldGroups: %+v %v", g, err)
	}
	if n, err := admin.ResumeGroup(ctx, "reports", "acme"); n != 2 || err != nil {
		t.Fatalf("ResumeGroup: %d %v", n, err)
	}
	qs = list()
	if _, ok := qs[HeldQueue("reports", "acme")]; ok || len(qs["reports"].Groups) != 0 {
		t.Errorf("after the resume: %+v", qs)
	}
}
