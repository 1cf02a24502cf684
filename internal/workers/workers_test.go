package workers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// clock is a settable clock for the tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T) *kv.Store {
	t.Helper()
	b, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return kv.Of(d, kv.Workers)
}

func newRegistry(st *kv.Store, c *clock, name string) *Registry {
	return New(Config{Store: st, Interval: time.Second, Now: c.Now,
		Self: func() Info {
			return Info{Name: name, Host: "h", PID: 7, Queues: []string{"a", "b"}, Concurrency: 3, Running: 2}
		}})
}

func TestBeatAndList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, c := newStore(t), &clock{t: time.Now()}
	r1, r2 := newRegistry(st, c, "one"), newRegistry(st, c, "two")
	if r1.ID() == r2.ID() || len(r1.ID()) < 20 {
		t.Fatalf("IDs %q and %q: want distinct random ones", r1.ID(), r2.ID())
	}
	for _, r := range []*Registry{r1, r2, r1} { // a second beat replaces the record
		if err := r.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l, err := r1.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Workers) != 2 || l.Unreadable != 0 || l.Partial {
		t.Fatalf("listed %+v, want the two workers", l)
	}
	for _, w := range l.Workers {
		if w.Host != "h" || w.PID != 7 || w.Concurrency != 3 || w.Running != 2 || len(w.Queues) != 2 || w.Interval != time.Second || w.BeatAt.IsZero() {
			t.Fatalf("record %+v", w)
		}
	}
}

// A record whose heartbeat is older than Expiry of its intervals is left
// out, whether or not the store has expired it yet.
func TestDeadWorkerAgesOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, c := newStore(t), &clock{t: time.Now()}
	r := newRegistry(st, c, "one")
	if err := r.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	c.Add(Expiry*time.Second - time.Millisecond)
	if l, _ := r.List(ctx); len(l.Workers) != 1 {
		t.Fatalf("listed %d workers within the expiry, want 1", len(l.Workers))
	}
	c.Add(2 * time.Millisecond)
	if l, _ := r.List(ctx); len(l.Workers) != 0 {
		t.Fatalf("listed %d workers past the expiry, want 0", len(l.Workers))
	}
	// The store's own TTL removes it too (real time: the memory store's clock).
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, _, err := st.Get(ctx, r.ID()); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record never expired in the store")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Run writes the record at once and removes it when its context ends.
func TestRunRemovesRecord(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	r := New(Config{Store: st, Interval: time.Hour, Self: func() Info { return Info{Name: "x"} }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, _, err := st.Get(context.Background(), r.ID()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no record written")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if _, _, err := st.Get(context.Background(), r.ID()); err == nil {
		t.Fatal("the record stayed after Run returned")
	}
}

// Records anyone can write are cut to the bounds, or skipped.
func TestForgedRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, c := newStore(t), &clock{t: time.Now()}
	r := newRegistry(st, c, "one")
	long := strings.Repeat("<script>", 1000)
	qs := make([]string, 5000)
	for i := range qs {
		qs[i] = "q"
	}
	beat := c.Now().UTC().Format(time.RFC3339Nano)
	forged := map[string]string{
		"w-long":    `{"name":"` + long + `","host":"` + long + `","version":"` + long + `","pid":-5,"running":-1,"concurrency":-9,"beat_at":"` + beat + `","queues":["` + strings.Join(qs, `","`) + `"]}`,
		"w-garbage": `{"name":`,
		"w-array":   `[1,2,3]`,
		"w-old":     `{"name":"old","beat_at":"2001-01-01T00:00:00Z"}`,
		"w-bigint":  `{"name":"x","interval":99999999999999999999,"beat_at":"` + beat + `"}`,
	}
	for k, v := range forged {
		if _, err := st.Create(ctx, k, []byte(v), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	l, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Workers) != 1 || l.Unreadable != 3 {
		t.Fatalf("listed %d workers, %d unreadable; want 1 and 3 (%+v)", len(l.Workers), l.Unreadable, l)
	}
	w := l.Workers[0]
	if len(w.Name) > MaxText+len("…") || len(w.Host) > MaxText+len("…") || len(w.Version) > MaxText+len("…") || len(w.Queues) != MaxQueues {
		t.Fatalf("a forged record was not cut: name %d bytes, %d queues", len(w.Name), len(w.Queues))
	}
	if w.PID < 0 || w.Running < 0 || w.Concurrency < 0 {
		t.Fatalf("negative numbers kept: %+v", w)
	}
}

// A listing reads at most MaxListed records and says it is partial.
func TestListBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, c := newStore(t), &clock{t: time.Now()}
	r := newRegistry(st, c, "one")
	v := []byte(`{"name":"n","beat_at":"` + c.Now().UTC().Format(time.RFC3339Nano) + `"}`)
	for i := 0; i < MaxListed+5; i += driver.MaxBatch {
		var items []driver.BatchItem
		for j := i; j < min(i+driver.MaxBatch, MaxListed+5); j++ {
			items = append(items, driver.BatchItem{Key: fmt.Sprintf("w-%06d", j), Value: v, TTL: time.Hour})
		}
		if _, err := st.CreateEach(ctx, items); err != nil {
			t.Fatal(err)
		}
	}
	l, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Workers) != MaxListed || !l.Partial {
		t.Fatalf("listed %d, partial %v; want %d and partial", len(l.Workers), l.Partial, MaxListed)
	}
}
