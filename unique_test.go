package asyncplatform

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/unique"
)

// Claim headers store the policy's number: the engine's numbers are the
// public ones.
func TestUniqueReleaseNumbers(t *testing.T) {
	t.Parallel()
	for pub, eng := range map[UniqueRelease]unique.Release{
		ReleaseOnFinish:  unique.OnFinish,
		ReleaseOnSuccess: unique.OnSuccess,
		ReleaseOnWindow:  unique.OnWindow,
	} {
		if unique.Release(pub) != eng {
			t.Errorf("%v is %d, the engine's %d", pub, pub, eng)
		}
	}
}

func TestUniqueConcurrentEnqueue(t *testing.T) {
	t.Parallel()
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var stored, dup atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "k"})
			var ue *UniqueError
			switch {
			case err == nil:
				stored.Add(1)
			case errors.Is(err, ErrDuplicate) && errors.As(err, &ue) && ue.Key == "k" && ue.Holder != "":
				dup.Add(1)
			default:
				t.Errorf("Enqueue: %v", err)
			}
		}()
	}
	wg.Wait()
	if stored.Load() != 1 || dup.Load() != 19 {
		t.Fatalf("stored %d, duplicates %d; want 1 and 19", stored.Load(), dup.Load())
	}
	s, err := p.Stats(ctx, DefaultQueue)
	if err != nil || s.Ready != 1 {
		t.Fatalf("Stats = %+v, %v; want 1 ready", s, err)
	}
}

func TestUniqueBatch(t *testing.T) {
	t.Parallel()
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "a"}); err != nil {
		t.Fatal(err)
	}
	jobs := []*Job{{Type: "t", UniqueKey: "a"}, {Type: "t"}, {Type: "t", UniqueKey: "b"}, {Type: "t", UniqueKey: "b"}}
	err = p.EnqueueBatch(ctx, jobs)
	var be *BatchError
	if !errors.As(err, &be) || !errors.Is(err, ErrDuplicate) {
		t.Fatalf("EnqueueBatch = %v; want a *BatchError matching ErrDuplicate", err)
	}
	want := []bool{true, false, false, true}
	for i, e := range be.Errs {
		if (e != nil) != want[i] || (e != nil && !errors.Is(e, ErrDuplicate)) {
			t.Errorf("Errs[%d] = %v; want a duplicate: %v", i, e, want[i])
		}
	}
	if s, _ := p.Stats(ctx, DefaultQueue); s.Ready != 3 {
		t.Fatalf("%d ready; want 3 (a, the keyless one, b)", s.Ready)
	}
	if jobs[0].Headers != nil {
		t.Error("the caller's job got headers")
	}
}

func TestUniqueRelease(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	var fail atomic.Bool
	p := startPlatform(t, Config{Policy: Policy{RetryLimit: Limit(0)}}, map[string]Handler{
		"t": func(ctx context.Context, j *Job) error {
			defer handled.Add(1)
			if fail.Load() {
				return Permanent(errors.New("no"))
			}
			return nil
		},
	})
	ctx := context.Background()
	enqueueAndWait := func(j *Job) {
		t.Helper()
		n := handled.Load()
		if err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the job handled", func() bool { return handled.Load() > n })
	}
	retry := func(j *Job) error { // the release follows the outcome's report
		var err error
		for range 100 {
			if err = p.Enqueue(ctx, j); !errors.Is(err, ErrDuplicate) {
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
		return err
	}
	// Released on success.
	enqueueAndWait(&Job{Type: "t", UniqueKey: "s"})
	if err := retry(&Job{Type: "t", UniqueKey: "s"}); err != nil {
		t.Fatalf("after success: %v", err)
	}
	// Released on dead letter (ReleaseOnFinish).
	fail.Store(true)
	enqueueAndWait(&Job{Type: "t", UniqueKey: "d"})
	if err := retry(&Job{Type: "t", UniqueKey: "d"}); err != nil {
		t.Fatalf("after a dead letter: %v", err)
	}
	// ReleaseOnSuccess: a dead letter keeps it; a redrive takes it again.
	j := &Job{Type: "t", UniqueKey: "o", UniqueRelease: ReleaseOnSuccess}
	enqueueAndWait(j)
	time.Sleep(50 * time.Millisecond)
	if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "o"}); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("after a dead letter with ReleaseOnSuccess: %v; want ErrDuplicate", err)
	}
	fail.Store(false)
	n := handled.Load()
	waitUntil(t, "the dead letters", func() bool {
		page, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
		return len(page.Letters) >= 3 // d, d again, o
	})
	if got, err := p.Redrive(ctx, DefaultQueue, j.ID); got != 1 || err != nil {
		t.Fatalf("Redrive = %d, %v; want 1, nil", got, err)
	}
	waitUntil(t, "the redriven job", func() bool { return handled.Load() > n })
	if err := retry(&Job{Type: "t", UniqueKey: "o"}); err != nil {
		t.Fatalf("after the redriven job succeeded: %v", err)
	}
	// ReleaseOnWindow: held after success, free after the window.
	enqueueAndWait(&Job{Type: "t", UniqueKey: "w", UniqueWindow: 300 * time.Millisecond, UniqueRelease: ReleaseOnWindow})
	if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "w"}); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("inside the window: %v; want ErrDuplicate", err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "w"}); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

