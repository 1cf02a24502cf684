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
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// waitState waits until the job's status, as other processes read it,
// is want.
func waitState(t *testing.T, f *fixture, id string, want ap.JobState) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // a safety net, not an assertion on time
	for {
		st, err := f.p.Status(context.Background(), id)
		if err == nil && st.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %q: %+v, %v; want %s", id, st, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The jobs page lists a tracked queue's jobs by state with their counts,
// and the job page shows one job by its ID, with a link to its dead
// letter; a hostile ID, type and error are text on both, and a made-up
// cursor or state is refused.
func TestJobsPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, track: true})
	evil := hostileJob()
	good := &ap.Job{Type: "ok.email"}
	later := &ap.Job{Type: "ok.sms", NotBefore: time.Now().Add(time.Hour)}
	f.enqueue("mail", 1, evil, good, later)
	waitState(t, f, evil.ID, ap.StateDeadLettered)
	waitState(t, f, good.ID, ap.StateSucceeded)
	c := newClient(t, f)

	resp, body := c.get("/jobs?q=mail")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/jobs?q=mail: %d", resp.StatusCode)
	}
	if err := contains(body, `id="tracked-only"`, `id="count-succeeded">1<`, `id="count-dead_lettered">1<`, `id="count-scheduled">1<`, `id="count-waiting">0<`); err != nil {
		t.Errorf("/jobs?q=mail: %v\n%s", err, body)
	}
	_, body = c.get("/jobs?q=mail&state=dead_lettered")
	if strings.Count(body, `<tr class="job">`) != 1 || !strings.Contains(body, "/job?id="+url.QueryEscape(evil.ID)) {
		t.Errorf("dead_lettered: not the one job, linked:\n%s", body)
	}
	_, body = c.get("/jobs?q=mail&state=scheduled&type=ok.sms")
	if strings.Count(body, `<tr class="job">`) != 1 || !strings.Contains(body, later.ID) {
		t.Errorf("scheduled ok.sms: not the one job:\n%s", body)
	}
	_, body = c.get("/job?id=" + url.QueryEscape(evil.ID))
	if err := contains(body, `id="state">dead_lettered`, "(permanent)", `id="dead-letter"`, "/letter?id="+url.QueryEscape(evil.ID)+"&amp;q=mail",
		"&lt;script&gt;window.__xss=1&lt;/script&gt;", "onerror=&#34;window.__xss=7"); err != nil {
		t.Errorf("/job of the hostile job: %v\n%s", err, body)
	}
	_, body = c.get("/job?id=" + url.QueryEscape(good.ID))
	if err := contains(body, `id="state">succeeded`, `id="tries">1 (0 failed`); err != nil || strings.Contains(body, `id="dead-letter"`) {
		t.Errorf("/job of a succeeded job: %v\n%s", err, body)
	}
	for _, p := range []string{"/jobs?q=mail", "/jobs", "/jobs?q=mail&state=dead_lettered", "/job?id=" + url.QueryEscape(evil.ID), "/job?id=" + url.QueryEscape("<script>nope")} {
		_, body := c.get(p)
		if n := strings.Count(body, "<script"); n != 1 {
			t.Errorf("%s: %d <script tags, want 1 (the dashboard's own)", p, n)
		}
		if strings.Contains(body, "<img") || strings.Contains(body, `onerror="`) {
			t.Errorf("%s: markup from the record reached the page", p)
		}
	}
	for p, want := range map[string]int{
		"/job?id=" + url.QueryEscape("<script>nope"): http.StatusNotFound,
		"/job":                            http.StatusBadRequest,
		"/jobs?q=mail&cursor=..%2Fx":      http.StatusBadRequest,
		"/jobs?q=mail&state=%3Cscript%3E": http.StatusBadRequest,
		"/jobs?q=%3Cscript%3E":            http.StatusBadRequest,
	} {
		if resp, _ := c.get(p); resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", p, resp.StatusCode, want)
		}
	}
}

