package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/asyncplatform/asyncplatform/driver"
)

// sizingStore counts the bytes of the values its GetEach returns.
type sizingStore struct {
	*fakeStore
	read atomic.Int64
}

func (s *sizingStore) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	rs, err := s.fakeStore.GetEach(ctx, keys)
	for _, r := range rs {
		s.read.Add(int64(len(r.Value)))
	}
	return rs, err
}

// A page of a workflow's state reads at most its step limit and, past
// its byte budget, at most pageChunk more records; the pages from offset
// 0 by Next hold every step once, in order, and Total counts them all.
func TestStatusPageBounded(t *testing.T) {
	t.Parallel()
	s := &sizingStore{fakeStore: newFake()}
	q := &queue{}
	e := New(Config{Store: s, Enqueue: q.enqueue})
	job, err := json.Marshal(strings.Repeat("x", 60<<10))
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	steps := make([]Spec, n)
	for i := range steps {
		steps[i] = Spec{Name: fmt.Sprintf("s%03d", i), Job: job}
	}
	const id = "0123456789abcdef0123456789abcdef"
	ctx := context.Background()
	if err := e.Create(ctx, id, "big", steps); err != nil {
		t.Fatal(err)
	}
	const budget = 1 << 20
	limit := driver.MaxValueLen + 1 // a record is at most that
	var names []string
	for offset, pages := 0, 0; ; pages++ {
		if pages > n {
			t.Fatalf("more than %d pages", n)
		}
		s.read.Store(0)
		st, err := e.StatusPage(ctx, id, offset, 200, budget)
		if err != nil {
			t.Fatal(err)
		}
		if got, most := s.read.Load(), int64(budget+pageChunk*limit); got > most {
			t.Errorf("page at %d read %d bytes of step records, want at most %d (budget %d plus %d records)", offset, got, most, budget, pageChunk)
		}
		if st.Total != n || st.Offset != offset || len(st.Steps) == 0 || len(st.Steps) > 200 {
			t.Fatalf("page at %d: total %d, offset %d, %d steps", offset, st.Total, st.Offset, len(st.Steps))
		}
		for _, r := range st.Steps {
			names = append(names, r.Name)
		}
		if st.Next == 0 {
			break
		}
		if st.Next != offset+len(st.Steps) {
			t.Fatalf("page at %d of %d steps: next %d", offset, len(st.Steps), st.Next)
		}
		offset = st.Next
	}
	if len(names) != n {
		t.Fatalf("the pages held %d steps, want %d", len(names), n)
	}
	for i, name := range names {
		if want := steps[i].Name; name != want {
			t.Fatalf("step %d is %q, want %q", i, name, want)
		}
	}
	st, err := e.StatusPage(ctx, id, 290, 5, 0)
	if err != nil || len(st.Steps) != 5 || st.Next != 295 || st.Steps[0].Name != "s290" {
		t.Errorf("page of 5 at 290: %d steps, next %d, %v; want 5 from s290, next 295", len(st.Steps), st.Next, err)
	}
	st, err = e.StatusPage(ctx, id, 5000, 5, 0)
	if err != nil || len(st.Steps) != 0 || st.Next != 0 {
		t.Errorf("page past the end: %d steps, next %d, %v; want none", len(st.Steps), st.Next, err)
	}
}

// BenchmarkStatusPage compares the read of every step (Status) with one
// page (StatusPage at 4 MiB, the platform's MaxWorkflowPageBytes) on a
// workflow of 1,000 steps of about 60 KiB each; bytes_read/op is what the
// store returned.
func BenchmarkStatusPage(b *testing.B) {
	s := &sizingStore{fakeStore: newFake()}
	e := New(Config{Store: s, Enqueue: (&queue{}).enqueue})
	job, _ := json.Marshal(strings.Repeat("x", 60<<10))
	steps := make([]Spec, 1000)
	for i := range steps {
		steps[i] = Spec{Name: fmt.Sprintf("s%04d", i), Job: job}
	}
	const id = "0123456789abcdef0123456789abcdef"
	if err := e.Create(context.Background(), id, "big", steps); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		read func() error
	}{
		{"Whole", func() error { _, err := e.Status(context.Background(), id); return err }},
		{"Page", func() error { _, err := e.StatusPage(context.Background(), id, 0, 100, 4<<20); return err }},
	} {
		b.Run(c.name, func(b *testing.B) {
			s.read.Store(0)
			for b.Loop() {
				if err := c.read(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(s.read.Load())/float64(b.N), "bytes_read/op")
		})
	}
}
