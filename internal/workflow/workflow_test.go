package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// fakeStore is a store in a map, with revisions.
type fakeStore struct {
	mu  sync.Mutex
	m   map[string][]byte
	rev map[string]int
	n   int
}

func newFake() *fakeStore { return &fakeStore{m: map[string][]byte{}, rev: map[string]int{}} }

func (f *fakeStore) Get(_ context.Context, key string) ([]byte, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.m[key]
	if !ok {
		return nil, "", driver.ErrKeyNotFound
	}
	return append([]byte(nil), v...), strconv.Itoa(f.rev[key]), nil
}

func (f *fakeStore) Create(_ context.Context, key string, value []byte, _ time.Duration) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.m[key]; ok {
		return "", driver.ErrKeyExists
	}
	f.n++
	f.m[key], f.rev[key] = append([]byte(nil), value...), f.n
	return strconv.Itoa(f.n), nil
}

func (f *fakeStore) Update(_ context.Context, key string, value []byte, rev string, _ time.Duration) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.m[key]; !ok || strconv.Itoa(f.rev[key]) != rev {
		return "", driver.ErrRevision
	}
	f.n++
	f.m[key], f.rev[key] = append([]byte(nil), value...), f.n
	return strconv.Itoa(f.n), nil
}

func (f *fakeStore) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	out := make([]driver.BatchResult, len(keys))
	for i, k := range keys {
		out[i].Value, out[i].Rev, out[i].Err = f.Get(ctx, k)
	}
	return out, nil
}

func (f *fakeStore) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	out := make([]driver.BatchResult, len(items))
	for i, it := range items {
		out[i].Rev, out[i].Err = f.Create(ctx, it.Key, it.Value, it.TTL)
	}
	return out, nil
}

// queue records the enqueues.
type queue struct {
	mu    sync.Mutex
	ready []Ready
}

func (q *queue) enqueue(_ context.Context, r []Ready) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ready = append(q.ready, r...)
	return nil
}

func (q *queue) take() []Ready {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := q.ready
	q.ready = nil
	return r
}

func spec(name string, deps ...string) Spec {
	return Spec{Name: name, Deps: deps, Job: json.RawMessage(`{}`)}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	many := make([]Spec, MaxSteps+1)
	for i := range many {
		many[i] = spec("s" + strconv.Itoa(i))
	}
	for _, c := range []struct {
		steps   []Spec
		problem string
		step    string
	}{
		{nil, "no steps", ""},
		{many, "too many steps", ""},
		{[]Spec{spec("a"), spec("a")}, "duplicate step", "a"},
		{[]Spec{spec("a/b")}, "bad step name", "a/b"},
		{[]Spec{spec("a", "x")}, "unknown dependency", "a"},
		{[]Spec{spec("a", "a")}, "cycle", "a"},
		{[]Spec{spec("a", "c"), spec("b", "a"), spec("c", "b")}, "cycle", "a"},
		{[]Spec{spec("a"), spec("b", "a", "a")}, "duplicate dependency", "b"},
	} {
		err := Validate(c.steps)
		var we *Error
		if !errors.As(err, &we) || !errors.Is(err, ErrInvalid) || we.Problem != c.problem || we.Step != c.step {
			t.Errorf("Validate(%d steps): %v; want %q at %q", len(c.steps), err, c.problem, c.step)
		}
	}
	if err := Validate([]Spec{spec("a"), spec("b", "a"), spec("c", "a"), spec("d", "b", "c")}); err != nil {
		t.Errorf("a diamond: %v", err)
	}
}

