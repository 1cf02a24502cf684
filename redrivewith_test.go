package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// listCounter counts the backend's ListDead calls.
type listCounter struct {
	driver.Backend
	lists atomic.Int32
}

func (l *listCounter) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	l.lists.Add(1)
	return l.Backend.ListDead(ctx, queue, cursor, limit)
}

// deadPlatform starts a platform over a listCounter whose handler fails each
// job once (Invalid), and waits for n dead letters.
func deadPlatform(t *testing.T, n int) (*Platform, *listCounter) {
	t.Helper()
	lc := &listCounter{Backend: memory.NewBroker().Connect()}
	p, err := New(lc, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	var failed sync.Map
	if err := p.Handle("t", func(_ context.Context, j *Job) error {
		if _, again := failed.LoadOrStore(j.ID, true); again {
			return nil
		}
		return Invalid(errors.New("first try"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
	})
	ctx := context.Background()
	for i := range n {
		if err := p.Enqueue(ctx, &Job{ID: fmt.Sprintf("j%d", i), Type: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the dead letters", func() bool {
		pg, _ := p.DeadLetters(ctx, DefaultQueue, "", 1000)
		return len(pg.Letters) == n
	})
	return p, lc
}

// TestRedriveWithListsOnce redrives 30 records in chunks of 4: one listing
// of the dead-letter queue for all eight chunks, and a progress call after
// each one.
func TestRedriveWithListsOnce(t *testing.T) {
	p, lc := deadPlatform(t, 30)
	lc.lists.Store(0)
	var progress []int
	n, err := p.RedriveWith(context.Background(), DefaultQueue, RedriveOptions{
		Chunk:    4,
		Progress: func(done int) error { progress = append(progress, done); return nil },
	})
	if err != nil || n != 30 {
		t.Fatalf("RedriveWith = %d, %v; want 30", n, err)
	}
	if got := lc.lists.Load(); got != 1 {
		t.Errorf("RedriveWith listed the dead-letter queue %d times, want once", got)
	}
	want := []int{4, 8, 12, 16, 20, 24, 28, 30}
	if fmt.Sprint(progress) != fmt.Sprint(want) {
		t.Errorf("progress calls %v, want %v", progress, want)
	}
}

// TestRedriveWithStops stops a redrive from its progress callback after the
// first chunk: its error comes back, and the other records stay dead.
func TestRedriveWithStops(t *testing.T) {
	p, _ := deadPlatform(t, 10)
	stop := errors.New("stop")
	ctx := context.Background()
	n, err := p.RedriveWith(ctx, DefaultQueue, RedriveOptions{
		Chunk:    3,
		Progress: func(int) error { return stop },
	})
	if n != 3 || !errors.Is(err, stop) {
		t.Fatalf("RedriveWith = %d, %v; want 3 and the callback's error", n, err)
	}
	pg, err := p.DeadLetters(ctx, DefaultQueue, "", 1000)
	if err != nil || len(pg.Letters) != 7 {
		t.Fatalf("%d dead letters left (%v), want 7", len(pg.Letters), err)
	}
	if _, err := p.RedriveWith(ctx, DefaultQueue, RedriveOptions{Chunk: -1}); err == nil {
		t.Error("RedriveWith took a negative Chunk")
	}
}
