package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/asyncplatform/asyncplatform/internal/executor"
)

// What a handler does to its *Job is not carried into the retry, whether
// its payload's copy sits beside its Job (small) or on its own (large).
func TestRetryIsBuiltFromTheDeliveredJob(t *testing.T) {
	for _, payload := range []string{"hello", strings.Repeat("hello", 100)} {
		seen := make(chan string, 2)
		p := startPlatform(t, Config{Policy: Policy{BackoffBase: time.Millisecond, BackoffCap: time.Millisecond}},
			map[string]Handler{"t": func(_ context.Context, j *Job) error {
				seen <- string(j.Payload) + "/" + j.Headers["k"]
				if j.TryCount == 1 {
					j.Payload[0] = 'X'
					j.Payload = append(j.Payload, "more"...)
					j.Headers["k"] = "changed"
					return errors.New("fail once")
				}
				return nil
			}})
		_ = p.Enqueue(context.Background(), &Job{Type: "t", Payload: []byte(payload), Headers: map[string]string{"k": "v"}})
		if first, second := <-seen, <-seen; first != payload+"/v" || second != payload+"/v" {
			t.Errorf("%d-byte payload: attempts saw %.20q then %.20q; the retry must see the job as enqueued", len(payload), first, second)
		}
	}
}

// A handler may keep its *Job: later deliveries, which reuse the
// executor's own memory for the job as delivered, leave it as it was.
func TestKeptJobOutlivesLaterDeliveries(t *testing.T) {
	const n = 200
	kept := make(chan *Job, n)
	p := startPlatform(t, Config{Queues: map[string]QueueConfig{DefaultQueue: {Concurrency: 4}}},
		map[string]Handler{"t": func(_ context.Context, j *Job) error {
			kept <- j
			return nil
		}})
	jobs := make([]*Job, n)
	for i := range jobs {
		jobs[i] = &Job{Type: "t", Payload: []byte(fmt.Sprint("payload ", i)), Headers: map[string]string{"i": fmt.Sprint(i)}}
	}
	if err := p.EnqueueBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	byID := make(map[string]*Job, n)
	for range n {
		select {
		case j := <-kept:
			byID[j.ID] = j
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d jobs ran", len(byID), n)
		}
	}
	for i, want := range jobs {
		got := byID[want.ID]
		if got == nil || got.Type != "t" || got.Queue != DefaultQueue || got.TryCount != 1 ||
			string(got.Payload) != string(want.Payload) || got.Headers["i"] != fmt.Sprint(i) {
			t.Errorf("job %d as its handler kept it: %+v; want its own ID, type, payload and headers", i, got)
		}
	}
}

// A delivery and the handler's view each fit the Go allocator's small
// sizes (at most 512 bytes, no header of their own): a byte over costs
// every job a slower allocation and several per cent of throughput
// (docs/benchmarks.md, 2026-11-29). A delivery does not carry the job as
// delivered (the executor's Job, used again from one delivery to the next,
// is only pointed at while it is processed): every job allocates one, and
// the deliveries claimed ahead are held in numbers.
func TestDeliveryAllocationsStaySmall(t *testing.T) {
	if n := unsafe.Sizeof(executor.Delivery[Job]{}); n > 176 {
		t.Errorf("a delivery takes %d bytes; keep it within 176 (the job as delivered is not in it)", n)
	}
	if n := unsafe.Sizeof(view{}); n > 512 {
		t.Errorf("a handler's view takes %d bytes; keep it within 512 (shrink view.payload)", n)
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

// A handler that runs past its timeout fails with a history line that says
// so, and its dead letter keeps the same text.
func TestTimeoutInTheHistory(t *testing.T) {
	ctx := context.Background()
	dead := make(chan DeadLetter, 1)
	cfg := Config{Policy: Policy{RetryLimit: Limit(1), Timeout: 20 * time.Millisecond, BackoffBase: time.Millisecond, BackoffCap: time.Millisecond}}
	cfg.Hooks.OnDeadLetter = func(_ context.Context, dl DeadLetter) { dead <- dl }
	seen := make(chan []string, 2)
	p := startPlatform(t, cfg, map[string]Handler{"t": func(ctx context.Context, j *Job) error {
		seen <- j.Errors
		<-ctx.Done()
		return ctx.Err()
	}})
	if err := p.Enqueue(ctx, &Job{Type: "t"}); err != nil {
		t.Fatal(err)
	}
	var dl DeadLetter
	select {
	case dl = <-dead:
	case <-time.After(30 * time.Second):
		t.Fatal("not dead-lettered")
	}
	<-seen
	second := <-seen
	if len(second) != 1 || !strings.Contains(second[0], "timed out after 20ms") {
		t.Errorf("the retry's history %q, want a line saying the first try timed out", second)
	}
	if !strings.HasPrefix(dl.Error, "timed out after 20ms") {
		t.Errorf("the dead letter's error %q, want it to say the try timed out", dl.Error)
	}
}
