package asyncplatform

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
)

func startPlatform(t *testing.T, cfg Config, handlers map[string]Handler) *Platform {
	t.Helper()
	cfg.Logger = quietLog
	p, err := New(memory.NewBroker().Connect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range handlers {
		if err := p.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
	})
	return p
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A check that fails from the start keeps every job in the broker.
func TestHealthGatesFromTheStart(t *testing.T) {
	var ran atomic.Int32
	p := startPlatform(t, Config{
		HealthInterval: 20 * time.Millisecond,
		HealthChecks:   map[string]HealthCheck{"db": func(context.Context) error { return errors.New("down") }},
	}, map[string]Handler{"t": func(context.Context, *Job) error { ran.Add(1); return nil }})
	for range 5 {
		_ = p.Enqueue(context.Background(), &Job{Type: "t"})
	}
	time.Sleep(200 * time.Millisecond)
	if n := ran.Load(); n != 0 {
		t.Errorf("%d jobs ran while the only health check failed", n)
	}
}

// What a handler does to its *Job is not carried into the retry.
func TestRetryIsBuiltFromTheDeliveredJob(t *testing.T) {
	seen := make(chan string, 2)
	p := startPlatform(t, Config{Policy: Policy{BackoffBase: time.Millisecond, BackoffCap: time.Millisecond}},
		map[string]Handler{"t": func(_ context.Context, j *Job) error {
			seen <- string(j.Payload) + "/" + j.Headers["k"]
			if j.TryCount == 1 {
				j.Payload[0] = 'X'
				j.Headers["k"] = "changed"
				return errors.New("fail once")
			}
			return nil
		}})
	_ = p.Enqueue(context.Background(), &Job{Type: "t", Payload: []byte("hello"), Headers: map[string]string{"k": "v"}})
	if first, second := <-seen, <-seen; first != "hello/v" || second != "hello/v" {
		t.Errorf("attempts saw %q then %q; the retry must see the job as enqueued", first, second)
	}
}

// A panic in a hook or a handler's runtime.Goexit neither kills the process
// nor pins the job: it comes back and, each time the same, ends poisoned.
func TestGoexitAndHookPanicsAreContained(t *testing.T) {
	for name, cfg := range map[string]Config{
		"goexit":     {},
		"hook panic": {Hooks: Hooks{AfterAttempt: func(context.Context, Attempt) { panic("hook bug") }}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.Lease = 60 * time.Millisecond
			cfg.Policy.PoisonLimit = Limit(1)
			var dead atomic.Int32
			cfg.Hooks.OnDeadLetter = func(context.Context, DeadLetter) { dead.Add(1) }
			goexit := name == "goexit"
			p := startPlatform(t, cfg, map[string]Handler{"t": func(context.Context, *Job) error {
				if goexit {
					runtime.Goexit()
				}
				return nil
			}})
			_ = p.Enqueue(context.Background(), &Job{Type: "t"})
			if goexit {
				waitUntil(t, "the job to end poisoned", func() bool { return dead.Load() == 1 })
			} else {
				waitUntil(t, "the job to be acked", func() bool {
					st, _ := p.Stats(context.Background(), DefaultQueue)
					return st.Ready == 0 && st.InFlight == 0 && st.Scheduled == 0
				})
			}
		})
	}
}

// Redriving a job that is dead-lettered again at once deletes only the old
// record.
func TestRedriveKeepsTheNewRecord(t *testing.T) {
	p := startPlatform(t, Config{}, map[string]Handler{"t": func(context.Context, *Job) error {
		return Permanent(errors.New("always"))
	}})
	ctx := context.Background()
	_ = p.Enqueue(ctx, &Job{ID: "j1", Type: "t"})
	waitUntil(t, "the first dead letter", func() bool { pg, _ := p.DeadLetters(ctx, DefaultQueue, "", 10); return len(pg.Letters) == 1 })
	first, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
	if n, err := p.Redrive(ctx, DefaultQueue, "j1"); n != 1 || err != nil {
		t.Fatalf("Redrive: %d, %v", n, err)
	}
	waitUntil(t, "the second dead letter", func() bool {
		pg, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
		return len(pg.Letters) == 1 && pg.Letters[0].ID != first.Letters[0].ID
	})
}

func TestNextDeadLetterPayloadsAreCopies(t *testing.T) {
	p := startPlatform(t, Config{}, map[string]Handler{"t": func(context.Context, *Job) error { return Invalid(errors.New("x")) }})
	ctx := context.Background()
	_ = p.Enqueue(ctx, &Job{Type: "t", Payload: []byte("abc")})
	waitUntil(t, "a dead letter", func() bool { pg, _ := p.DeadLetters(ctx, DefaultQueue, "", 10); return len(pg.Letters) == 1 })
	_ = p.NextDeadLetter(ctx, DefaultQueue, func(_ context.Context, dl DeadLetter) (bool, error) {
		dl.Job.Payload[0] = 'Z'
		return false, nil
	})
	pg, _ := p.DeadLetters(ctx, DefaultQueue, "", 10)
	if !bytes.Equal(pg.Letters[0].Job.Payload, []byte("abc")) {
		t.Errorf("changing a dead letter's payload changed the stored record: %q", pg.Letters[0].Job.Payload)
	}
}
