package asyncplatform

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestNewRejectsBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"negative retry limit", Config{Policy: Policy{RetryLimit: Limit(-1)}}, "Policy: RetryLimit is -1"},
		{"negative poison limit", Config{Queues: map[string]QueueConfig{"q": {Policy: Policy{PoisonLimit: Limit(-2)}}}}, `Queues["q"].Policy: PoisonLimit is -2`},
		{"empty queue name", Config{Queues: map[string]QueueConfig{"": {}}}, "queue name is empty"},
		{"bad queue name", Config{Queues: map[string]QueueConfig{"a b": {}}}, `queue name "a b"`},
		{"negative concurrency", Config{Queues: map[string]QueueConfig{"q": {Concurrency: -1}}}, `Queues["q"].Concurrency is -1`},
		{"negative prefetch", Config{Queues: map[string]QueueConfig{"q": {Prefetch: Limit(-1)}}}, `Queues["q"].Prefetch is -1`},
		{"negative lease", Config{Lease: -time.Second}, "Lease is -1s"},
		{"negative unhandled retries", Config{UnhandledRetries: Limit(-1)}, "UnhandledRetries is -1"},
		{"nil health check", Config{HealthChecks: map[string]HealthCheck{"db": nil}}, `check "db"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(memory.NewBroker().Connect(), c.cfg)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want ErrInvalidConfig naming %q", err, c.want)
			}
		})
	}
	if _, err := New(nil, Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil backend: %v", err)
	}
}

func TestHandleRejectsBadInput(t *testing.T) {
	p, _ := New(memory.NewBroker().Connect(), Config{Logger: quietLog})
	ok := func(context.Context, *Job) error { return nil }
	if err := p.Handle("", ok); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("empty type: %v", err)
	}
	if err := p.Handle("t", nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil handler: %v", err)
	}
	if err := p.Handle("t", ok); err != nil {
		t.Fatal(err)
	}
	if err := p.Handle("t", ok); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("duplicate: %v", err)
	}
	if err := p.Handle("u", ok, Policy{Timeout: time.Second}, Policy{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("two policies: %v", err)
	}
}

func TestEnqueueRejectsBadJobs(t *testing.T) {
	p, _ := New(memory.NewBroker().Connect(), Config{Logger: quietLog})
	ctx := context.Background()
	now := time.Now()
	cases := []struct {
		name string
		job  *Job
		want string
	}{
		{"nil", nil, "job is nil"},
		{"no type", &Job{}, "has no Type"},
		{"bad queue", &Job{Type: "t", Queue: "no/slash"}, `queue name "no/slash"`},
		{"long queue", &Job{Type: "t", Queue: strings.Repeat("q", 101)}, "the limit is 100"},
		{"empty header key", &Job{Type: "t", Headers: map[string]string{"": "v"}}, "empty key"},
		{"deadline before start", &Job{Type: "t", NotBefore: now.Add(time.Hour), Deadline: now}, "not after NotBefore"},
		{"negative job limit", &Job{Type: "t", Policy: Policy{RetryLimit: Limit(-3)}}, "RetryLimit is -3"},
	}
	for _, c := range cases {
		err := p.Enqueue(ctx, c.job)
		if !errors.Is(err, ErrInvalidJob) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want ErrInvalidJob naming %q", c.name, err, c.want)
		}
	}
	// A batch with one bad job stores none.
	err := p.EnqueueBatch(ctx, []*Job{{Type: "t"}, {}})
	if !errors.Is(err, ErrInvalidJob) {
		t.Fatalf("bad batch: %v", err)
	}
	if st, _ := p.Stats(ctx, DefaultQueue); st.Ready != 0 {
		t.Errorf("a refused batch stored %d jobs", st.Ready)
	}
}

func TestPolicyPrecedence(t *testing.T) {
	job := Policy{Timeout: time.Second}
	typ := Policy{RetryLimit: Limit(2), Timeout: time.Hour}
	queue := Policy{RetryLimit: Limit(3), PoisonLimit: Limit(1)}
	platform := Policy{PoisonLimit: Limit(9), BackoffBase: time.Millisecond}
	r := job.merge(typ).merge(queue).merge(platform).resolve()
	if r.Timeout != time.Second || r.RetryLimit != 2 || r.PoisonLimit != 1 || r.BackoffBase != time.Millisecond || r.BackoffCap != DefaultBackoffCap {
		t.Errorf("resolved %+v", r)
	}
}

// A failing health check stops the platform from taking jobs; they wait in
// the broker and run once the check passes. A Reject re-runs the checks.
func TestHealthPausesAndResumes(t *testing.T) {
	var healthy atomic.Bool
	var ran atomic.Int32
	p, err := New(memory.NewBroker().Connect(), Config{
		Logger:         quietLog,
		HealthInterval: 20 * time.Millisecond,
		HealthChecks: map[string]HealthCheck{"db": func(context.Context) error {
			if healthy.Load() {
				return nil
			}
			return errors.New("db down")
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Handle("t", func(context.Context, *Job) error { ran.Add(1); return nil })
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for p.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("never became unhealthy")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := p.Health()["db"]; got == nil || got.Error() != "db down" {
		t.Errorf("Health()[db] = %v", got)
	}
	_ = p.Enqueue(ctx, &Job{Type: "t"})
	time.Sleep(200 * time.Millisecond)
	if n := ran.Load(); n != 0 {
		t.Fatalf("an unhealthy platform ran %d jobs", n)
	}
	if st, _ := p.Stats(ctx, DefaultQueue); st.Ready != 1 {
		t.Errorf("the job should wait in the broker: %+v", st)
	}
	healthy.Store(true)
	for ran.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("did not resume when healthy")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestMiddlewareAndHooks(t *testing.T) {
	var order []string
	mw := func(name string) Middleware {
		return func(next Handler) Handler {
			return func(ctx context.Context, j *Job) error {
				order = append(order, name)
				return next(ctx, j)
			}
		}
	}
	done := make(chan Attempt, 1)
	p, _ := New(memory.NewBroker().Connect(), Config{
		Logger:     quietLog,
		Middleware: []Middleware{mw("outer"), mw("inner")},
		EnqueueMiddleware: []EnqueueMiddleware{func(next EnqueueFunc) EnqueueFunc {
			return func(ctx context.Context, jobs []*Job) error {
				for _, j := range jobs {
					j.Headers = map[string]string{"traceparent": "00-1-2-01"}
				}
				return next(ctx, jobs)
			}
		}},
		Hooks: Hooks{AfterAttempt: func(_ context.Context, a Attempt) { done <- a }},
	})
	var header string
	_ = p.Handle("t", func(_ context.Context, j *Job) error {
		order = append(order, "handler")
		header = j.Headers["traceparent"]
		return nil
	})
	ctx := context.Background()
	_ = p.Start(ctx)
	defer p.Stop(ctx)
	_ = p.Enqueue(ctx, &Job{Type: "t"})
	a := <-done
	if strings.Join(order, ",") != "outer,inner,handler" || header != "00-1-2-01" || a.Outcome != OutcomeSucceeded {
		t.Errorf("order %v, header %q, outcome %q", order, header, a.Outcome)
	}
}

func TestNewIDIsUUIDv7(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := wire.NewID(time.Now())
		if len(id) != 36 || id[14] != '7' || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	b, err := Open(ctx, "memory://open-test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = Open(ctx, "nope://user:s3cret@host/")
	if !errors.Is(err, ErrUnknownScheme) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("unknown scheme: %v", err)
	}
}

func TestWarnThresholds(t *testing.T) {
	var logs bytes.Buffer
	done := make(chan struct{})
	p, _ := New(memory.NewBroker().Connect(), Config{
		Logger:    slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		WarnTries: 2,
		Policy:    Policy{BackoffBase: time.Millisecond, BackoffCap: time.Millisecond},
	})
	_ = p.Handle("t", func(_ context.Context, j *Job) error {
		if j.TryCount == 1 {
			return errors.New("once")
		}
		close(done)
		return nil
	})
	ctx := context.Background()
	_ = p.Start(ctx)
	_ = p.Enqueue(ctx, &Job{ID: "warn-me", Type: "t"})
	<-done
	_ = p.Stop(ctx)
	if n := strings.Count(logs.String(), "significant number of times"); n != 1 || !strings.Contains(logs.String(), "id=warn-me") {
		t.Errorf("want one warning naming the job, got:\n%s", logs.String())
	}
}

// tinyBackend is a memory backend that declares and enforces a 4 KiB message
// limit.
type tinyBackend struct{ *memoryBackend }

type memoryBackend = memory.Backend

const tinyMax = 4096

func (tinyBackend) Capabilities() driver.Capabilities { return driver.Capabilities{MaxBody: tinyMax} }

func (b tinyBackend) Enqueue(ctx context.Context, q string, msgs []driver.Message) error {
	for _, m := range msgs {
		if len(m.Body) > tinyMax {
			return driver.ErrTooLarge
		}
	}
	return b.memoryBackend.Enqueue(ctx, q, msgs)
}

func (b tinyBackend) Requeue(ctx context.Context, d *driver.Delivery, m driver.Message) error {
	if len(m.Body) > tinyMax {
		return driver.ErrTooLarge
	}
	return b.memoryBackend.Requeue(ctx, d, m)
}

func (b tinyBackend) DeadLetter(ctx context.Context, d *driver.Delivery, r driver.DeadMessage) error {
	if len(r.Body) > tinyMax {
		return driver.ErrTooLarge
	}
	return b.memoryBackend.DeadLetter(ctx, d, r)
}

// TestCopyNumbersEveryWrittenCopy checks Job.Copy: 0 for the enqueued copy,
// then one more for each copy the platform writes (a rejection, a retry),
// and TryCount moving only with the counted ones.
func TestCopyNumbersEveryWrittenCopy(t *testing.T) {
	type seen struct {
		copy uint64
		try  int
	}
	got := make(chan seen, 3)
	p, _ := New(memory.NewBroker().Connect(), Config{
		Logger:      quietLog,
		RejectDelay: time.Millisecond,
		Policy:      Policy{BackoffBase: time.Millisecond, BackoffCap: time.Millisecond},
	})
	_ = p.Handle("t", func(_ context.Context, j *Job) error {
		got <- seen{j.CopyNumber(), j.TryCount}
		switch j.CopyNumber() {
		case 0:
			return Reject(errors.New("not now"))
		case 1:
			return errors.New("fails once")
		}
		return nil
	})
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	if err := p.Enqueue(ctx, &Job{Type: "t"}); err != nil {
		t.Fatal(err)
	}
	want := []seen{{0, 1}, {1, 1}, {2, 2}}
	for i, w := range want {
		select {
		case s := <-got:
			if s != w {
				t.Errorf("attempt %d: Copy %d, TryCount %d; want Copy %d, TryCount %d", i+1, s.copy, s.try, w.copy, w.try)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("attempt %d never came", i+1)
		}
	}
}
