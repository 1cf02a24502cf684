package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// ---- dead letters ----

// makeDead dead-letters n jobs (Permanent on their first try; they succeed
// once redriven, which a kept error history shows) and returns the worker
// and the dead letters in queue order.
func (e *env) makeDead(t *testing.T, n int) (*worker, []ap.DeadLetter) {
	t.Helper()
	w := e.worker(e.config()).handle(t, "d", func(_ context.Context, j *ap.Job) error {
		if len(j.Errors) == 0 {
			return ap.Permanent(errors.New("first life"))
		}
		return nil
	})
	for i := range n {
		e.enqueue(w.P, &ap.Job{Type: "d", Payload: []byte(fmt.Sprint(i))})
	}
	w.start(t)
	return w, e.waitDead(w.P, n)
}

func testDeadEmpty(t *testing.T, e *env) {
	p := e.producer()
	called := false
	err := p.NextDeadLetter(ctxT(t, e.opts.Wait), e.queue, func(context.Context, ap.DeadLetter) (bool, error) {
		called = true
		return true, nil
	})
	if !errors.Is(err, ap.ErrNoDeadLetters) || called {
		t.Errorf("empty queue: got %v (callback called %v), want ErrNoDeadLetters", err, called)
	}
}

func testDeadPopKeepError(t *testing.T, e *env) {
	w, dls := e.makeDead(t, 3)
	ctx := ctxT(t, e.opts.Wait)
	next := func(pop bool, ret error) (string, error) {
		var id string
		err := w.P.NextDeadLetter(ctx, e.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
			id = dl.Job.ID
			return pop, ret
		})
		return id, err
	}
	if id, err := next(false, nil); err != nil || id != dls[0].Job.ID {
		t.Fatalf("peek: got %s, %v; want the oldest, %s", id, err, dls[0].Job.ID)
	}
	if id, _ := next(false, nil); id != dls[0].Job.ID {
		t.Errorf("after keep, the next call saw %s, want the same record %s", id, dls[0].Job.ID)
	}
	boom := errors.New("admin callback failed")
	if id, err := next(true, boom); !errors.Is(err, boom) || id != dls[0].Job.ID {
		t.Errorf("callback error: got %v, want it returned", err)
	}
	if id, _ := next(false, nil); id != dls[0].Job.ID {
		t.Errorf("after a callback error, the next call saw %s, want the same record %s", id, dls[0].Job.ID)
	}
	if id, err := next(true, nil); err != nil || id != dls[0].Job.ID {
		t.Fatalf("pop: %s, %v", id, err)
	}
	if id, _ := next(false, nil); id != dls[1].Job.ID {
		t.Errorf("after pop, the next call saw %s, want %s", id, dls[1].Job.ID)
	}
	if left := e.dead(w.P); len(left) != 2 {
		t.Errorf("%d dead letters left after one pop, want 2", len(left))
	}
}

func testDeadConcurrent(t *testing.T, e *env) {
	const n, callers = 12, 4
	w, dls := e.makeDead(t, n)
	var (
		mu     sync.Mutex
		held   = map[string]bool{}
		popped = map[string]int{}
		wg     sync.WaitGroup
	)
	deadline := time.Now().Add(e.opts.Wait)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				err := w.P.NextDeadLetter(context.Background(), e.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
					id := dl.Job.ID
					mu.Lock()
					if held[id] {
						t.Errorf("two callers hold dead letter %s at once", id)
					}
					held[id] = true
					mu.Unlock()
					time.Sleep(time.Millisecond)
					pop := rand.IntN(3) != 0 // some callers decline
					mu.Lock()
					delete(held, id)
					if pop {
						popped[id]++
					}
					mu.Unlock()
					return pop, nil
				})
				mu.Lock()
				total := len(popped)
				mu.Unlock()
				switch {
				case total == n:
					return
				case errors.Is(err, ap.ErrNoDeadLetters):
					time.Sleep(5 * time.Millisecond) // the rest are held by others
				case err != nil:
					t.Errorf("NextDeadLetter: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, dl := range dls {
		if popped[dl.Job.ID] != 1 {
			t.Errorf("dead letter %s popped %d times, want once", dl.Job.ID, popped[dl.Job.ID])
		}
	}
	if left := e.dead(w.P); len(left) != 0 {
		t.Errorf("%d dead letters left, want 0", len(left))
	}
}