// run plays workers: it takes every enqueued step, Begins it and ends it
// as fn says, until nothing is enqueued.
func run(t *testing.T, e *Engine, q *queue, fn func(r Ready, st Start) error) map[string]int {
	t.Helper()
	ctx := context.Background()
	runs := map[string]int{}
	for {
		ready := q.take()
		if len(ready) == 0 {
			return runs
		}
		for _, r := range ready {
			st, err := e.Begin(ctx, r.Workflow, r.Step, r.Attempt)
			if err != nil {
				t.Fatalf("Begin(%s): %v", r.Step, err)
			}
			switch st.Action {
			case RunIt:
				runs[r.Step]++
				if err := fn(r, st); err != nil {
					if err := e.Fail(ctx, r.Workflow, r.Step, "permanent"); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := e.Succeed(ctx, r.Workflow, r.Step, []byte(r.Step)); err != nil {
					t.Fatal(err)
				}
			case Done, SkipIt:
				if err := e.Advance(ctx, r.Workflow, r.Step); err != nil {
					t.Fatal(err)
				}
			case FailIt:
				if err := e.Fail(ctx, r.Workflow, r.Step, ReasonDependencyFailed); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func states(t *testing.T, e *Engine, id string) string {
	t.Helper()
	st, err := e.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	s := ""
	for _, r := range st.Steps {
		s += fmt.Sprintf("%s=%s%s ", r.Name, r.State, map[bool]string{true: "/" + r.Reason}[r.Reason != ""])
	}
	return s
}

func TestDiamond(t *testing.T) {
	t.Parallel()
	q := &queue{}
	e := New(Config{Store: newFake(), Enqueue: q.enqueue})
	id := NewID()
	if err := e.Create(context.Background(), id, "d", []Spec{spec("a"), spec("b", "a"), spec("c", "a"), spec("d", "b", "c")}); err != nil {
		t.Fatal(err)
	}
	var got string
	runs := run(t, e, q, func(r Ready, st Start) error {
		if r.Step == "d" {
			got = string(st.Results["b"]) + string(st.Results["c"])
		}
		return nil
	})
	if got != "bc" || runs["d"] != 1 || states(t, e, id) != "a=succeeded b=succeeded c=succeeded d=succeeded " {
		t.Errorf("d read %q, ran %d times, states %s", got, runs["d"], states(t, e, id))
	}
}

// TestRedeliveredParent: the parent that ended last is delivered again
// (its worker died before the ack): it does not run again and the join is
// not enqueued a second time.
func TestRedeliveredParent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := &queue{}
	e := New(Config{Store: newFake(), Enqueue: q.enqueue})
	id := NewID()
	if err := e.Create(ctx, id, "", []Spec{spec("a"), spec("b"), spec("j", "a", "b")}); err != nil {
		t.Fatal(err)
	}
	q.take()
	for _, s := range []string{"a", "b"} {
		if err := e.Succeed(ctx, id, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	if r := q.take(); len(r) != 1 || r[0].Step != "j" {
		t.Fatalf("enqueued %v; want j", r)
	}
	st, err := e.Begin(ctx, id, "b", 0) // b's redelivery
	if err != nil || st.Action != Done {
		t.Fatalf("Begin of b again: %v, %v; want Done", st.Action, err)
	}
	if err := e.Advance(ctx, id, "b"); err != nil {
		t.Fatal(err)
	}
	if r := q.take(); len(r) != 0 {
		t.Errorf("the redelivered parent enqueued %v again", r)
	}
}

// TestClaimHolderEnqueuesAgain: a parent whose worker died between the
// claim and the enqueue enqueues the join when it is delivered again; the
// other parent does not.
func TestClaimHolderEnqueuesAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFake()
	q := &queue{}
	e := New(Config{Store: f, Enqueue: q.enqueue})
	id := NewID()
	if err := e.Create(ctx, id, "", []Spec{spec("a"), spec("b"), spec("j", "a", "b")}); err != nil {
		t.Fatal(err)
	}
	q.take()
	for _, s := range []string{"a", "b"} {
		if err := e.finish(ctx, id, s, Succeeded, "", nil); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := e.claim(ctx, id, "j", "b", 0); !ok || err != nil { // b died after this
		t.Fatalf("claim: %v %v", ok, err)
	}
	if err := e.Advance(ctx, id, "a"); err != nil {
		t.Fatal(err)
	}
	if r := q.take(); len(r) != 0 {
		t.Fatalf("a, not the claim's holder, enqueued %v", r)
	}
	if err := e.Advance(ctx, id, "b"); err != nil {
		t.Fatal(err)
	}
	if r := q.take(); len(r) != 1 || r[0].Step != "j" {
		t.Fatalf("b's redelivery enqueued %v; want j", r)
	}
}

// TestFailedThenRedriven: a fails; b (Fail) fails dependency_failed, c
// (Run) runs, d (Skip) is skipped; a succeeds later (redriven): b comes
// back at attempt 1 and runs.
func TestFailedThenRedriven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := &queue{}
	e := New(Config{Store: newFake(), Enqueue: q.enqueue})
	id := NewID()
	c, d := spec("c", "a"), spec("d", "a")
	c.OnFailed, d.OnFailed = Run, Skip
	if err := e.Create(ctx, id, "", []Spec{spec("a"), spec("b", "a"), c, d}); err != nil {
		t.Fatal(err)
	}
	broken := true
	runs := run(t, e, q, func(r Ready, _ Start) error {
		if r.Step == "a" && broken {
			return errors.New("broken")
		}
		return nil
	})
	if s := states(t, e, id); s != "a=failed/permanent b=failed/dependency_failed c=succeeded d=skipped " || runs["b"] != 0 {
		t.Fatalf("states %s, b ran %d times", s, runs["b"])
	}
	broken = false
	q.ready = []Ready{{Workflow: id, Step: "a"}} // the redrive
	runs = run(t, e, q, func(Ready, Start) error { return nil })
	st, _ := e.Status(ctx, id)
	if s := states(t, e, id); s != "a=succeeded b=succeeded c=succeeded d=skipped " || runs["b"] != 1 || st.Steps[1].Attempt != 1 {
		t.Errorf("after the redrive: states %s, b ran %d times at attempt %d", s, runs["b"], st.Steps[1].Attempt)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := &queue{}
	e := New(Config{Store: newFake(), Enqueue: q.enqueue})
	id := NewID()
	if err := e.Create(ctx, id, "", []Spec{spec("a"), spec("b", "a")}); err != nil {
		t.Fatal(err)
	}
	if err := e.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	runs := run(t, e, q, func(Ready, Start) error { return nil })
	if s := states(t, e, id); len(runs) != 0 || s != "a=cancelled b=cancelled " {
		t.Errorf("after Cancel: %v ran, states %s", runs, s)
	}
	if err := e.Cancel(ctx, NewID()); !errors.Is(err, ErrNotFound) {
		t.Errorf("Cancel of an unknown workflow: %v", err)
	}
}

// TestUntrustedRecord: a record that does not decode is an error naming
// the key, never a panic.
func TestUntrustedRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFake()
	e := New(Config{Store: f, Enqueue: (&queue{}).enqueue})
	id := NewID()
	if err := e.Create(ctx, id, "", []Spec{spec("a")}); err != nil {
		t.Fatal(err)
	}
	f.m[stepKey(id, "a")] = []byte(`{"name":"a","deps":[1]}`)
	if _, err := e.Begin(ctx, id, "a", 0); !errors.Is(err, ErrBadRecord) {
		t.Errorf("Begin over a bad record: %v; want ErrBadRecord", err)
	}
	f.m[stepKey(id, "a")] = []byte(`{"name":"b"}`)
	if _, err := e.Begin(ctx, id, "a", 0); !errors.Is(err, ErrBadRecord) {
		t.Errorf("Begin over another step's record: %v; want ErrBadRecord", err)
	}
}

// TestFanIn: 300 parents ending concurrently enqueue the join once.
func TestFanIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := &queue{}
	e := New(Config{Store: newFake(), Enqueue: q.enqueue})
	id := NewID()
	specs := []Spec{}
	var deps []string
	for i := range 300 {
		deps = append(deps, "p"+strconv.Itoa(i))
		specs = append(specs, spec(deps[i]))
	}
	specs = append(specs, spec("j", deps...))
	if err := e.Create(ctx, id, "", specs); err != nil {
		t.Fatal(err)
	}
	q.take()
	var wg sync.WaitGroup
	for _, d := range deps {
		wg.Go(func() {
			if err := e.Succeed(ctx, id, d, nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if r := q.take(); len(r) != 1 || r[0].Step != "j" {
		t.Errorf("enqueued %d steps; want the join once", len(r))
	}
}

// countingStore counts the records read by GetEach.
type countingStore struct {
	*fakeStore
	read atomic.Int64
}

func (c *countingStore) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	c.read.Add(int64(len(keys)))
	return c.fakeStore.GetEach(ctx, keys)
}

// TestFanInReadsInOrder: parents of a fan-in ending in the order they were
// defined (a FIFO queue's order) read about n·ln n sibling records in all,
// not n²: a dependency sampled next to one that ended has most likely
// ended too, so the siblings are read in random order.
func TestFanInReadsInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 1000
	st := &countingStore{fakeStore: newFake()}
	q := &queue{}
	e := New(Config{Store: st, Enqueue: q.enqueue})
	id := NewID()
	var specs []Spec
	var deps []string
	for i := range n {
		deps = append(deps, "p"+strconv.Itoa(i))
		specs = append(specs, spec(deps[i]))
	}
	specs = append(specs, spec("j", deps...))
	if err := e.Create(ctx, id, "", specs); err != nil {
		t.Fatal(err)
	}
	q.take()
	st.read.Store(0)
	for _, d := range deps {
		if err := e.Succeed(ctx, id, d, nil); err != nil {
			t.Fatal(err)
		}
	}
	if r := q.take(); len(r) != 1 || r[0].Step != "j" {
		t.Fatalf("enqueued %d steps; want the join once", len(r))
	}
	// n·H(n) is about 7,500; reading whole batches at most doubles it.
	if got := st.read.Load(); got > 30*n {
		t.Errorf("the %d parents read %d sibling records; want at most %d (about n·ln n)", n, got, 30*n)
	}
}

// TestRedriveRacesDependencyFailed: b's job decides dependency_failed
// (a has failed), then a is redriven and succeeds while b's dead letter is
// being recorded: a's Advance finds b enqueued, not yet failed. b is
// brought back all the same, once, by the record of its failure.
func TestRedriveRacesDependencyFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := &queue{}
	e := New(Config{Store: newFake(), Enqueue: q.enqueue})
	id := NewID()
	if err := e.Create(ctx, id, "", []Spec{spec("a"), spec("b", "a")}); err != nil {
		t.Fatal(err)
	}
	q.take()
	if err := e.Fail(ctx, id, "a", "permanent"); err != nil {
		t.Fatal(err)
	}
	if r := q.take(); len(r) != 1 || r[0].Step != "b" {
		t.Fatalf("enqueued %v; want b", r)
	}
	if st, err := e.Begin(ctx, id, "b", 0); err != nil || st.Action != FailIt {
		t.Fatalf("Begin(b) = %+v, %v; want FailIt", st, err)
	}
	// a's dead letter is redriven, runs and succeeds before b's failure
	// is recorded.
	if st, err := e.Begin(ctx, id, "a", 0); err != nil || st.Action != RunIt {
		t.Fatalf("Begin(a) = %+v, %v; want RunIt", st, err)
	}
	if err := e.Succeed(ctx, id, "a", nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Fail(ctx, id, "b", ReasonDependencyFailed); err != nil {
		t.Fatal(err)
	}
	runs := run(t, e, q, func(Ready, Start) error { return nil })
	if s := states(t, e, id); s != "a=succeeded b=succeeded " || runs["b"] != 1 {
		t.Errorf("states %s, b ran %d times; want b brought back and run once", s, runs["b"])
	}
}

// TestStaleAttemptDeadLetterIgnored: b failed dependency_failed at its
// attempt 0, a was redriven and succeeded, so b is enqueued again at
// attempt 1. A dead letter of b's attempt 0 arriving then (its copy
// redriven by an operator and dead-lettered again) records nothing: b stays
// enqueued at attempt 1 and nothing depending on it is failed. A dead
// letter of attempt 1 is recorded.
func TestStaleAttemptDeadLetterIgnored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := &queue{}
	e := New(Config{Store: newFake(), Enqueue: q.enqueue})
	id := NewID()
	if err := e.Create(ctx, id, "", []Spec{spec("a"), spec("b", "a"), spec("c", "b")}); err != nil {
		t.Fatal(err)
	}
	q.take()
	if err := e.Fail(ctx, id, "a", "permanent"); err != nil {
		t.Fatal(err)
	}
	q.take()
	if err := e.FailAttempt(ctx, id, "b", 0, ReasonDependencyFailed); err != nil {
		t.Fatal(err)
	}
	q.take() // c, whose job will find b failed
	if err := e.Succeed(ctx, id, "a", nil); err != nil {
		t.Fatal(err)
	}
	if r := q.take(); len(r) != 1 || r[0].Step != "b" || r[0].Attempt != 1 {
		t.Fatalf("after a's redrive enqueued %+v; want b at attempt 1", r)
	}
	if err := e.FailAttempt(ctx, id, "b", 0, "unhandled"); err != nil {
		t.Fatal(err)
	}
	st, err := e.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Steps {
		if r.Name == "b" && (r.State != Enqueued || r.Attempt != 1) {
			t.Errorf("after attempt 0's late dead letter b is %s at attempt %d; want enqueued at 1", r.State, r.Attempt)
		}
	}
	if r := q.take(); len(r) != 0 {
		t.Errorf("attempt 0's late dead letter enqueued %+v; want nothing", r)
	}
	if err := e.FailAttempt(ctx, id, "b", 1, "permanent"); err != nil {
		t.Fatal(err)
	}
	if s := states(t, e, id); s != "a=succeeded b=failed/permanent c=enqueued " {
		t.Errorf("states %s after attempt 1's dead letter; want b failed", s)
	}
}

// TestRefiredStepEndsBeforeItsRecord: b, failed dependency_failed at
// attempt 0, is enqueued again at attempt 1 after a's redrive, and its job
// runs and succeeds before the enqueuer records the attempt (a broker that
// delivers at once). The record ends succeeded at attempt 1.
func TestRefiredStepEndsBeforeItsRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := &queue{}
	var e *Engine
	var ranB bool
	e = New(Config{Store: newFake(), Enqueue: func(ctx context.Context, rs []Ready) error {
		for _, r := range rs {
			if r.Step == "b" && r.Attempt == 1 {
				st, err := e.Begin(ctx, r.Workflow, "b", 1)
				if err != nil || st.Action != RunIt {
					return fmt.Errorf("Begin(b, 1) = %+v, %v; want RunIt", st, err)
				}
				ranB = true
				if err := e.Succeed(ctx, r.Workflow, "b", nil); err != nil {
					return err
				}
				continue
			}
			if err := q.enqueue(ctx, []Ready{r}); err != nil {
				return err
			}
		}
		return nil
	}})
	id := NewID()
	if err := e.Create(ctx, id, "", []Spec{spec("a"), spec("b", "a")}); err != nil {
		t.Fatal(err)
	}
	q.take()
	if err := e.Fail(ctx, id, "a", "permanent"); err != nil {
		t.Fatal(err)
	}
	q.take()
	if err := e.FailAttempt(ctx, id, "b", 0, ReasonDependencyFailed); err != nil {
		t.Fatal(err)
	}
	if err := e.Succeed(ctx, id, "a", nil); err != nil {
		t.Fatal(err)
	}
	if !ranB {
		t.Fatal("b was not enqueued again at attempt 1")
	}
	st, err := e.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Steps {
		if r.Name == "b" && (r.State != Succeeded || r.Attempt != 1) {
			t.Errorf("b is %s at attempt %d; want succeeded at 1", r.State, r.Attempt)
		}
	}
}

// ctxStore is a fakeStore whose reads and writes fail once ctx has ended,
// as a real store's do.
type ctxStore struct{ *fakeStore }

func (s ctxStore) Get(ctx context.Context, key string) ([]byte, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	return s.fakeStore.Get(ctx, key)
}

func (s ctxStore) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	return s.fakeStore.Update(ctx, key, value, rev, ttl)
}

// TestEnqueuedRecordedAfterCancel: a parent's context ends just after it
// enqueued the join (its lease lost, its handler cancelled). The join's
// record still moves to enqueued, so the parent's redelivery, holding the
// claim, does not enqueue the join a second time.
func TestEnqueuedRecordedAfterCancel(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	q := &queue{}
	var lose context.CancelFunc
	e := New(Config{Store: ctxStore{newFake()}, Enqueue: func(ctx context.Context, r []Ready) error {
		err := q.enqueue(ctx, r)
		if lose != nil {
			lose() // the lease is lost just after the enqueue
		}
		return err
	}})
	id := NewID()
	if err := e.Create(bg, id, "", []Spec{spec("a"), spec("j", "a")}); err != nil {
		t.Fatal(err)
	}
	q.take()
	if err := e.finish(bg, id, "a", Succeeded, "", nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	lose = cancel
	if err := e.Advance(ctx, id, "a"); err != nil {
		t.Logf("first Advance: %v", err)
	}
	lose = nil
	if err := e.Advance(bg, id, "a"); err != nil { // a's redelivery
		t.Fatal(err)
	}
	if r := q.take(); len(r) != 1 {
		t.Fatalf("j enqueued %d times, want once: %v", len(r), r)
	}
}
