package outbox

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// fakeSource is an outbox in memory with one lease per queue.
type fakeSource struct {
	mu     sync.Mutex
	rows   map[string][]Row
	held   map[string]bool
	aside  []int64
	events []string
}

func (s *fakeSource) OutboxQueues(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var qs []string
	for q, rs := range s.rows {
		if len(rs) > 0 {
			qs = append(qs, q)
		}
	}
	return qs, nil
}

func (s *fakeSource) TakeOutbox(_ context.Context, q string, _ time.Duration) (Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[q] {
		return nil, ErrHeld
	}
	s.held[q] = true
	return &fakeLease{s: s, q: q}, nil
}

type fakeLease struct {
	s *fakeSource
	q string
}

func (l *fakeLease) Next(_ context.Context, max int) ([]Row, error) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	rs := l.s.rows[l.q]
	return slices.Clone(rs[:min(max, len(rs))]), nil
}

func (l *fakeLease) Delete(_ context.Context, seqs []int64) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	l.s.rows[l.q] = slices.DeleteFunc(l.s.rows[l.q], func(r Row) bool { return slices.Contains(seqs, r.Seq) })
	l.s.events = append(l.s.events, "delete")
	return nil
}

func (l *fakeLease) Aside(_ context.Context, seq int64, _ string) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	l.s.rows[l.q] = slices.DeleteFunc(l.s.rows[l.q], func(r Row) bool { return r.Seq == seq })
	l.s.aside = append(l.s.aside, seq)
	l.s.events = append(l.s.events, "aside")
	return nil
}

func (l *fakeLease) Release(context.Context) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	l.s.held[l.q] = false
	return nil
}

// fakeTarget records publishes, failing while fail is set.
type fakeTarget struct {
	driver.Backend
	mu   sync.Mutex
	fail bool
	ids  []string
}

func (t *fakeTarget) Enqueue(_ context.Context, _ string, msgs []driver.Message) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fail {
		return errors.New("target down")
	}
	for _, m := range msgs {
		t.ids = append(t.ids, m.ID)
	}
	return nil
}

func (t *fakeTarget) Capabilities() driver.Capabilities { return driver.Capabilities{} }

func rows(ids ...string) []Row {
	var out []Row
	for i, id := range ids {
		r := Row{Seq: int64(i + 1), Msg: driver.Message{ID: id}}
		if id == "bad" {
			r.Err = &BadRowError{Queue: "q", Seq: r.Seq, Reason: "test"}
		}
		out = append(out, r)
	}
	return out
}

// TestRelayBadRowInOrder: the rows before a bad one are published before
// it is moved aside, and the rows after it follow: order holds, nothing
// is held up.
func TestRelayBadRowInOrder(t *testing.T) {
	src := &fakeSource{rows: map[string][]Row{"q": rows("a", "b", "bad", "c")}, held: map[string]bool{}}
	tgt := &fakeTarget{}
	r, err := New(Config{Source: src, Target: tgt, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tgt.ids, []string{"a", "b", "c"}) || !slices.Equal(src.aside, []int64{3}) {
		t.Errorf("published %v, aside %v; want a b c, and row 3 aside", tgt.ids, src.aside)
	}
	if !slices.Equal(src.events, []string{"delete", "aside", "delete"}) {
		t.Errorf("events %v, want delete (a, b), aside, delete (c)", src.events)
	}
}

// TestRelayTargetDown: rows the target did not confirm are not deleted,
// and are published once it is back.
func TestRelayTargetDown(t *testing.T) {
	src := &fakeSource{rows: map[string][]Row{"q": rows("a", "b")}, held: map[string]bool{}}
	tgt := &fakeTarget{fail: true}
	r, err := New(Config{Source: src, Target: tgt, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Once(context.Background()); err == nil {
		t.Fatal("Once with the target down: no error")
	}
	if len(src.rows["q"]) != 2 || src.held["q"] {
		t.Fatalf("after a failed publish: %d rows left (want 2), lease held %v (want released)", len(src.rows["q"]), src.held["q"])
	}
	tgt.fail = false
	if _, err := r.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tgt.ids, []string{"a", "b"}) || len(src.rows["q"]) != 0 {
		t.Errorf("published %v with %d rows left; want a b and none", tgt.ids, len(src.rows["q"]))
	}
}

// TestRelayHeldQueueSkipped: a queue another relay holds is left alone.
func TestRelayHeldQueueSkipped(t *testing.T) {
	src := &fakeSource{rows: map[string][]Row{"q": rows("a")}, held: map[string]bool{"q": true}}
	tgt := &fakeTarget{}
	r, _ := New(Config{Source: src, Target: tgt})
	if n, err := r.Once(context.Background()); n != 0 || err != nil || len(tgt.ids) != 0 {
		t.Errorf("Once on a held queue: %d, %v, published %v; want nothing", n, err, tgt.ids)
	}
}

// TestConfigRefused: a Config missing its Source or Target, or with a bad
// Batch, is refused naming the field.
func TestConfigRefused(t *testing.T) {
	for _, cfg := range []Config{{}, {Source: &fakeSource{}}, {Source: &fakeSource{}, Target: &fakeTarget{}, Batch: -1}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
}
