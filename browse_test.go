package asyncplatform_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// Platform.Jobs reads an untracked queue's waiting, scheduled and retrying
// jobs from the broker (SourceAuto), page by page and by type; a tracked
// queue's from its status records; a message that is not a job is
// skipped and counted, and a cursor it did not make is refused.
func TestJobsFromBroker(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	b := br.Connect()
	t.Cleanup(func() { b.Close() })
	p, err := ap.New(b, ap.Config{
		Queues: map[string]ap.QueueConfig{"tracked": {TrackStatus: true}, "plain": {}},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 7 {
		j := &ap.Job{Type: "a", Queue: "plain"}
		if i >= 5 {
			j.Type, j.NotBefore = "b", time.Now().Add(time.Hour)
		}
		if err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	if err := p.Enqueue(ctx, &ap.Job{Type: "a", Queue: "tracked"}); err != nil {
		t.Fatal(err)
	}
	// A message written straight to the broker, not an envelope.
	if err := b.Enqueue(ctx, "plain", []driver.Message{{ID: "forged", Body: []byte("\x1b[31m<b>not a job</b>")}}); err != nil {
		t.Fatal(err)
	}

	var waiting []ap.JobStatus
	unreadable := 0
	for cursor, pages := "", 0; ; pages++ {
		pg, err := p.Jobs(ctx, ap.JobsQuery{Queue: "plain", State: ap.StateWaiting, Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if pg.Source != ap.SourceBroker {
			t.Fatalf("an untracked queue's waiting jobs read from %q, want the broker", pg.Source)
		}
		waiting, unreadable = append(waiting, pg.Jobs...), unreadable+pg.Unreadable
		if cursor = pg.Next; cursor == "" {
			break
		}
		if pages > 10 {
			t.Fatal("the pages do not end")
		}
	}
	if len(waiting) != 5 || unreadable != 1 {
		t.Fatalf("waiting from the broker: %d jobs and %d unreadable, want 5 and 1 (the forged message): %+v", len(waiting), unreadable, waiting)
	}
	for i, js := range waiting {
		if js.ID != ids[i] || js.State != ap.StateWaiting || js.Type != "a" || js.Queue != "plain" || js.EnqueuedAt.IsZero() {
			t.Errorf("waiting job %d = %+v, want job %s waiting, of type a, in line", i, js, ids[i])
		}
	}

	pg, err := p.Jobs(ctx, ap.JobsQuery{Queue: "plain", State: ap.StateScheduled, Type: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pg.Jobs) != 2 || pg.Jobs[0].RetryAt.IsZero() || pg.Jobs[0].State != ap.StateScheduled {
		t.Fatalf("scheduled of type b: %+v, want 2 scheduled with their due time", pg.Jobs)
	}
	if pg, err := p.Jobs(ctx, ap.JobsQuery{Queue: "plain", State: ap.StateRetrying}); err != nil || len(pg.Jobs) != 0 {
		t.Fatalf("retrying: %+v, %v; want none (no job failed)", pg.Jobs, err)
	}
	if pg, err := p.Jobs(ctx, ap.JobsQuery{Queue: "plain", State: ap.StateScheduled, Type: "a"}); err != nil || len(pg.Jobs) != 0 {
		t.Fatalf("scheduled of type a: %+v, %v; want none", pg.Jobs, err)
	}

	pg, err = p.Jobs(ctx, ap.JobsQuery{Queue: "tracked", State: ap.StateWaiting})
	if err != nil {
		t.Fatal(err)
	}
	if pg.Source != ap.SourceStatus || len(pg.Jobs) != 1 {
		t.Fatalf("a tracked queue: %d jobs from %q, want 1 from the status records", len(pg.Jobs), pg.Source)
	}
	pg, err = p.Jobs(ctx, ap.JobsQuery{Queue: "plain", State: ap.StateWaiting, Source: ap.SourceStatus})
	if err != nil {
		t.Fatal(err)
	}
	if pg.Source != ap.SourceStatus || len(pg.Jobs) != 0 {
		t.Fatalf("an untracked queue from the status records: %+v, want none", pg)
	}

	for _, c := range []string{"../x", "o-1", "\x1b[31m"} {
		_, err := p.Jobs(ctx, ap.JobsQuery{Queue: "plain", State: ap.StateWaiting, Cursor: c})
		var ce *driver.CursorError
		if !errors.Is(err, ap.ErrBadCursor) || !errors.As(err, &ce) {
			t.Errorf("cursor %q: %v, want ErrBadCursor and a *driver.CursorError", c, err)
		}
	}
	for _, q := range []ap.JobsQuery{
		{State: ap.StateWaiting, Source: ap.SourceBroker},
		{Queue: "plain", State: ap.StateSucceeded, Source: ap.SourceBroker},
		{Queue: "plain", Source: "nowhere"},
	} {
		if _, err := p.Jobs(ctx, q); !errors.Is(err, ap.ErrInvalidConfig) {
			t.Errorf("Jobs(%+v) = %v, want ErrInvalidConfig", q, err)
		}
	}

	// The browses changed nothing: a worker runs each job on its first try.
	tries := make(chan int, 10)
	w, err := ap.New(br.Connect(), ap.Config{Queues: map[string]ap.QueueConfig{"plain": {}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("a", func(ctx context.Context, j *ap.Job) error { tries <- j.TryCount; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop(context.Background()) })
	for range 5 {
		select {
		case n := <-tries:
			if n != 1 {
				t.Errorf("a browsed job ran on try %d, want 1", n)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the browsed jobs did not run in 20s")
		}
	}
}

// A backend that cannot browse: Jobs falls back to the status records,
// and refuses SourceBroker with ErrCannotBrowse.
func TestJobsCannotBrowse(t *testing.T) {
	ctx := context.Background()
	b, err := memory.New(ctx, memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	p, err := ap.New(noBrowse{b}, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := p.Jobs(ctx, ap.JobsQuery{Queue: "default", State: ap.StateWaiting})
	if err != nil || pg.Source != ap.SourceStatus {
		t.Fatalf("Jobs = %+v, %v; want a page from the status records", pg, err)
	}
	if _, err := p.Jobs(ctx, ap.JobsQuery{Queue: "default", State: ap.StateWaiting, Source: ap.SourceBroker}); !errors.Is(err, ap.ErrCannotBrowse) {
		t.Fatalf("SourceBroker: %v, want ErrCannotBrowse", err)
	}
}

// noBrowse hides every optional interface of its backend but its store.
type noBrowse struct{ driver.Backend }

func (n noBrowse) Store() (driver.Store, error) { return driver.StoreOf(n.Backend) }
