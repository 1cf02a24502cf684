package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// testUniqueConcurrent: 20 Enqueues of one key, from 4 platforms over
// backends of their own, at once: exactly one is stored, the others get
// ErrDuplicate.
func testUniqueConcurrent(t *testing.T, e *env) {
	key := e.queue + "/one"
	var producers []*ap.Platform
	for range 4 {
		producers = append(producers, e.producer())
	}
	ctx := ctxT(t, e.opts.Wait)
	var stored, dups atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := producers[i%4].Enqueue(ctx, &ap.Job{Type: "u", Queue: e.queue, UniqueKey: key})
			switch {
			case err == nil:
				stored.Add(1)
			case errors.Is(err, ap.ErrDuplicate):
				dups.Add(1)
			default:
				t.Errorf("Enqueue: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if stored.Load() != 1 || dups.Load() != 19 {
		t.Fatalf("%d stored, %d refused as duplicates; want 1 and 19", stored.Load(), dups.Load())
	}
	var handled atomic.Int32
	e.worker(e.config()).handle(t, "u", func(context.Context, *ap.Job) error { handled.Add(1); return nil }).start(t)
	e.waitFor("the job", func() bool { return handled.Load() > 0 })
	e.settle()
	if n := handled.Load(); n != 1 {
		t.Fatalf("%d jobs handled; want 1", n)
	}
}

// enqueueFree enqueues j, waiting for its key to be released (the release
// follows the outcome's report, which the recorder sees first).
func enqueueFree(t *testing.T, e *env, p *ap.Platform, j *ap.Job) {
	t.Helper()
	ctx := ctxT(t, e.opts.Wait)
	var err error
	for deadline := time.Now().Add(e.opts.Wait); ; time.Sleep(10 * time.Millisecond) {
		j.ID = ""
		if err = p.Enqueue(ctx, j); !errors.Is(err, ap.ErrDuplicate) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("Enqueue of a job with key %q: %v; want it stored (the key free)", j.UniqueKey, err)
	}
}

// testUniqueAfterSuccess: a unique job's key is held while it waits and
// free once it succeeded.
func testUniqueAfterSuccess(t *testing.T, e *env) {
	key := e.queue + "/s"
	p := e.producer()
	ctx := ctxT(t, e.opts.Wait)
	j := &ap.Job{Type: "u", Queue: e.queue, UniqueKey: key}
	e.enqueue(p, j)
	if err := p.Enqueue(ctx, &ap.Job{Type: "u", Queue: e.queue, UniqueKey: key}); !errors.Is(err, ap.ErrDuplicate) {
		t.Fatalf("a second job while the first waits: %v; want ErrDuplicate", err)
	}
	e.worker(e.config()).handle(t, "u", ok).start(t)
	e.waitFor("the job to succeed", func() bool { return e.rec.count(j.ID) == 1 })
	enqueueFree(t, e, p, &ap.Job{Type: "u", Queue: e.queue, UniqueKey: key})
}

// testUniqueAfterDeadLetter: the key is free once the job is dead-lettered
// (ReleaseOnFinish); with ReleaseOnSuccess it is kept, and a redrive takes
// it again.
func testUniqueAfterDeadLetter(t *testing.T, e *env) {
	p := e.producer()
	ctx := ctxT(t, e.opts.Wait)
	fail := func(context.Context, *ap.Job) error { return ap.Permanent(errors.New("no")) }
	e.worker(e.config()).handle(t, "u", fail).start(t)
	j := &ap.Job{Type: "u", Queue: e.queue, UniqueKey: e.queue + "/d"}
	e.enqueue(p, j)
	e.waitDead(p, 1)
	enqueueFree(t, e, p, &ap.Job{Type: "other", Queue: e.queue, UniqueKey: j.UniqueKey, NotBefore: time.Now().Add(time.Hour)})

	kept := &ap.Job{Type: "u", Queue: e.queue, UniqueKey: e.queue + "/k", UniqueRelease: ap.ReleaseOnSuccess}
	e.enqueue(p, kept)
	e.waitDead(p, 2)
	e.settle()
	if err := p.Enqueue(ctx, &ap.Job{Type: "u", Queue: e.queue, UniqueKey: kept.UniqueKey}); !errors.Is(err, ap.ErrDuplicate) {
		t.Fatalf("after a dead letter with ReleaseOnSuccess: %v; want ErrDuplicate", err)
	}
	if n, err := p.Redrive(ctx, e.queue, kept.ID); n != 1 || err != nil {
		t.Fatalf("Redrive of the letter holding its key = %d, %v; want 1, nil", n, err)
	}
	// The first letter's key is held by the newer job: its redrive fails.
	if n, err := p.Redrive(ctx, e.queue, j.ID); n != 0 || !errors.Is(err, ap.ErrDuplicate) {
		t.Fatalf("Redrive of a letter whose key a newer job holds = %d, %v; want 0 and ErrDuplicate", n, err)
	}
}

// testUniqueAfterWindow: with ReleaseOnWindow the key outlives the job's
// success and is free once the window ends.
func testUniqueAfterWindow(t *testing.T, e *env) {
	const window = time.Second
	key := e.queue + "/w"
	p := e.producer()
	ctx := ctxT(t, e.opts.Wait)
	e.worker(e.config()).handle(t, "u", ok).start(t)
	j := &ap.Job{Type: "u", Queue: e.queue, UniqueKey: key, UniqueWindow: window, UniqueRelease: ap.ReleaseOnWindow}
	taken := time.Now()
	e.enqueue(p, j)
	e.waitFor("the job to succeed", func() bool { return e.rec.count(j.ID) == 1 })
	if err := p.Enqueue(ctx, &ap.Job{Type: "u", Queue: e.queue, UniqueKey: key}); time.Since(taken) < window && !errors.Is(err, ap.ErrDuplicate) {
		t.Fatalf("inside the window after success: %v; want ErrDuplicate", err)
	}
	time.Sleep(time.Until(taken.Add(window)))
	// The window counts from the key's write, a moment after taken, on
	// the store's clock.
	for deadline := time.Now().Add(e.scaled(time.Second)); ; time.Sleep(20 * time.Millisecond) {
		err := p.Enqueue(ctx, &ap.Job{Type: "u", Queue: e.queue, UniqueKey: key})
		if err == nil {
			break
		}
		if !errors.Is(err, ap.ErrDuplicate) || time.Now().After(deadline) {
			t.Fatalf("%v after the window: %v; want the job stored", time.Since(taken)-window, err)
		}
	}
}

// testUniqueProcesses: 20 Enqueues of one key from 4 real processes (the
// test binary again, 5 at once in each, all released together): exactly
// one is stored, and each of the 19 others is refused with ErrDuplicate
// naming that job as the holder.
func testUniqueProcesses(t *testing.T, e *env) {
	if e.opts.SingleProcess != "" {
		t.Skipf("the backend declares it cannot share queues across processes: %s (Unique/ConcurrentEnqueue runs in one)", e.opts.SingleProcess)
	}
	const procs, each = 4, 5
	key := e.queue + "/procs"
	var kids []*child
	for i := range procs {
		kids = append(kids, e.spawn(t, i, "unique"))
	}
	for _, k := range kids {
		k.expect(t, "READY", e.opts.Wait)
	}
	for _, k := range kids { // as close together as a pipe write each
		k.send(t, fmt.Sprintf("GO %d %s", each, key))
	}
	var stored, holders []string
	for _, k := range kids {
		for range each {
			res := k.expect(t, "ENQUEUE", e.opts.Wait)
			switch word, rest, _ := strings.Cut(res, " "); word {
			case "STORED":
				stored = append(stored, rest)
			case "DUPLICATE":
				holders = append(holders, rest)
			default:
				t.Errorf("child process %d: Enqueue: %s", k.n, res)
			}
		}
	}
	if len(stored) != 1 || len(holders) != procs*each-1 {
		t.Fatalf("%d stored (%v), %d refused as duplicates; want 1 and %d", len(stored), stored, len(holders), procs*each-1)
	}
	for _, h := range holders {
		if h != stored[0] && h != "" {
			t.Errorf("a duplicate names %q as the holder; the job stored is %s", h, stored[0])
		}
	}
	var handled atomic.Int32
	e.worker(e.config()).handle(t, "u", func(context.Context, *ap.Job) error { handled.Add(1); return nil }).start(t)
	e.waitFor("the job", func() bool { return e.rec.count(stored[0]) > 0 })
	e.settle()
	if n := handled.Load(); n != 1 {
		t.Fatalf("%d jobs handled; want the 1 stored", n)
	}
}

// uniqueChild is a process of Unique/ConcurrentProcesses: on "GO n key" it
// enqueues n jobs with that key at once, and says what became of each.
func uniqueChild(t *testing.T, k *kid, _ string) {
	cfg := ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p := k.platform(cfg)
	say("READY")
	if !k.stdin.Scan() {
		return
	}
	var n int
	var key string
	if _, err := fmt.Sscanf(k.stdin.Text(), "GO %d %s", &n, &key); err != nil {
		say("ENQUEUE bad command %q", k.stdin.Text())
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.opts.Wait)
	defer cancel()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			j := &ap.Job{Type: "u", Queue: k.queue, UniqueKey: key}
			err := p.Enqueue(ctx, j)
			var ue *ap.UniqueError
			switch {
			case err == nil:
				say("ENQUEUE STORED %s", j.ID)
			case errors.Is(err, ap.ErrDuplicate) && errors.As(err, &ue):
				say("ENQUEUE DUPLICATE %s", ue.Holder)
			default:
				say("ENQUEUE ERROR %s", strings.ReplaceAll(err.Error(), "\n", " "))
			}
		})
	}
	wg.Wait()
	k.waitStdin()
}

