package dashboard_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// The schedules page lists every schedule run on the backend, with its
// spec, job type and queue (linked), catch-up and ticks; a hostile job
// type is text.
func TestSchedulesPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	c := newClient(t, f)
	if _, body := c.get("/schedules"); !strings.Contains(body, `id="no-schedules"`) {
		t.Errorf("no schedule yet: the page does not say so:\n%s", body)
	}
	for _, s := range []ap.Schedule{
		{Name: "reports.daily", Cron: "0 30 9 * * *", CatchUp: 2, Job: ap.Job{Type: hostileType, Queue: "mail"}},
		{Name: "cleanup", Every: time.Hour, Job: ap.Job{Type: "ok.email", Queue: "mail"}},
	} {
		if err := f.p.Schedule(s); err != nil {
			t.Fatal(err)
		}
	}
	waitSchedules(t, f, 2)
	resp, body := c.get("/schedules")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/schedules: %d", resp.StatusCode)
	}
	if n := strings.Count(body, `<tr class="schedule">`); n != 2 {
		t.Errorf("%d schedules listed, want 2:\n%s", n, body)
	}
	if err := contains(body, "reports.daily", "0 30 9 * * *", "every 1h0m0s", `<a href="/queue?q=mail">mail</a>`, "&lt;script&gt;window.__xss=1&lt;/script&gt;"); err != nil {
		t.Errorf("/schedules: %v\n%s", err, body)
	}
	if n := strings.Count(body, "<script"); n != 1 || strings.Contains(body, "<img") {
		t.Errorf("/schedules: markup from a schedule reached the page")
	}
}

// waitSchedules waits until n schedules are published.
func waitSchedules(t *testing.T, f *fixture, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) { // a safety net, not an assertion on time
		if list, _ := f.p.Schedules(context.Background()); len(list) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the schedules were never published")
		}
	}
}
