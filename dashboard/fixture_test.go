package dashboard_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	_ "github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/dashboard"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testWriter writes to the test's log: the dashboard's errors show there.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func redisAddr() string { return testenv.Getenv("ASYNCPLATFORM_REDIS_ADDR", "127.0.0.1:6379") }

// realRedis returns the URL of a key prefix of its own on the machine's
// Redis, whose keys are deleted when the test ends; it skips (fails with
// ASYNCPLATFORM_REQUIRE_SERVERS) when Redis is unreachable.
func realRedis(t testing.TB) string {
	t.Helper()
	addr := redisAddr()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		testenv.Unreachable(t, "Redis at "+addr, err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	prefix := "apdash" + hex.EncodeToString(b)
	t.Cleanup(func() {
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, "{"+prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 1000 {
				c.Unlink(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			c.Unlink(ctx, keys...)
		}
	})
	return "redis://" + addr + "/0?prefix=" + prefix
}

// fixture is a platform working some queues over a backend, its dashboard
// on an httptest server, and the jobs its handlers ran.
type fixture struct {
	t       testing.TB
	backend driver.Backend
	p       *ap.Platform
	rec     *dashboard.Recorder
	d       *dashboard.Dashboard
	srv     *httptest.Server
	base    string // the dashboard's address

	broken atomic.Bool // flaky.* jobs fail while it is set

	mu  sync.Mutex
	ran map[string]int // job IDs run successfully by "ok.*" and "flaky.*" handlers
}

type fixtureOptions struct {
	url     string         // backend URL; memory when empty
	backend driver.Backend // instead of url: a backend of the test's own
	queues  []string
	config  dashboard.Config
	noStart bool
	track   bool // the platform tracks every queue's job status
}

// newFixture starts a platform on the queues, with handlers:
//
//	ok.*      succeed, and are counted in ran
//	fail.*    return Permanent: dead-lettered at once with reason permanent
//	invalid.* return Invalid
//	flaky.*   fail like fail.* while broken is set, else succeed like ok.*
//
// Any other type is dead-lettered as unhandled, at once.
func newFixture(t testing.TB, o fixtureOptions) *fixture {
	t.Helper()
	ctx := context.Background()
	var b driver.Backend
	var err error
	switch {
	case o.backend != nil:
		b = o.backend
	case o.url == "":
		b = memory.NewBroker().Connect()
	default:
		b, err = ap.Open(ctx, o.url)
		if err != nil {
			t.Fatal(err)
		}
	}
	f := &fixture{t: t, backend: b, rec: dashboard.NewRecorder(), ran: map[string]int{}}
	qs := map[string]ap.QueueConfig{}
	for _, q := range o.queues {
		qs[q] = ap.QueueConfig{Concurrency: 4}
	}
	f.p, err = ap.New(b, ap.Config{
		Queues:           qs,
		Logger:           quiet(),
		WorkerName:       "test-worker",
		UnhandledRetries: ap.Limit(0),
		Lease:            5 * time.Second,
		Hooks:            ap.Hooks{AfterAttempt: f.rec.AfterAttempt},
		TrackStatus:      o.track,
		WorkerHeartbeat:  200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.p.Handle("ok.email", f.ok); err != nil {
		t.Fatal(err)
	}
	if err := f.p.Handle("ok.sms", f.ok); err != nil {
		t.Fatal(err)
	}
	if err := f.p.Handle("fail.email", fail); err != nil {
		t.Fatal(err)
	}
	if err := f.p.Handle("fail.sms", fail); err != nil {
		t.Fatal(err)
	}
	if err := f.p.Handle("flaky.email", func(ctx context.Context, j *ap.Job) error {
		if f.broken.Load() {
			return fail(ctx, j)
		}
		return f.ok(ctx, j)
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.p.Handle("invalid.report", func(ctx context.Context, j *ap.Job) error {
		return ap.Invalid(errors.New("the report's date is missing"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.p.Handle(hostileType, func(ctx context.Context, j *ap.Job) error {
		return ap.Permanent(errors.New(hostileError))
	}); err != nil {
		t.Fatal(err)
	}
	cfg := o.config
	if cfg.Queues == nil {
		cfg.Queues = o.queues
	}
	cfg.Recorder = f.rec
	if cfg.Deleter == nil {
		cfg.Deleter = b
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	f.d, err = dashboard.New(f.p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.d)
	f.base = f.srv.URL + cfg.Prefix
	if !o.noStart && len(o.queues) > 0 {
		if err := f.p.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		f.srv.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.p.Stop(sctx)
		if qd, ok := b.(driver.QueueDeleter); ok {
			for _, q := range o.queues {
				_ = qd.DeleteQueue(sctx, q)
			}
		}
		b.Close()
	})
	return f
}

func (f *fixture) ok(ctx context.Context, j *ap.Job) error {
	f.mu.Lock()
	f.ran[j.ID]++
	f.mu.Unlock()
	return nil
}

func fail(ctx context.Context, j *ap.Job) error {
	return ap.Permanent(fmt.Errorf("sending %s: the provider said no\n\tat provider.Send (provider.go:42)\n\tat worker.Run (worker.go:7)", j.Type))
}

func (f *fixture) runs(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ran[id]
}

// enqueue enqueues the jobs and waits until the queue's dead letters number
// wantDead.
func (f *fixture) enqueue(queue string, wantDead int64, jobs ...*ap.Job) {
	f.t.Helper()
	ctx := context.Background()
	for _, j := range jobs {
		j.Queue = queue
	}
	for len(jobs) > 0 {
		n := min(len(jobs), 500)
		if err := f.p.EnqueueBatch(ctx, jobs[:n]); err != nil {
			f.t.Fatal(err)
		}
		jobs = jobs[n:]
	}
	f.waitDead(queue, wantDead)
}

func (f *fixture) waitDead(queue string, want int64) {
	f.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, err := f.p.Stats(context.Background(), queue)
		if err != nil {
			f.t.Fatal(err)
		}
		if s.Dead == want && s.Ready == 0 && s.InFlight == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("queue %s: %+v, want %d dead letters", queue, s, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fixture) dead(queue string) int64 {
	f.t.Helper()
	s, err := f.p.Stats(context.Background(), queue)
	if err != nil {
		f.t.Fatal(err)
	}
	return s.Dead
}

// deadLetters lists every dead letter of the queue.
func (f *fixture) deadLetters(queue string) []ap.DeadLetter {
	f.t.Helper()
	var all []ap.DeadLetter
	for cursor := ""; ; {
		page, err := f.p.DeadLetters(context.Background(), queue, cursor, 1000)
		if err != nil {
			f.t.Fatal(err)
		}
		all = append(all, page.Letters...)
		if cursor = page.Next; cursor == "" {
			return all
		}
	}
}

// The hostile job's type and error hold markup and script: each would set
// window.__xss if a page ran it.
const (
	hostileType  = `<script>window.__xss=1</script>"><img src=x onerror="window.__xss=2">`
	hostileError = `"><img src=x onerror="window.__xss=7"><script>window.__xss=8</script>` + "\nsecond line </pre><script>window.__xss=9</script>"
)

// hostileJob is a job whose ID, type, error (from its handler), headers and
// payload hold markup and script.
func hostileJob() *ap.Job {
	return &ap.Job{
		ID:   `evil-<script>window.__xss=1</script>`,
		Type: hostileType,
		Headers: map[string]string{
			`"><img src=x onerror="window.__xss=3">`: `<script>window.__xss=4</script>`,
			"trace":                                  "\u202egnp.exe\x1b[31m",
		},
		Payload: []byte(`<script>window.__xss=5</script>"><img src=x onerror="window.__xss=6">`),
	}
}

func contains(s string, subs ...string) error {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return fmt.Errorf("missing %q", sub)
		}
	}
	return nil
}
