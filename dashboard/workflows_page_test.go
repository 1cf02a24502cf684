package dashboard_test

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/dashboard"
)

var nextSteps = regexp.MustCompile(`href="([^"]*)" id="next-steps"`)

// The workflow page of a large workflow reads and shows a page of its
// steps: at most WorkflowPageSteps, fewer when their records reach the
// platform's page byte bound (it says so), with a link to the next page;
// the pages together show every step once; a step's dependencies past
// MaxDepsShown are counted, not listed.
func TestWorkflowPageBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"flows"}, noStart: true})
	const n = 250
	payload := bytes.Repeat([]byte("x"), 40<<10) // a record of about 55 KiB
	w := ap.NewWorkflow("big")
	var all []string
	for i := range n - 1 {
		name := fmt.Sprintf("s%03d", i)
		w.Add(name, &ap.Job{Type: "ok.email", Queue: "idle", Payload: payload})
		all = append(all, name)
	}
	w.Add("last", &ap.Job{Type: "ok.email", Queue: "idle"}, all...)
	if err := f.p.EnqueueWorkflow(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, f)
	p := "/workflow?id=" + w.ID
	rows, pages := 0, 0
	for p != "" {
		pages++
		if pages > n {
			t.Fatalf("more than %d pages", n)
		}
		resp, body := c.get(p)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d\n%s", p, resp.StatusCode, body)
		}
		k := strings.Count(body, `<tr class="step">`)
		if k == 0 || k > dashboard.WorkflowPageSteps {
			t.Fatalf("%s: %d steps, want 1 to %d", p, k, dashboard.WorkflowPageSteps)
		}
		if pages == 1 {
			if k >= dashboard.WorkflowPageSteps || !strings.Contains(body, "the page was cut at") {
				t.Errorf("%s: %d steps of about 55 KiB, want fewer than %d and a word that the page was cut:\n%s", p, k, dashboard.WorkflowPageSteps, body)
			}
			if err := contains(body, `id="workflow-steps">250<`, "see the steps"); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}
		rows += k
		p = ""
		if m := nextSteps.FindStringSubmatch(body); m != nil {
			p = html.UnescapeString(m[1])
		} else if !strings.Contains(body, fmt.Sprintf("and %d more", n-1-dashboard.MaxDepsShown)) {
			t.Errorf("the last page does not count the last step's other dependencies:\n%s", body)
		}
	}
	if rows != n {
		t.Errorf("the pages showed %d steps, want %d", rows, n)
	}
	resp, _ := c.get("/workflow?id=" + w.ID + "&offset=x")
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("offset=x: %d, want %d", resp.StatusCode, http.StatusBadRequest)
	}
}
