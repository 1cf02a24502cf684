package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	ap "github.com/asyncplatform/asyncplatform"
)

// TestWorkflowShowPaged: workflow show reads a page of a large workflow's
// steps (at most --limit, 100 by default), says which it shows and the
// next page's --offset, and does not claim a state for the whole
// workflow; the pages together show every step.
func TestWorkflowShowPaged(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	ctx := context.Background()
	b, err := ap.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	p, err := ap.New(b, ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	const n = 150
	w := ap.NewWorkflow("wide")
	for i := range n {
		w.Add(fmt.Sprintf("s%03d", i), &ap.Job{Type: "t", Queue: "flows"})
	}
	if err := p.EnqueueWorkflow(ctx, w); err != nil {
		t.Fatal(err)
	}
	steps := func(out string) int { return strings.Count(out, " enqueued ") }

	out := mustCtl(t, exitOK, "", "--url", url, "workflow", "show", w.ID)
	if got := steps(out); got != ap.MaxWorkflowPageSteps {
		t.Errorf("first page: %d steps, want %d:\n%s", got, ap.MaxWorkflowPageSteps, out)
	}
	for _, want := range []string{"Steps:     150 steps; 1 to 100 shown", "State:     see the steps", "more steps: asyncctl workflow show " + w.ID + " --offset 100"} {
		if !strings.Contains(out, want) {
			t.Errorf("first page: no %q in:\n%s", want, out)
		}
	}
	out = mustCtl(t, exitOK, "", "--url", url, "workflow", "show", w.ID, "--offset", "100")
	if got := steps(out); got != n-100 || strings.Contains(out, "more steps") || !hasRow(out, "s149 enqueued 0 - - "+w.ID+".s149.0") {
		t.Errorf("second page: %d steps, want %d and no further page:\n%s", got, n-100, out)
	}
	out = mustCtl(t, exitOK, "", "--url", url, "--json", "workflow", "show", w.ID, "--limit", "7")
	var pg ap.WorkflowPage
	if err := json.Unmarshal([]byte(out), &pg); err != nil || len(pg.Steps) != 7 || pg.Total != n || pg.Next != 7 {
		t.Errorf("--json --limit 7: %d steps, total %d, next %d, %v; want 7, %d, 7", len(pg.Steps), pg.Total, pg.Next, err, n)
	}
	mustCtl(t, exitUsage, "", "--url", url, "workflow", "show", w.ID, "--limit", "500")
	mustCtl(t, exitUsage, "", "--url", url, "workflow", "show", w.ID, "--offset", "-1")
	// An offset at or past the last step shows no page ("151 to 150 shown").
	mustCtl(t, exitUsage, "", "--url", url, "workflow", "show", w.ID, "--offset", "150")
}
