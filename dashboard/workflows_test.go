package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// hostileText has markup and terminal controls, for the workflows' tests.
const hostileText = "<script>window.__xss=1</script>\x1b[2J\u202e\"><img src=x onerror=\"window.__xss=2\">"

// enqueueFlow enqueues a → b, and c → d, with c failing for good (so d
// is dead-lettered dependency_failed), named name; it returns its ID.
func enqueueFlow(t *testing.T, f *fixture, name string) string {
	t.Helper()
	w := ap.NewWorkflow(name).
		Add("a", &ap.Job{Type: "ok.email", Queue: "flows"}).
		Add("b", &ap.Job{Type: "ok.sms", Queue: "flows"}, "a").
		Add("c", &ap.Job{Type: "fail.email", Queue: "flows"}).
		Add("d", &ap.Job{Type: "ok.email", Queue: "flows"}, "c")
	if err := f.p.EnqueueWorkflow(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	return w.ID
}

// noMarkup fails the test when the page holds markup or controls that
// are not the dashboard's own.
func noMarkup(t *testing.T, p, body string) {
	t.Helper()
	if n := strings.Count(body, "<script"); n != 1 || strings.Contains(body, "<img") || strings.Contains(body, `onerror="`) ||
		strings.Contains(body, "\x1b") || strings.Contains(body, "\u202e") {
		t.Errorf("%s: markup or controls from the store reached the page:\n%s", p, body)
	}
}

// The workflow page lists a workflow's steps with their states, reasons,
// dependencies and jobs; its name, from the store, is text; an unknown
// or missing ID is refused.
func TestWorkflowPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"flows"}})
	id := enqueueFlow(t, f, "nightly "+hostileText)
	deadline := time.Now().Add(time.Minute) // a safety net, not an assertion on time
	for {
		st, err := f.p.WorkflowStatus(context.Background(), id)
		if err == nil && st.Done() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workflow %s: %+v, %v; want done", id, st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c := newClient(t, f)
	p := "/workflow?id=" + id
	resp, body := c.get(p)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d", p, resp.StatusCode)
	}
	if err := contains(body, `id="workflow-state">ended, not every step succeeded`, "nightly &lt;script&gt;window.__xss=1&lt;/script&gt;",
		`<td class="step-state">succeeded</td>`, "(dependency_failed)", "(permanent)", `<td class="mono step-deps">c</td>`,
		"/job?id="+url.QueryEscape(id+".d.0")); err != nil {
		t.Errorf("%s: %v\n%s", p, err, body)
	}
	if n := strings.Count(body, `<tr class="step">`); n != 4 {
		t.Errorf("%s: %d steps, want 4", p, n)
	}
	noMarkup(t, p, body)
	for p, want := range map[string]int{
		"/workflow": http.StatusBadRequest,
		"/workflow?id=" + strings.Repeat("0", 32):  http.StatusNotFound,
		"/workflow?id=" + url.QueryEscape("<x>"):   http.StatusNotFound,
		"/workflow?id=" + url.QueryEscape(id+"/s"): http.StatusNotFound,
	} {
		if resp, body := c.get(p); resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", p, resp.StatusCode, want)
		} else {
			noMarkup(t, p, body)
		}
	}
}

// A step record is whatever its writer wrote to the store: one forged
// with markup and terminal controls in its state, reason and dependencies
// is text on the workflow page, and its reason picks no CSS class outside
// the fixed list.
func TestForgedWorkflowRecord(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"flows"}, noStart: true})
	id := enqueueFlow(t, f, "plain")
	s, err := driver.StoreOf(f.backend)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := kv.Workflows.Prefix() + id + "/s/b"
	raw, rev, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	rec["state"] = "succeeded" + hostileText
	rec["reason"] = "x danger " + hostileText
	rec["deps"] = []string{"a" + hostileText}
	forged, _ := json.Marshal(rec)
	if _, err := s.Update(ctx, key, forged, rev, 0); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, f)
	p := "/workflow?id=" + id
	resp, body := c.get(p)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d\n%s", p, resp.StatusCode, body)
	}
	noMarkup(t, p, body)
	if strings.Contains(body, "reason-x") {
		t.Errorf("%s: the forged reason picked a class:\n%s", p, body)
	}
	if !strings.Contains(body, "x danger &lt;script&gt;") {
		t.Errorf("%s: the forged reason is not shown as text:\n%s", p, body)
	}
}
