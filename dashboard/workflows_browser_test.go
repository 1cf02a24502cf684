package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// In a browser, under the dashboard's Content-Security-Policy and without
// it, the workflow page shows a hostile workflow name and a forged step
// record (state, reason, dependencies) as text, no script of the store
// runs, and a step's job link leads to its job page.
func TestBrowserWorkflowPage(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	f := newFixture(t, fixtureOptions{queues: []string{"flows"}, noStart: true})
	name := "nightly " + hostileText
	id := enqueueFlow(t, f, name)
	s, err := driver.StoreOf(f.backend)
	if err != nil {
		t.Fatal(err)
	}
	key := kv.Workflows.Prefix() + id + "/s/b"
	raw, rev, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	rec["reason"] = "x " + hostileText
	rec["deps"] = []string{"a" + hostileText}
	forged, _ := json.Marshal(rec)
	if _, err := s.Update(context.Background(), key, forged, rev, 0); err != nil {
		t.Fatal(err)
	}
	noCSP := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.d.ServeHTTP(stripCSP{w}, r)
	}))
	defer noCSP.Close()
	for _, base := range []string{f.base, noCSP.URL} {
		csp := base == f.base
		do(t, ctx, chromedp.Navigate(base+"/workflow?id="+id), chromedp.WaitVisible(chromedp.CSS("#steps")))
		checkNoScriptRan(t, ctx, csp)
		if got := text(t, ctx, "#workflow-id"); got != id {
			t.Errorf("workflow ID %q, want %q", got, id)
		}
		if got := eval[int](t, ctx, `document.querySelectorAll("#steps tr.step").length`); got != 4 {
			t.Errorf("%d steps shown, want 4", got)
		}
		if got := eval[string](t, ctx, `document.querySelectorAll("#steps tr.step .step-deps")[1].textContent`); got == "" || got[0] != 'a' {
			t.Errorf("the forged dependency shows as %q, want its text", got)
		}
		do(t, ctx, chromedp.Click(chromedp.CSS("#steps tr.step a.step-job")), chromedp.WaitVisible(chromedp.CSS("main")))
		checkNoScriptRan(t, ctx, csp)
	}
}