func TestUniqueRedriveRefused(t *testing.T) {
	t.Parallel()
	p := startPlatform(t, Config{}, map[string]Handler{
		"t": func(ctx context.Context, j *Job) error { return Permanent(errors.New("no")) },
	})
	ctx := context.Background()
	if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "r"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the dead letter", func() bool {
		page, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
		return len(page.Letters) == 1
	})
	var err error
	for range 100 { // the key is released just after the record is written
		if err = p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "r", NotBefore: time.Now().Add(time.Hour)}); !errors.Is(err, ErrDuplicate) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	n, err := p.Redrive(ctx, DefaultQueue)
	if n != 0 || !errors.Is(err, ErrDuplicate) {
		t.Fatalf("Redrive = %d, %v; want 0 and ErrDuplicate", n, err)
	}
	if page, _ := p.DeadLetters(ctx, DefaultQueue, "", 10); len(page.Letters) != 1 {
		t.Fatalf("%d dead letters; want the refused one kept", len(page.Letters))
	}
}

func TestUniqueInvalid(t *testing.T) {
	t.Parallel()
	p, err := New(memory.NewBroker().Connect(), Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range []*Job{
		{Type: "t", UniqueKey: "a//b"},
		{Type: "t", UniqueWindow: time.Second},
		{Type: "t", UniqueKey: "a", UniqueWindow: -1},
		{Type: "t", UniqueKey: "a", UniqueRelease: 9},
	} {
		if err := p.Enqueue(context.Background(), j); !errors.Is(err, ErrInvalidJob) {
			t.Errorf("Enqueue(%+v) = %v; want ErrInvalidJob", j, err)
		}
	}
}

func TestUniqueStaleHeaderDropped(t *testing.T) {
	t.Parallel()
	got := make(chan *Job, 4)
	p := startPlatform(t, Config{}, map[string]Handler{
		"t": func(ctx context.Context, j *Job) error { got <- j; return nil },
	})
	ctx := context.Background()
	if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "x"}); err != nil {
		t.Fatal(err)
	}
	j := <-got
	if _, ok := j.Headers[UniqueHeader]; !ok {
		t.Fatal("a unique job carries no claim")
	}
	again := &Job{Type: "t", Headers: j.Headers}
	if err := p.Enqueue(ctx, again); err != nil {
		t.Fatal(err)
	}
	if _, ok := (<-got).Headers[UniqueHeader]; ok {
		t.Fatal("a job without a key kept a stale claim")
	}
}

// A backend without a store refuses unique jobs with ErrNoStore, saying why,
// and stores the others.
func TestUniqueNoStore(t *testing.T) {
	t.Parallel()
	p, err := New(struct{ driver.Backend }{memory.NewBroker().Connect()}, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err = p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "k"})
	if !errors.Is(err, ErrNoStore) || !strings.Contains(err.Error(), "asyncplatform: unique jobs need the backend's store") {
		t.Fatalf("Enqueue of a unique job = %v; want ErrNoStore, saying why", err)
	}
	if err := p.Enqueue(ctx, &Job{Type: "t"}); err != nil {
		t.Fatalf("Enqueue of a job without a key = %v", err)
	}
}