func testDeadListing(t *testing.T, e *env) {
	w, dls := e.makeDead(t, 5)
	ctx := ctxT(t, e.opts.Wait)
	var paged []string
	pages := 0
	for cursor := ""; ; pages++ {
		page, err := w.P.DeadLetters(ctx, e.queue, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Letters) > 2 {
			t.Errorf("page of %d records, limit 2", len(page.Letters))
		}
		for _, dl := range page.Letters {
			paged = append(paged, dl.Job.ID)
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	if len(paged) != 5 {
		t.Fatalf("paging found %d records, want 5", len(paged))
	}
	for i, dl := range dls {
		if paged[i] != dl.Job.ID {
			t.Errorf("record %d: paged %s, listed %s", i, paged[i], dl.Job.ID)
		}
	}
	again := e.dead(w.P)
	if len(again) != 5 {
		t.Fatalf("after listing the queue holds %d, want 5", len(again))
	}
	for i := range again {
		if again[i].Job.ID != dls[i].Job.ID {
			t.Errorf("listing changed the order at %d: %s, was %s", i, again[i].Job.ID, dls[i].Job.ID)
		}
	}
	var first string
	_ = w.P.NextDeadLetter(ctx, e.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
		first = dl.Job.ID
		return false, nil
	})
	if first != dls[0].Job.ID {
		t.Errorf("after listing NextDeadLetter sees %s, want the oldest %s", first, dls[0].Job.ID)
	}
}

func testRedrive(t *testing.T, e *env) {
	w, dls := e.makeDead(t, 3)
	ctx := ctxT(t, e.opts.Wait)
	n, err := w.P.Redrive(ctx, e.queue, dls[0].Job.ID)
	if err != nil || n != 1 {
		t.Fatalf("Redrive one: %d, %v", n, err)
	}
	e.waitFor("the redriven job to run", func() bool {
		o := e.rec.outcomes(dls[0].Job.ID)
		return len(o) == 2 && o[1].Outcome == ap.OutcomeSucceeded
	})
	a := e.rec.of(dls[0].Job.ID)[1]
	if a.TryCount != 1 || a.Failures != 0 || a.Crashes != 0 || len(a.Job.Errors) != 1 {
		t.Errorf("redriven job: TryCount/Failures/Crashes %d/%d/%d with %d error lines; want 1/0/0 with 1 kept", a.TryCount, a.Failures, a.Crashes, len(a.Job.Errors))
	}
	if left := e.dead(w.P); len(left) != 2 {
		t.Errorf("%d dead letters after redriving one, want 2", len(left))
	}
	if n, err := w.P.Redrive(ctx, e.queue); err != nil || n != 2 {
		t.Fatalf("Redrive all: %d, %v", n, err)
	}
	for _, dl := range dls[1:] {
		e.waitFor("every redriven job to run", func() bool { return e.rec.count(dl.Job.ID) == 2 })
	}
	if left := e.dead(w.P); len(left) != 0 {
		t.Errorf("%d dead letters after redriving all, want 0", len(left))
	}
}

func testPurge(t *testing.T, e *env) {
	w, _ := e.makeDead(t, 3)
	ctx := ctxT(t, e.opts.Wait)
	n, err := w.P.PurgeDeadLetters(ctx, e.queue)
	if err != nil || n != 3 {
		t.Fatalf("Purge: %d, %v; want 3", n, err)
	}
	if left := e.dead(w.P); len(left) != 0 {
		t.Errorf("%d dead letters after purge", len(left))
	}
	err = w.P.NextDeadLetter(ctx, e.queue, func(context.Context, ap.DeadLetter) (bool, error) { return false, nil })
	if !errors.Is(err, ap.ErrNoDeadLetters) {
		t.Errorf("NextDeadLetter after purge: %v", err)
	}
}

// ---- stop ----

func testStopHandsBack(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 1, Prefetch: ap.Limit(2)}}
	h, started, _ := blocker()
	a := e.worker(cfg).handle(t, "s", h)
	jobs := []*ap.Job{{Type: "s"}, {Type: "s"}, {Type: "s"}}
	e.enqueue(a.P, jobs...)
	a.start(t)
	select {
	case <-started:
	case <-time.After(e.opts.Wait):
		t.Fatalf("the job never started")
	}
	time.Sleep(100 * time.Millisecond) // let the prefetch fill
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := a.P.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop with a handler still running: %v, want DeadlineExceeded", err)
	}
	b := e.worker(e.config()).handle(t, "s", ok).start(t)
	for _, j := range jobs {
		e.waitFor("every handed-back job", func() bool {
			for _, o := range e.rec.outcomes(j.ID) {
				if o.Outcome == ap.OutcomeSucceeded {
					return true
				}
			}
			return false
		})
		for _, at := range e.rec.of(j.ID) {
			if at.TryCount != 1 || at.Failures != 0 || at.Crashes != 0 {
				t.Errorf("job %s attempt %+v: a hand-back must not spend a try", j.ID, at)
			}
		}
	}
	if len(e.dead(b.P)) != 0 {
		t.Errorf("dead letters after a graceful stop")
	}
}

