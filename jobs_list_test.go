package asyncplatform_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// Platform.Jobs lists a tracked queue's jobs by state and type from their
// status records, page by page; JobCounts counts them; jobs of a queue
// that does not track status are in neither.
func TestJobsByState(t *testing.T) {
	ctx := context.Background()
	b, err := memory.New(ctx, memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	p, err := ap.New(b, ap.Config{
		Queues: map[string]ap.QueueConfig{"tracked": {TrackStatus: true}, "untracked": {}},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		j := &ap.Job{Type: "a", Queue: "tracked"}
		if i >= 3 {
			j.Type = "b"
			j.NotBefore = time.Now().Add(time.Hour)
		}
		if err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		if err := p.Enqueue(ctx, &ap.Job{Type: "a", Queue: "untracked"}); err != nil {
			t.Fatal(err)
		}
	}
	var waiting []ap.JobStatus
	cursor := ""
	for {
		pg, err := p.Jobs(ctx, ap.JobsQuery{Queue: "tracked", State: ap.StateWaiting, Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		waiting = append(waiting, pg.Jobs...)
		if pg.Next == "" {
			break
		}
		cursor = pg.Next
	}
	if len(waiting) != 3 {
		t.Fatalf("waiting: %d jobs, want 3: %+v", len(waiting), waiting)
	}
	pg, err := p.Jobs(ctx, ap.JobsQuery{Type: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pg.Jobs) != 2 || pg.Jobs[0].State != ap.StateScheduled {
		t.Fatalf("type b: %+v, want 2 scheduled", pg.Jobs)
	}
	c, err := p.JobCounts(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Complete || len(c.ByQueue) != 1 || c.ByQueue["tracked"][ap.StateWaiting] != 3 || c.ByQueue["tracked"][ap.StateScheduled] != 2 {
		t.Fatalf("JobCounts = %+v", c)
	}
	if _, err := p.Jobs(ctx, ap.JobsQuery{Cursor: "../x"}); !errors.Is(err, ap.ErrBadCursor) {
		t.Fatalf("a made-up cursor: %v, want ErrBadCursor", err)
	}
}