// forgeJob stores j on queue as a writer to the broker would: straight to
// the backend, bypassing Enqueue's checks.
func forgeJob(t *testing.T, p *Platform, queue string, j *Job) {
	t.Helper()
	if j.ID == "" {
		j.ID = "forged-" + j.Type
	}
	if j.EnqueuedAt.IsZero() {
		j.EnqueuedAt = time.Now()
	}
	if err := p.backend.Enqueue(context.Background(), queue, []driver.Message{encodeMessage(p.codec, j)}); err != nil {
		t.Fatal(err)
	}
}

// A forged job carrying a live claim's key and revision, but not its token,
// releases nothing when it ends: the key stays held by its job.
func TestUniqueForgedReleaseRefused(t *testing.T) {
	t.Parallel()
	held := make(chan *Job, 1)
	done := make(chan struct{}, 1)
	p := startPlatform(t, Config{}, map[string]Handler{
		"victim": func(ctx context.Context, j *Job) error { held <- j; <-ctx.Done(); return ctx.Err() },
		"forged": func(ctx context.Context, j *Job) error { done <- struct{}{}; return nil },
	})
	ctx := context.Background()
	if err := p.Enqueue(ctx, &Job{Type: "victim", UniqueKey: "invoice-42"}); err != nil {
		t.Fatal(err)
	}
	cl, ok := unique.Parse((<-held).Headers[UniqueHeader])
	if !ok || cl.Token == "" {
		t.Fatalf("the victim's claim %+v carries no token", cl)
	}
	cl.Token = "" // all a writer can guess: the key, and a revision
	forgeJob(t, p, DefaultQueue, &Job{Type: "forged", Headers: map[string]string{UniqueHeader: cl.Header()}})
	<-done
	time.Sleep(100 * time.Millisecond) // the release follows the handler
	if err := p.Enqueue(ctx, &Job{Type: "victim", UniqueKey: "invoice-42"}); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("after the forged job ended: Enqueue = %v; want ErrDuplicate (the key still held)", err)
	}
}

// Redrive skips a dead letter whose claim header the platform could not
// have written (a window that overflows, one past driver.MaxTTL), reports
// it (ErrInvalidJob), and redrives the others.
func TestUniqueRedriveSkipsBadClaim(t *testing.T) {
	t.Parallel()
	var seen sync.Map
	p := startPlatform(t, Config{}, map[string]Handler{
		"t": func(ctx context.Context, j *Job) error { // dead-lettered once; a redriven copy succeeds
			if _, again := seen.LoadOrStore(j.ID, true); again {
				return nil
			}
			return Permanent(errors.New("no"))
		},
	})
	ctx := context.Background()
	for i, w := range []string{"9223372036854776", "315360000001"} {
		forgeJob(t, p, DefaultQueue, &Job{ID: "bad" + strings.Repeat("x", i), Type: "t", Headers: map[string]string{UniqueHeader: "k=k&p=0&r=1&w=" + w}})
	}
	if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "good"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "three dead letters", func() bool {
		page, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
		return len(page.Letters) == 3
	})
	n, err := p.Redrive(ctx, DefaultQueue)
	if n != 1 || !errors.Is(err, ErrInvalidJob) || !strings.Contains(err.Error(), "2 dead letters") {
		t.Fatalf("Redrive = %d, %v; want 1 and ErrInvalidJob naming the 2 bad records", n, err)
	}
	page, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
	if len(page.Letters) != 2 || !strings.HasPrefix(page.Letters[0].Job.ID, "bad") || !strings.HasPrefix(page.Letters[1].Job.ID, "bad") {
		t.Fatalf("left %d letters; want the two bad ones", len(page.Letters))
	}
}

// countingMemory is a memory backend that counts the claims it is asked
// for apart from the enqueue (Create, CreateEach) and the claiming
// enqueues.
type countingMemory struct {
	*memory.Backend
	creates, claiming atomic.Int32
}

func (b *countingMemory) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	b.creates.Add(1)
	return b.Backend.Create(ctx, key, value, ttl)
}