// A status record is whatever its writer wrote to the store: a forged one
// with markup and terminal controls in every field is text on both pages,
// its queue is linked nowhere (it is not a queue name), and its reason
// picks no CSS class outside the fixed list.
func TestForgedStatusRecord(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, track: true, noStart: true})
	s, err := driver.StoreOf(f.backend)
	if err != nil {
		t.Fatal(err)
	}
	const bad = "<script>window.__xss=1</script>\x1b[2J\u202e\"><img src=x onerror=\"x\">"
	rec := map[string]any{"id": "forged" + bad, "queue": "q" + bad, "type": "t" + bad, "state": "dead_lettered",
		"reason": "x danger " + bad, "error": "e" + bad, "worker": "w" + bad, "updated_at": time.Now(),
		"history": map[string]any{"dropped": 7, "changes": []map[string]any{
			{"state": "retrying", "at": time.Now(), "try": 1, "reason": "r" + bad},
			{"state": "dead_lettered", "at": time.Now(), "try": 2, "reason": "x danger " + bad},
			{"state": "running" + bad, "at": time.Now()}, // not a state: dropped, counted
			{"state": "running", "at": "<b>" + bad},      // not a time: dropped, counted
		}}}
	v, _ := json.Marshal(rec)
	if _, err := s.Create(context.Background(), kv.Status.Prefix()+"job/forged", v, 0); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, f)
	for _, p := range []string{"/jobs", "/jobs?state=dead_lettered", "/job?id=forged"} {
		resp, body := c.get(p)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
		if n := strings.Count(body, "<script"); n != 1 || strings.Contains(body, "<img") || strings.Contains(body, "\x1b") || strings.Contains(body, "\u202e") {
			t.Errorf("%s: markup or controls from the record reached the page:\n%s", p, body)
		}
		if strings.Contains(body, "reason-x") || strings.Contains(body, "jobs?q=q") || strings.Contains(body, `id="dead-letter"`) {
			t.Errorf("%s: the forged reason picked a class, or the forged queue a link:\n%s", p, body)
		}
		if p == "/job?id=forged" {
			if n := strings.Count(body, `<tr class="change">`); n != 2 || !strings.Contains(body, "9 earlier changes not kept") {
				t.Errorf("%s: %d changes shown; want the 2 valid ones, and 9 dropped (7 + 2 invalid):\n%s", p, n, body)
			}
		}
	}
}

// An untracked queue's waiting jobs are read from the broker and the page
// says so; a message forged on the broker (a valid envelope whose ID and
// type carry markup and terminal controls) is shown escaped, and one
// that is not a job is skipped and counted.
func TestJobsFromBroker(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, noStart: true})
	ctx := context.Background()
	if err := f.p.Enqueue(ctx, &ap.Job{Type: "ok.a", Queue: "mail"}); err != nil {
		t.Fatal(err)
	}
	const bad = "<script>window.__xss=1</script>\x1b[2J\u202e\"><img src=x onerror=\"x\">"
	forged := wire.EncodeJob(&wire.Job{ID: "forged" + bad, Type: "t" + bad, Errors: []string{"e" + bad}, Failures: 1})
	if err := f.backend.Enqueue(ctx, "mail", []driver.Message{
		{ID: "forged", Body: forged},
		{ID: "junk", Body: []byte("<b>not a job</b>")},
	}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, f)
	resp, body := c.get("/jobs?q=mail&state=waiting")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/jobs: %d\n%s", resp.StatusCode, body)
	}
	if !strings.Contains(body, `data-source="broker"`) || !strings.Contains(body, "From the broker") {
		t.Errorf("the page does not say it read the broker:\n%s", body)
	}
	if n := strings.Count(body, `<tr class="job">`); n != 2 {
		t.Errorf("%d jobs listed, want 2 (the enqueued and the forged one):\n%s", n, body)
	}
	if !strings.Contains(body, `id="jobs-unreadable"`) {
		t.Errorf("the message that is not a job is not counted:\n%s", body)
	}
	if n := strings.Count(body, "<script"); n != 1 || strings.Contains(body, "<img") || strings.Contains(body, "\x1b") || strings.Contains(body, "\u202e") || strings.Contains(body, "<b>not") {
		t.Errorf("markup or controls from the broker reached the page:\n%s", body)
	}
	resp, body = c.get("/jobs?q=mail&state=waiting&source=status")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `data-source="status"`) || strings.Contains(body, `<tr class="job">`) {
		t.Errorf("source=status: %d, want the status records (none):\n%s", resp.StatusCode, body)
	}
	if resp, _ := c.get("/jobs?q=mail&state=waiting&cursor=o-1"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a made-up broker cursor: %d, want 400", resp.StatusCode)
	}
	if resp, _ := c.get("/jobs?q=mail&source=elsewhere"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("an unknown source: %d, want 400", resp.StatusCode)
	}
}