// testUniqueBatchPartlyHeld: a held key refuses a single Enqueue (naming
// the holder); an EnqueueBatch with some keys held (by a stored job, or by
// an earlier job of the batch) stores the others and returns a BatchError
// with one entry a job; no refused job is ever handled; each key is
// released as its job succeeds.
func testUniqueBatchPartlyHeld(t *testing.T, e *env) {
	p := e.producer()
	ctx := ctxT(t, e.opts.Wait)
	k1, k2 := e.queue+"/b1", e.queue+"/b2"
	a := &ap.Job{Type: "u", Queue: e.queue, UniqueKey: k1}
	e.enqueue(p, a)
	var ue *ap.UniqueError
	if err := p.Enqueue(ctx, &ap.Job{Type: "u", Queue: e.queue, UniqueKey: k1}); !errors.As(err, &ue) || ue.Holder != a.ID {
		t.Fatalf("a second job of a held key: %v; want a *UniqueError naming holder %s", err, a.ID)
	}
	batch := []*ap.Job{
		{Type: "u", Queue: e.queue, UniqueKey: k1}, // held by a
		{Type: "u", Queue: e.queue, UniqueKey: k2}, // free
		{Type: "u", Queue: e.queue},                // no key
		{Type: "u", Queue: e.queue, UniqueKey: k2}, // held by the batch's second
	}
	err := p.EnqueueBatch(ctx, batch)
	var be *ap.BatchError
	if !errors.As(err, &be) || len(be.Errs) != len(batch) {
		t.Fatalf("EnqueueBatch with held keys: %v; want a *BatchError with %d entries", err, len(batch))
	}
	for i, want := range []string{a.ID, "", "", batch[1].ID} {
		var ue *ap.UniqueError
		switch {
		case want == "" && be.Errs[i] != nil:
			t.Errorf("batch job %d: %v; want it stored", i, be.Errs[i])
		case want != "" && (!errors.As(be.Errs[i], &ue) || ue.Holder != want || ue.JobID != batch[i].ID):
			t.Errorf("batch job %d: %v; want a *UniqueError of job %s naming holder %s", i, be.Errs[i], batch[i].ID, want)
		}
	}
	var mu sync.Mutex
	handled := map[string]int{}
	e.worker(e.config()).handle(t, "u", func(_ context.Context, j *ap.Job) error {
		mu.Lock()
		handled[j.ID]++
		mu.Unlock()
		return nil
	}).start(t)
	stored := []string{a.ID, batch[1].ID, batch[2].ID}
	e.waitFor("the stored jobs to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range stored {
			if handled[id] == 0 {
				return false
			}
		}
		return true
	})
	e.settle()
	mu.Lock()
	if len(handled) != len(stored) {
		t.Errorf("jobs handled: %v; want only %v (a refused job is not stored)", handled, stored)
	}
	mu.Unlock()
	enqueueFree(t, e, p, &ap.Job{Type: "u", Queue: e.queue, UniqueKey: k1})
	enqueueFree(t, e, p, &ap.Job{Type: "u", Queue: e.queue, UniqueKey: k2})
}
