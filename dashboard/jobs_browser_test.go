package dashboard_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/chromedp/chromedp"

	ap "github.com/asyncplatform/asyncplatform"
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
	}
}