func (b *countingMemory) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	b.creates.Add(1)
	return b.Backend.CreateEach(ctx, items)
}

func (b *countingMemory) EnqueueClaiming(ctx context.Context, queue string, msgs []driver.ClaimMessage) ([]driver.ClaimResult, error) {
	b.claiming.Add(1)
	return b.Backend.EnqueueClaiming(ctx, queue, msgs)
}

// hiddenClaims is a backend whose store is a companion (StoreProvider):
// its ClaimingEnqueuer is not the store's, so the platform takes claims
// with CreateEach before the Enqueue.
type hiddenClaims struct {
	driver.Backend
	store driver.Store
}

func (b hiddenClaims) Store() (driver.Store, error) { return b.store, nil }

// On a backend that is its own store and claims with its enqueue, a unique
// job costs one call (EnqueueClaiming), no Create of its own; on one that
// is not, the claim is a CreateEach before the Enqueue; the refusals, the
// jobs stored and the releases are the same.
func TestUniqueClaimsWithEnqueue(t *testing.T) {
	t.Parallel()
	for _, claiming := range []bool{true, false} {
		t.Run(map[bool]string{true: "claiming", false: "fallback"}[claiming], func(t *testing.T) {
			t.Parallel()
			mem := &countingMemory{Backend: memory.NewBroker().Connect()}
			var b driver.Backend = mem
			if !claiming {
				b = hiddenClaims{Backend: struct{ driver.Backend }{mem}, store: mem}
			}
			p, err := New(b, Config{Logger: quietLog, UniqueClaimsInEnqueue: true})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			first := &Job{Type: "t", UniqueKey: "a"}
			if err := p.Enqueue(ctx, first); err != nil {
				t.Fatal(err)
			}
			var ue *UniqueError
			if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "a"}); !errors.As(err, &ue) || ue.Holder != first.ID {
				t.Fatalf("Enqueue of a held key = %v; want a *UniqueError naming %s", err, first.ID)
			}
			jobs := []*Job{{Type: "t", UniqueKey: "a"}, {Type: "t"}, {Type: "t", UniqueKey: "b"}, {Type: "t", UniqueKey: "b"}, {Type: "t", Queue: "other", UniqueKey: "c"}}
			var be *BatchError
			if err := p.EnqueueBatch(ctx, jobs); !errors.As(err, &be) {
				t.Fatalf("EnqueueBatch = %v; want a *BatchError", err)
			}
			for i, holder := range []string{first.ID, "", "", jobs[2].ID, ""} {
				var ue *UniqueError
				if (be.Errs[i] != nil) != (holder != "") || (holder != "" && (!errors.As(be.Errs[i], &ue) || ue.Holder != holder)) {
					t.Errorf("Errs[%d] = %v; want held by %q", i, be.Errs[i], holder)
				}
			}
			if s, _ := p.Stats(ctx, DefaultQueue); s.Ready != 3 {
				t.Fatalf("%d ready; want 3 (a, the keyless one, b)", s.Ready)
			}
			creates, calls := mem.creates.Load(), mem.claiming.Load()
			if claiming && (creates != 0 || calls != 4) {
				t.Errorf("%d Creates and %d EnqueueClaiming; want 0 and 4 (one a call, one a queue of the batch)", creates, calls)
			}
			if !claiming && (creates == 0 || calls != 0) {
				t.Errorf("%d Creates and %d EnqueueClaiming; want some and 0", creates, calls)
			}
			// The claims are released as before: on success.
			done := make(chan struct{}, 8)
			if err := p.Handle("t", func(context.Context, *Job) error { done <- struct{}{}; return nil }); err != nil {
				t.Fatal(err)
			}
			if err := p.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer p.Stop(ctx)
			for range 3 {
				<-done
			}
			for deadline := time.Now().Add(time.Minute); ; {
				err := p.Enqueue(ctx, &Job{Type: "x", UniqueKey: "a", NotBefore: time.Now().Add(time.Hour)})
				if err == nil {
					break
				}
				if !errors.Is(err, ErrDuplicate) || time.Now().After(deadline) {
					t.Fatalf("Enqueue of key a after its job succeeded: %v; want it free", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
