package history

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// writes counts the writes a store is asked for, and fails them while
// broken is set.
type writes struct {
	driver.Store
	n      atomic.Int64
	broken atomic.Bool
}

var errBroken = errors.New("broken store")

func (w *writes) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	w.n.Add(1)
	if w.broken.Load() {
		return "", errBroken
	}
	return w.Store.Create(ctx, key, value, ttl)
}

func (w *writes) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	w.n.Add(1)
	if w.broken.Load() {
		return "", errBroken
	}
	return w.Store.Update(ctx, key, value, rev, ttl)
}

func newStore(t *testing.T) *writes {
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
	return &writes{Store: d}
}

var t0 = time.Date(2026, 11, 29, 10, 0, 30, 0, time.UTC)

func newCounter(d driver.Store, now *time.Time) *Counter {
	return New(Config{Store: kv.Of(d, kv.History), Now: func() time.Time { return *now }})
}

// Counts of two workers merge into one bucket per minute, and a flush
// writes once per minute bucket however many jobs it counts.
func TestCountsMergedPerMinute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	now := t0
	a, b := newCounter(d, &now), newCounter(d, &now)
	for range 1000 {
		a.Add("mail", "send", Succeeded)
	}
	a.Add("mail", "send", Failed)
	b.Add("mail", "send", Succeeded)
	b.Add("mail", "digest", DeadLettered)
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := d.n.Load(); n != 1 {
		t.Fatalf("a flush of 1,001 attempts in one minute made %d writes, want 1", n)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	now = t0.Add(time.Minute)
	a.Add("mail", "send", Succeeded)
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := a.Read(ctx, t0.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Minutes) != 2 {
		t.Fatalf("%d minutes, want 2: %+v", len(r.Minutes), r)
	}
	m := r.Minutes[0]
	if !m.Start.Equal(t0.Truncate(time.Minute)) || len(m.Series) != 2 {
		t.Fatalf("first minute %+v", m)
	}
	want := []Series{{Queue: "mail", Type: "digest", Dead: 1}, {Queue: "mail", Type: "send", Succeeded: 1001, Failed: 1}}
	for i, s := range want {
		if m.Series[i] != s {
			t.Fatalf("series %d = %+v, want %+v", i, m.Series[i], s)
		}
	}
	if r.Minutes[1].Series[0].Succeeded != 1 {
		t.Fatalf("second minute %+v", r.Minutes[1])
	}
	// Read from a later minute leaves the earlier out.
	if r, _ := a.Read(ctx, t0.Add(time.Minute)); len(r.Minutes) != 1 {
		t.Fatalf("read from the second minute: %d minutes, want 1", len(r.Minutes))
	}
}

// Past MaxSeries pairs a minute, the rest are counted under Other.
func TestSeriesBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	now := t0
	c := newCounter(d, &now)
	for i := range MaxSeries + 50 {
		c.Add("q", fmt.Sprintf("type-%d", i), Succeeded)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c2 := newCounter(d, &now) // another worker's new pairs go to Other too
	c2.Add("q", "late", Succeeded)
	if err := c2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := c.Read(ctx, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Minutes) != 1 || len(r.Minutes[0].Series) > MaxSeries+1 {
		t.Fatalf("%d series, want at most %d", len(r.Minutes[0].Series), MaxSeries+1)
	}
	var other, sum int64
	for _, s := range r.Minutes[0].Series {
		if s.Queue == Other {
			other = s.Succeeded
		}
		sum += s.Succeeded
	}
	if other < 51 || sum != MaxSeries+51 {
		t.Fatalf("Other counted %d (want at least 51), in all %d (want %d)", other, sum, MaxSeries+51)
	}
}

// Counts a flush could not write are kept for the next one.
func TestFailedFlushKeepsCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	now := t0
	c := newCounter(d, &now)
	c.Add("q", "t", Succeeded)
	d.broken.Store(true)
	if err := c.Flush(ctx); !errors.Is(err, errBroken) {
		t.Fatalf("flush on a broken store: %v", err)
	}
	d.broken.Store(false)
	c.Add("q", "t", Succeeded)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r, _ := c.Read(ctx, t0)
	if len(r.Minutes) != 1 || r.Minutes[0].Series[0].Succeeded != 2 {
		t.Fatalf("read %+v, want 2 succeeded", r)
	}
}

