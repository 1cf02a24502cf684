package dashboard_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	ap "github.com/asyncplatform/asyncplatform"
)

// An offset at or past a workflow's last step shows no page of steps
// ("Steps 51 to 50 of 3"): it is refused, and names the workflow's steps.
func TestWorkflowPageOffsetPastSteps(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"flows"}, noStart: true})
	w := ap.NewWorkflow("small")
	w.Add("a", &ap.Job{Type: "ok.email", Queue: "idle"})
	w.Add("b", &ap.Job{Type: "ok.email", Queue: "idle"}, "a")
	if err := f.p.EnqueueWorkflow(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, f)
	for _, off := range []string{"2", "50"} {
		resp, body := c.get("/workflow?id=" + w.ID + "&offset=" + off)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "2 steps") {
			t.Errorf("offset=%s of 2 steps: %d, want %d naming the 2 steps:\n%s", off, resp.StatusCode, http.StatusBadRequest, body)
		}
	}
	if resp, body := c.get("/workflow?id=" + w.ID + "&offset=1"); resp.StatusCode != http.StatusOK || strings.Count(body, `<tr class="step">`) != 1 {
		t.Errorf("offset=1 of 2 steps: %d, want %d with one step:\n%s", resp.StatusCode, http.StatusOK, body)
	}
}
