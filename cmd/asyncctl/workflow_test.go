package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// enqueueWorkflow enqueues a → b (and c, depending on nothing) on the
// backend at url, with no worker: a and c are enqueued, b waits. It
// returns the workflow's ID and the backend's store.
func enqueueWorkflow(t *testing.T, url, name string) (string, driver.Store) {
	t.Helper()
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
	w := ap.NewWorkflow(name).
		Add("a", &ap.Job{Type: "t", Queue: "flows"}).
		Add("b", &ap.Job{Type: "t", Queue: "flows"}, "a").
		Add("c", &ap.Job{Type: "t", Queue: "flows"})
	if err := p.EnqueueWorkflow(ctx, w); err != nil {
		t.Fatal(err)
	}
	st, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return w.ID, st
}

// TestWorkflowShowCancel: workflow show prints each step's state and
// dependencies; cancel marks the workflow, and its waiting step shows
// cancelled; an unknown ID exits 3, a missing one 2.
func TestWorkflowShowCancel(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	id, _ := enqueueWorkflow(t, url, "nightly")
	out := mustCtl(t, exitOK, "", "--url", url, "workflow", "show", id)
	for _, want := range []string{"Name:      nightly", "State:     running", "3 steps (1 waiting, 2 enqueued)"} {
		if !strings.Contains(out, want) {
			t.Errorf("workflow show: no %q in:\n%s", want, out)
		}
	}
	for _, row := range []string{"STEP STATE ATTEMPT DEPENDS ON RESULT JOB", "a enqueued 0 - - " + id + ".a.0",
		"b waiting 0 a - " + id + ".b.0", "c enqueued 0 - - " + id + ".c.0"} {
		if !hasRow(out, row) {
			t.Errorf("workflow show: no row %q in:\n%s", row, out)
		}
	}
	var st ap.WorkflowStatus
	if err := json.Unmarshal([]byte(mustCtl(t, exitOK, "", "--url", url, "--json", "workflow", "show", id)), &st); err != nil || len(st.Steps) != 3 || st.ID != id {
		t.Errorf("workflow show --json: %+v, %v", st, err)
	}
	mustCtl(t, exitNotFound, "", "--url", url, "workflow", "show", strings.Repeat("0", 32))
	mustCtl(t, exitNotFound, "", "--url", url, "workflow", "show", "not-an-id")
	mustCtl(t, exitNotFound, "", "--url", url, "workflow", "cancel", strings.Repeat("0", 32))
	mustCtl(t, exitUsage, "", "--url", url, "workflow", "show")

	if out := mustCtl(t, exitOK, "", "--url", url, "workflow", "cancel", id); !strings.Contains(out, "cancel requested for workflow "+id) {
		t.Errorf("workflow cancel: %s", out)
	}
	mustCtl(t, exitOK, "", "--url", url, "workflow", "cancel", id) // twice: not an error
	out = mustCtl(t, exitOK, "", "--url", url, "workflow", "show", id)
	if !strings.Contains(out, "State:     running, cancelled") || !hasRow(out, "b cancelled 0 a - "+id+".b.0") {
		t.Errorf("workflow show after cancel:\n%s", out)
	}
}

// hasRow says whether a line of out has the words of row.
func hasRow(out, row string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.Join(strings.Fields(l), " ") == row {
			return true
		}
	}
	return false
}

// TestWorkflowShowHostile: a workflow's name and a step record forged in
// the store (state, reason, dependencies) reach the terminal escaped.
func TestWorkflowShowHostile(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	id, store := enqueueWorkflow(t, url, "evil\x1b[2J\nName:      forged")
	ctx := context.Background()
	key := "_workflow/" + id + "/s/b"
	raw, rev, err := store.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	rec["state"] = "succeeded\x1b]0;pwned\x07"
	rec["reason"] = "x\r\nSTEP  forged"
	rec["deps"] = []string{"a\x1b[31m"}
	forged, _ := json.Marshal(rec)
	if _, err := store.Update(ctx, key, forged, rev, 0); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ctl(t, "", "--url", url, "workflow", "show", id)
	if code != exitOK {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	if strings.ContainsAny(out, "\x1b\x07\r") || strings.Contains(out, "\nName:      forged") || strings.Contains(out, "\nSTEP  forged") {
		t.Errorf("a stored string reached the terminal raw:\n%q", out)
	}
}
