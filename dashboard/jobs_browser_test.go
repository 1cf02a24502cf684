package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// In a browser, under the dashboard's Content-Security-Policy and without
// it, the jobs page, the job page (reached by the search box and by the
// listing's link) and the schedules page show a hostile job's ID, type and
// error as text, and no script of the record runs.
func TestBrowserJobPages(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, track: true})
	evil := hostileJob()
	f.enqueue("mail", 1, evil)
	waitState(t, f, evil.ID, ap.StateDeadLettered)
	// The schedule fires into a queue of its own, so a tick on the hour
	// cannot add a second dead letter to mail's list.
	if err := f.p.Schedule(ap.Schedule{Name: "evil", Cron: "@hourly", Job: ap.Job{Type: hostileType, Queue: "cron"}}); err != nil {
		t.Fatal(err)
	}
	waitSchedules(t, f, 1)
	forgeHistory(t, f, "forged-history", "r"+hostileError[:strings.IndexByte(hostileError, '\n')])
	// A job forged on the broker, in a queue no worker takes: its page is
	// read from the broker.
	forged := wire.EncodeJob(&wire.Job{ID: "forged" + hostileType, Type: hostileType, Failures: 1, Errors: []string{hostileError}})
	if err := f.backend.Enqueue(context.Background(), "browsed", []driver.Message{{ID: "forged", Body: forged, NotBefore: time.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	noCSP := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.d.ServeHTTP(stripCSP{w}, r)
	}))
	defer noCSP.Close()
	for _, base := range []string{f.base, noCSP.URL} {
		csp := base == f.base
		do(t, ctx, chromedp.Navigate(base+"/jobs?q=mail&state=dead_lettered"), chromedp.WaitVisible(chromedp.CSS("#jobs")))
		checkNoScriptRan(t, ctx, csp)
		if got := text(t, ctx, "#jobs tr.job td.mono a"); got != evil.ID {
			t.Errorf("the ID in the list is %q, want it as text", got)
		}
		do(t, ctx, chromedp.Click(chromedp.CSS("#jobs tr.job td.mono a")), chromedp.WaitVisible(chromedp.CSS("#status")))
		checkNoScriptRan(t, ctx, csp)
		if got := text(t, ctx, "#type"); got != hostileType {
			t.Errorf("type %q, want it as text", got)
		}
		rows := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("#history tr.change")).map(r => Array.from(r.cells).slice(1).map(c => c.textContent.trim()).join("/"))`)
		if want := []string{"waiting/0/", "running/1/", "dead_lettered/1/permanent"}; !slices.Equal(rows, want) {
			t.Errorf("the history table: %q, want %q", rows, want)
		}
		do(t, ctx, chromedp.Navigate(base+"/job?id=forged-history"), chromedp.WaitVisible(chromedp.CSS("#history")))
		checkNoScriptRan(t, ctx, csp)
		if got := text(t, ctx, "#history tr.change td.error"); got != "r"+hostileError[:strings.IndexByte(hostileError, '\n')] {
			t.Errorf("a forged change's reason %q, want it as text", got)
		}
		do(t, ctx, chromedp.Navigate(base+"/jobs?q=mail"), chromedp.WaitVisible(chromedp.CSS("#job-search")),
			chromedp.SendKeys(chromedp.CSS(`#job-search input[name=id]`), evil.ID))
		if status := submit(t, ctx, "#job-search button"); status != http.StatusOK {
			t.Fatalf("the search box: %d", status)
		}
		if got := text(t, ctx, "#job-id"); got != evil.ID {
			t.Errorf("the search box opened %q, want %q", got, evil.ID)
		}
		checkNoScriptRan(t, ctx, csp)
		do(t, ctx, chromedp.Navigate(base+"/job?id="+url.QueryEscape("<script>window.__xss=1</script>")), chromedp.WaitVisible(chromedp.CSS("#error-message")))
		checkNoScriptRan(t, ctx, csp)
		do(t, ctx, chromedp.Navigate(base+"/schedules"), chromedp.WaitVisible(chromedp.CSS("#schedules")))
		checkNoScriptRan(t, ctx, csp)
		do(t, ctx, chromedp.Navigate(base+"/jobs?q=browsed&state=retrying&source=broker"), chromedp.WaitVisible(chromedp.CSS("#jobs")))
		checkNoScriptRan(t, ctx, csp)
		if got := text(t, ctx, "#jobs tr.job td.mono a"); got != "forged"+hostileType {
			t.Errorf("the browsed ID in the list is %q, want it as text", got)
		}
		if got := text(t, ctx, "#jobs-source"); !strings.HasPrefix(got, "From the broker") {
			t.Errorf("the page says %q, want where it read from", got)
		}
	}
}

// forgeHistory writes a status record of job id whose history's retry has
// the given reason, as a writer to the store could.
func forgeHistory(t *testing.T, f *fixture, id, reason string) {
	t.Helper()
	s, err := driver.StoreOf(f.backend)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec := map[string]any{"id": id, "queue": "mail", "type": "t", "state": "retrying", "updated_at": now,
		"history": map[string]any{"changes": []map[string]any{{"state": "retrying", "at": now, "try": 1, "reason": reason}}}}
	v, _ := json.Marshal(rec)
	if _, err := s.Create(context.Background(), kv.Status.Prefix()+"job/"+id, v, time.Hour); err != nil {
		t.Fatal(err)
	}
}