// Buckets anyone can write are cut to the bounds, or skipped.
func TestForgedBuckets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	now := t0
	c := newCounter(d, &now)
	st := kv.Of(d, kv.History)
	m := t0.Unix() / 60
	long := strings.Repeat("<img src=x onerror=alert(1)>", 100)
	var many []string
	for i := range 1500 {
		many = append(many, fmt.Sprintf(`{"q":"q%d","t":"t","ok":1}`, i))
	}
	forged := map[string]string{
		key(m - 3):     `{"s":[{"q":"` + long + `","t":"` + long + `","ok":-5,"f":3}]}`,
		key(m - 2):     `{"s":[` + strings.Join(many, ",") + `]}`,
		key(m - 1):     `not json`,
		key(m):         `{"s":[{"q":"q","t":"t","ok":9223372036854775807,"f":9223372036854775807}]}`,
		key(m-1) + "x": `{"s":[]}`, // between two minutes: listed, unreadable
		"m/zzz":        `{"s":[]}`, // sorts after every minute: not read
	}
	for k, v := range forged {
		if _, err := st.Create(ctx, k, []byte(v), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	r, err := c.Read(ctx, t0.Add(-10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Minutes) != 3 || r.Unreadable != 2 {
		t.Fatalf("%d minutes, %d unreadable; want 3 and 2", len(r.Minutes), r.Unreadable)
	}
	if s := r.Minutes[2].Series[0]; s.Succeeded != MaxCount || s.Failed != MaxCount {
		t.Errorf("forged counts read as %d and %d; want each clamped to %d, so sums cannot overflow", s.Succeeded, s.Failed, int64(MaxCount))
	}
	s := r.Minutes[0].Series[0]
	if len(s.Queue) > MaxText+len("…") || len(s.Type) > MaxText+len("…") || s.Succeeded != 0 || s.Failed != 3 {
		t.Fatalf("forged series not cut: %d bytes, %+v", len(s.Queue), s.Succeeded)
	}
	if n := len(r.Minutes[1].Series); n != MaxSeries+1 {
		t.Fatalf("a forged bucket kept %d series, want %d", n, MaxSeries+1)
	}
	// A worker's flush into a forged bucket keeps it within the bounds.
	c.Add("q", "t", Succeeded)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// The keys sort by time and a read lists at most Buckets+1 of them.
func TestReadBounded(t *testing.T) {
	t.Parallel()
	if key(99) >= key(100) || key(100) >= key(1000000) {
		t.Fatal("bucket keys do not sort by time")
	}
	ctx := context.Background()
	d := newStore(t)
	now := t0
	c := newCounter(d, &now)
	st := kv.Of(d, kv.History)
	m := t0.Unix() / 60
	for i := 0; i < Buckets+100; i += driver.MaxBatch {
		var items []driver.BatchItem
		for j := i; j < min(i+driver.MaxBatch, Buckets+100); j++ {
			items = append(items, driver.BatchItem{Key: key(m - int64(j)), Value: []byte(`{"s":[]}`), TTL: time.Hour})
		}
		if _, err := st.CreateEach(ctx, items); err != nil {
			t.Fatal(err)
		}
	}
	r, err := c.Read(ctx, t0.Add(-time.Duration(Buckets+100)*Bucket))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Minutes) != Buckets+1 {
		t.Fatalf("read %d minutes, want %d", len(r.Minutes), Buckets+1)
	}
}

// BenchmarkAdd is the cost Add puts on the job path.
func BenchmarkAdd(b *testing.B) {
	d, _ := memory.New(context.Background(), memory.Config{})
	defer d.Close()
	s, _ := driver.StoreOf(d)
	c := New(Config{Store: kv.Of(s, kv.History)})
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Add("mail", "send", Succeeded)
		}
	})
}

// Names that JSON escapes (HTML characters, control characters, invalid
// UTF-8: six bytes each) still fit a full bucket in a store value: a
// second worker's merge never replaces the counts the bucket holds.
func TestEscapedNamesFitBucket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	now := t0
	a, b := newCounter(d, &now), newCounter(d, &now)
	name := func(i int) string { return fmt.Sprint(i) + strings.Repeat("<\x01\xff", 40) }
	for i := range MaxSeries / 2 {
		a.Add(name(i), name(i), Succeeded)
	}
	for i := MaxSeries / 2; i < MaxSeries+10; i++ {
		b.Add(name(i), name(i), Succeeded)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := a.Read(ctx, t0)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, m := range r.Minutes {
		for _, s := range m.Series {
			sum += s.Succeeded
		}
	}
	if sum != MaxSeries+10 {
		t.Fatalf("the bucket counts %d attempts, want %d", sum, MaxSeries+10)
	}
}