func testStopFinishes(t *testing.T, e *env) {
	started := make(chan struct{}, 1)
	a := e.worker(e.config()).handle(t, "f", func(context.Context, *ap.Job) error {
		started <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		return nil
	})
	job := &ap.Job{Type: "f"}
	e.enqueue(a.P, job)
	a.start(t)
	<-started
	if err := a.P.Stop(ctxT(t, e.opts.Wait)); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if o := e.rec.outcomes(job.ID); len(o) != 1 || o[0].Outcome != ap.OutcomeSucceeded {
		t.Fatalf("outcomes after Stop: %+v, want one success", o)
	}
	e.worker(e.config()).handle(t, "f", ok).start(t)
	e.settle()
	if n := e.rec.count(job.ID); n != 1 {
		t.Errorf("a job finished before Stop returned ran %d times", n)
	}
}

// ---- delivery ----

func testExactlyOnce(t *testing.T, e *env) {
	const n = 300
	var mu sync.Mutex
	done := map[string]int{}
	h := func(_ context.Context, j *ap.Job) error {
		mu.Lock()
		done[j.ID]++
		mu.Unlock()
		return nil
	}
	var workers []*worker
	for range 3 {
		workers = append(workers, e.worker(e.config()).handle(t, "n", h).start(t))
	}
	jobs := make([]*ap.Job, n)
	for i := range jobs {
		jobs[i] = &ap.Job{Type: "n", Payload: []byte(fmt.Sprint(i))}
	}
	e.enqueue(workers[0].P, jobs...)
	e.waitFor(fmt.Sprintf("%d jobs", n), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == n
	})
	e.settle()
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, j := range jobs {
		switch n := done[j.ID]; {
		case n == 0:
			t.Errorf("job %s never processed", j.ID)
		case n > 1 && e.opts.DuplicatesWithoutFaults != "":
			dups += n - 1
		case n > 1:
			t.Errorf("job %s processed %d times", j.ID, n)
		}
	}
	if dups > 0 {
		t.Logf("%d duplicate deliveries, allowed because: %s", dups, e.opts.DuplicatesWithoutFaults)
	}
	st, err := workers[0].P.Stats(context.Background(), e.queue)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready > 0 || st.InFlight > 0 || st.Scheduled > 0 || st.Dead > 0 {
		t.Errorf("queue not empty at the end: %+v", st)
	}
}

func testNotBefore(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "nb", ok)
	at := time.Now().Add(800 * time.Millisecond)
	later := &ap.Job{Type: "nb", NotBefore: at}
	now := &ap.Job{Type: "nb"}
	e.enqueue(w.P, later, now)
	w.start(t)
	e.waitFor("both jobs", func() bool { return e.rec.count(later.ID) == 1 && e.rec.count(now.ID) == 1 })
	if got := e.rec.of(later.ID)[0].At; got.Before(at) {
		t.Errorf("a job delayed until %v ran %v early", at.Format(time.StampMilli), at.Sub(got))
	}
	if got := e.rec.of(now.ID)[0].At; !got.Before(at) {
		t.Errorf("an undelayed job waited behind a delayed one")
	}
}

// ---- a real process, killed ----

func testProcessKill(t *testing.T, e *env) {
	if e.opts.SingleProcess != "" {
		t.Skipf("the backend declares it cannot share queues across processes: %s", e.opts.SingleProcess)
	}
	job := &ap.Job{Type: "k"}
	e.enqueue(e.producer(), job)
	var parts []string
	for _, p := range strings.Split(t.Name(), "/") {
		parts = append(parts, "^"+regexp.QuoteMeta(p)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+e.queue)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the worker process: %v", err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var seen []string
	timeout := time.After(e.opts.Wait)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the worker process exited before taking the job: %v", seen)
			}
			seen = append(seen, l)
			if strings.HasPrefix(l, "STARTED "+job.ID) {
				break wait
			}
		case <-timeout:
			_ = cmd.Process.Kill()
			t.Fatalf("the worker process never took the job: %v", seen)
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL mid-job
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for range lines {
	}
	e.worker(e.config()).handle(t, "k", ok).start(t)
	e.waitFor("the killed process's job", func() bool { return e.rec.count(job.ID) == 1 })
	checkTries(t, e.rec.of(job.ID), [3]int{2, 0, 1})
}

// runChild is the worker process of the ProcessKill case: it takes one job,
// says so on stdout, and hangs until it is killed.
func runChild(t *testing.T, makeHarness HarnessMaker, opts Options, queue string) {
	t.Run("Crash/ProcessKill", func(t *testing.T) {
		e := newEnv(t, makeHarness, opts, queue)
		cfg := e.config()
		cfg.Queues = map[string]ap.QueueConfig{queue: {Concurrency: 1, Prefetch: ap.Limit(0)}}
		w := e.worker(cfg).handle(t, "k", func(ctx context.Context, j *ap.Job) error {
			fmt.Fprintf(os.Stdout, "STARTED %s %d\n", j.ID, j.TryCount)
			time.Sleep(2 * time.Minute) // the parent kills us long before
			return errors.New("the parent never killed this worker")
		})
		w.start(t)
		time.Sleep(2 * time.Minute)
	})
}
