package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/dashboard"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// chromiumEnv names a Chromium to use instead of the one on PATH.
const chromiumEnv = "ASYNCPLATFORM_CHROMIUM"

// screenshotsEnv names a folder: the browser test saves the screenshots of
// the README there (docs/dashboard-*.png).
const screenshotsEnv = "ASYNCPLATFORM_DASHBOARD_SCREENSHOTS"

// browser starts a headless Chromium of the test's own (scripts/chromium.sh
// installs Debian's) and returns a tab. It skips, or fails with
// ASYNCPLATFORM_REQUIRE_SERVERS, when there is none.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv(chromiumEnv)
	if path == "" {
		var err error
		for _, name := range []string{"chromium", "chromium-browser"} {
			if path, err = exec.LookPath(name); err == nil {
				break
			}
		}
		if err != nil {
			testenv.Unreachable(t, "Chromium (scripts/chromium.sh install)", err)
		}
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	ctx, cancelTime := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelTime(); cancelTab(); cancelAlloc() })
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return ctx
}

// do runs the steps and fails the test on an error.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// submit clicks a button that submits a form and waits for the page that
// answers (after a redirect, the page redirected to); it returns its status.
func submit(t *testing.T, ctx context.Context, sel string) int64 {
	t.Helper()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("submitting %s: %v", sel, err)
	}
	return resp.Status
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("the text of %s: %v", sel, err)
	}
	return s
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

// shot saves a screenshot of the page when screenshotsEnv names a folder.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dashboard-"+name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: timed out", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBrowser drives the dashboard in headless Chromium against the
// machine's Redis, as an operator would.
func TestBrowser(t *testing.T) {
	t.Parallel()
	url := realRedis(t)
	ctx := browser(t)
	f := newFixture(t, fixtureOptions{url: url, queues: []string{"emails", "reports", "xss"}})
	f.broken.Store(true)
	jobs := failing(20) // 10 fail.email, 10 fail.sms
	for i := range 5 {
		jobs = append(jobs, &ap.Job{ID: fmt.Sprintf("flaky-%d", i), Type: "flaky.email", Payload: fmt.Appendf(nil, `{"to":"user%d@example.com","template":"welcome"}`, i),
			Headers: map[string]string{"tenant": "acme", "trace-id": fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e%04d", i)}})
	}
	f.enqueue("emails", 25, jobs...)
	reports := make([]*ap.Job, 6)
	for i := range reports {
		reports[i] = &ap.Job{Type: "invalid.report", Payload: []byte{0xde, 0xad, 0xbe, 0xef, byte(i)}}
	}
	f.enqueue("reports", 6, reports...)
	f.enqueue("xss", 1, hostileJob())
	// Some successes for the charts.
	var oks []*ap.Job
	for range 12 {
		oks = append(oks, &ap.Job{Type: "ok.email"})
	}
	f.enqueue("emails", 25, oks...)
	waitFor(t, "12 successes counted", func() bool {
		_, body := newClient(t, f).get("/")
		return strings.Contains(body, "12 succeeded")
	})

	t.Run("QueueList", func(t *testing.T) {
		do(t, ctx, chromedp.Navigate(f.base+"/"), chromedp.WaitVisible(chromedp.CSS("#queues")))
		for q, dead := range map[string]string{"emails": "25", "reports": "6", "xss": "1"} {
			if got := text(t, ctx, `tr[data-queue="`+q+`"] td.dead`); strings.TrimSpace(got) != dead {
				t.Errorf("queue %s: dead %q, want %s", q, got, dead)
			}
		}
		if got := text(t, ctx, `tr[data-queue="emails"] figcaption`); !strings.Contains(got, "12 succeeded, 0 retried, 25 dead-lettered (67.6 % of the jobs that ended)") {
			t.Errorf("the attempts chart of emails says %q", got)
		}
	})

	t.Run("FilterDeadLetters", func(t *testing.T) {
		do(t, ctx, chromedp.Click(chromedp.CSS(`tr[data-queue="emails"] td a`)), chromedp.WaitVisible(chromedp.CSS("#letters")))
		if n := eval[int](t, ctx, `document.querySelectorAll("#letters tr.letter").length`); n != 25 {
			t.Fatalf("%d rows unfiltered, want 25", n)
		}
		do(t, ctx, chromedp.SendKeys(chromedp.CSS(`#filter input[name=type]`), "flaky.*"),
			chromedp.SetValue(chromedp.CSS(`#filter select[name=reason]`), "permanent"),
			chromedp.SendKeys(chromedp.CSS(`#filter input[name=text]`), "WELCOME"))
		if status := submit(t, ctx, `#filter button`); status != http.StatusOK {
			t.Fatalf("filtering: %d", status)
		}
		if n := eval[int](t, ctx, `document.querySelectorAll("#letters tr.letter").length`); n != 5 {
			t.Fatalf("%d rows match flaky.*, permanent, welcome; want 5", n)
		}
		if got := text(t, ctx, "#listing-info"); !strings.Contains(got, "type flaky.*") {
			t.Errorf("the listing says %q", got)
		}
	})

	t.Run("OpenOne", func(t *testing.T) {
		do(t, ctx, chromedp.Click(chromedp.CSS(`#letters tr.letter td.id a`)), chromedp.WaitVisible(chromedp.CSS("#letter-id")))
		if got := text(t, ctx, "#type"); got != "flaky.email" {
			t.Errorf("type %q", got)
		}
		if got := text(t, ctx, "#last-error"); !strings.Contains(got, "the provider said no\n\tat provider.Send") {
			t.Errorf("last error %q: want the text with its stack", got)
		}
		if got := text(t, ctx, "#payload"); !strings.Contains(got, "\"template\": \"welcome\"") {
			t.Errorf("payload %q: want indented JSON", got)
		}
		if got := text(t, ctx, "#headers"); !strings.Contains(got, "tenant") || !strings.Contains(got, "acme") {
			t.Errorf("headers %q", got)
		}
		if got := text(t, ctx, "#worker"); got != "test-worker" {
			t.Errorf("worker %q", got)
		}
		do(t, ctx, chromedp.Click(chromedp.CSS(`nav.views a:nth-child(4)`)), chromedp.WaitVisible(chromedp.CSS("#payload.view-hex")))
		if got := text(t, ctx, "#payload"); !strings.HasPrefix(got, "00000000  7b 22 74 6f") {
			t.Errorf("hex view %q", got)
		}
	})

	t.Run("RedriveOneAndSeeItRun", func(t *testing.T) {
		id := strings.TrimSpace(text(t, ctx, "#job-id"))
		f.broken.Store(false) // the provider is fixed
		if status := submit(t, ctx, "#redrive-this button"); status != http.StatusOK {
			t.Fatalf("redrive: %d", status)
		}
		if got := text(t, ctx, "#flash"); !strings.Contains(got, "Redrove dead letter") {
			t.Fatalf("flash %q", got)
		}
		deadline := time.Now().Add(20 * time.Second)
		for f.runs(id) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the redriven job %s did not run", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
		f.waitDead("emails", 24)
		// The page shows it ran: one dead letter fewer, 13 successes.
		do(t, ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#depths")))
		if got := text(t, ctx, "#depth-dead"); got != "24" {
			t.Errorf("dead %q after the redrive, want 24", got)
		}
		if got := text(t, ctx, ".charts figcaption"); !strings.Contains(got, "13 succeeded") {
			t.Errorf("attempts chart %q: want the redriven job's success counted", got)
		}
		if n := eval[int](t, ctx, `document.querySelectorAll("#letters tr.letter").length`); n != 4 {
			t.Errorf("%d flaky dead letters listed after the redrive, want 4", n)
		}
	})

	t.Run("DeleteAllMatching", func(t *testing.T) {
		do(t, ctx, chromedp.Navigate(f.base+"/queue?q=emails&type=fail.sms"), chromedp.WaitVisible(chromedp.CSS("#letters")))
		if status := submit(t, ctx, "#delete-matching button"); status != http.StatusOK {
			t.Fatalf("delete matching: %d", status)
		}
		if got := text(t, ctx, "#confirm h1"); got != "Delete 10 dead letters?" {
			t.Fatalf("the confirmation asks %q", got)
		}
		if f.dead("emails") != 24 {
			t.Fatal("the question deleted something")
		}
		if status := submit(t, ctx, "#confirm-button"); status != http.StatusOK {
			t.Fatalf("confirming: %d", status)
		}
		if got := text(t, ctx, "#flash"); !strings.Contains(got, "Deleted 10 of 10 dead letters matching type fail.sms") {
			t.Errorf("flash %q", got)
		}
		for _, dl := range f.deadLetters("emails") {
			if dl.Job.Type == "fail.sms" {
				t.Fatal("a fail.sms dead letter is left")
			}
		}
		if n := f.dead("emails"); n != 14 {
			t.Fatalf("%d dead letters left, want 14 (10 fail.email, 4 flaky.email)", n)
		}
	})

	t.Run("PurgeWithConfirmation", func(t *testing.T) {
		do(t, ctx, chromedp.Navigate(f.base+"/queue?q=reports"), chromedp.WaitVisible(chromedp.CSS("#purge")))
		if !eval[bool](t, ctx, `document.getElementById("purge-button").disabled`) {
			t.Fatal("the purge button is enabled before the name is typed")
		}
		do(t, ctx, chromedp.SendKeys(chromedp.CSS("#purge-confirm"), "report"))
		if !eval[bool](t, ctx, `document.getElementById("purge-button").disabled`) {
			t.Fatal("the purge button is enabled with the wrong name")
		}
		// The server checks too: a wrong name submitted anyway purges nothing.
		do(t, ctx, chromedp.Evaluate[chromedp.Void](`document.getElementById("purge-button").disabled = false`))
		submit(t, ctx, "#purge-button")
		if got := text(t, ctx, "#flash"); !strings.Contains(got, "Nothing was purged") || f.dead("reports") != 6 {
			t.Fatalf("a purge with the wrong name: %q, %d dead letters left", got, f.dead("reports"))
		}
		do(t, ctx, chromedp.SendKeys(chromedp.CSS("#purge-confirm"), "reports"))
		if eval[bool](t, ctx, `document.getElementById("purge-button").disabled`) {
			t.Fatal("the purge button stays disabled with the right name")
		}
		submit(t, ctx, "#purge-button")
		if got := text(t, ctx, "#flash"); !strings.Contains(got, "Purged 6 dead letters of queue reports") {
			t.Errorf("flash %q", got)
		}
		if n := f.dead("reports"); n != 0 {
			t.Fatalf("%d dead letters after the purge", n)
		}
	})

	t.Run("EnqueueAJob", func(t *testing.T) {
		do(t, ctx, chromedp.Navigate(f.base+"/queue?q=emails"), chromedp.WaitVisible(chromedp.CSS("#enqueue")),
			chromedp.SendKeys(chromedp.CSS(`#enqueue input[name=type]`), "ok.email"),
			chromedp.SendKeys(chromedp.CSS(`#enqueue input[name=job_id]`), "from-the-browser"),
			chromedp.SendKeys(chromedp.CSS(`#enqueue textarea[name=payload]`), `{"hello":"world"}`))
		submit(t, ctx, "#enqueue button")
		if got := text(t, ctx, "#flash"); !strings.Contains(got, "Enqueued job from-the-browser") {
			t.Errorf("flash %q", got)
		}
		deadline := time.Now().Add(20 * time.Second)
		for f.runs("from-the-browser") == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the job enqueued from the browser did not run")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	t.Run("PostWithoutToken", func(t *testing.T) {
		do(t, ctx, chromedp.Navigate(f.base+"/queue?q=emails"), chromedp.WaitVisible(chromedp.CSS("#pop")),
			chromedp.Evaluate[chromedp.Void](`document.querySelector("#pop input[name=csrf]").remove()`))
		if status := submit(t, ctx, "#pop button"); status != http.StatusForbidden {
			t.Fatalf("a pop without the token: %d, want 403", status)
		}
		if got := text(t, ctx, "#error-message"); !strings.Contains(got, "CSRF token") {
			t.Errorf("the refusal says %q", got)
		}
		if n := f.dead("emails"); n != 14 {
			t.Fatalf("%d dead letters: a POST without the token popped one", n)
		}
	})

	// The hostile record, under the dashboard's Content-Security-Policy and
	// without it (escaping alone must keep every script from running).
	t.Run("HostileRecordIsText", func(t *testing.T) {
		noCSP := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.d.ServeHTTP(stripCSP{w}, r)
		}))
		defer noCSP.Close()
		for _, base := range []string{f.base, noCSP.URL} {
			csp := base == f.base
			do(t, ctx, chromedp.Navigate(base+"/queue?q=xss"), chromedp.WaitVisible(chromedp.CSS("#letters")))
			checkNoScriptRan(t, ctx, csp)
			if got := text(t, ctx, "#letters td.type"); got != hostileType {
				t.Errorf("the type in the list is %q, want it as text", got)
			}
			do(t, ctx, chromedp.Click(chromedp.CSS(`#letters td.id a`)), chromedp.WaitVisible(chromedp.CSS("#letter-id")))
			checkNoScriptRan(t, ctx, csp)
			if got := text(t, ctx, "#type"); got != hostileType {
				t.Errorf("type %q, want it as text", got)
			}
			if got := text(t, ctx, "#last-error"); !strings.HasSuffix(got, hostileError) {
				t.Errorf("error %q, want it as text", got)
			}
			if got := text(t, ctx, "#headers"); !strings.Contains(got, `"><img src=x onerror="window.__xss=3">`) ||
				!strings.Contains(got, `<script>window.__xss=4</script>`) || !strings.Contains(got, `\u202egnp.exe\x1b[31m`) {
				t.Errorf("headers %q, want them as text, the bidi and escape characters shown", got)
			}
			do(t, ctx, chromedp.Navigate(base+"/queue?q=xss&text="+strings.ReplaceAll(hostileType, "<", "%3C")), chromedp.WaitVisible(chromedp.CSS("#letters")))
			checkNoScriptRan(t, ctx, csp)
		}
	})

	t.Run("ReadOnly", func(t *testing.T) {
		ro, err := dashboard.New(f.p, dashboard.Config{Queues: []string{"emails"}, ReadOnly: true, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(ro)
		defer srv.Close()
		do(t, ctx, chromedp.Navigate(srv.URL+"/queue?q=emails"), chromedp.WaitVisible(chromedp.CSS("#read-only")))
		if n := eval[int](t, ctx, `document.querySelectorAll("form[method=post]").length`); n != 0 {
			t.Errorf("%d POST forms on a read-only page", n)
		}
		do(t, ctx, chromedp.Click(chromedp.CSS(`#letters td.id a`)), chromedp.WaitVisible(chromedp.CSS("#letter-id")))
		if n := eval[int](t, ctx, `document.querySelectorAll("form[method=post]").length`); n != 0 {
			t.Errorf("%d POST forms on a read-only letter page", n)
		}
	})
}

// checkNoScriptRan asserts that nothing from the record ran or became an
// element: the trap variable is unset, the only script is the dashboard's
// and no image exists.
func checkNoScriptRan(t *testing.T, ctx context.Context, csp bool) {
	t.Helper()
	if v := eval[string](t, ctx, `String(window.__xss)`); v != "undefined" {
		t.Errorf("a script from the record ran (window.__xss = %s; CSP on: %v)", v, csp)
	}
	if n := eval[int](t, ctx, `document.scripts.length`); n != 1 {
		t.Errorf("%d script elements, want the dashboard's one (CSP on: %v)", n, csp)
	}
	if n := eval[int](t, ctx, `document.images.length + document.querySelectorAll("[onerror],[onload],[onclick]").length`); n != 0 {
		t.Errorf("%d images or event-handler attributes in the page (CSP on: %v)", n, csp)
	}
}

// stripCSP drops the Content-Security-Policy header, to show that escaping
// alone keeps scripts from running.
type stripCSP struct{ http.ResponseWriter }

func (s stripCSP) WriteHeader(code int) {
	s.Header().Del("Content-Security-Policy")
	s.ResponseWriter.WriteHeader(code)
}

func (s stripCSP) Write(b []byte) (int, error) {
	s.Header().Del("Content-Security-Policy")
	return s.ResponseWriter.Write(b)
}

// TestBrowserPause pauses and resumes a queue, then a group of its jobs,
// by clicking in headless Chromium on the memory backend, and checks what
// the pages and the workers show after each click.
func TestBrowserPause(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	f := newFixture(t, fixtureOptions{queues: []string{"emails"}})
	bg := context.Background()

	do(t, ctx, chromedp.Navigate(f.base+"/queue?q=emails"), chromedp.WaitVisible(chromedp.CSS("#pause-queue")))
	if got := text(t, ctx, "#pause-state"); !strings.Contains(got, "Running") {
		t.Fatalf("a running queue's state says %q", got)
	}
	if status := submit(t, ctx, "#pause-queue button"); status != http.StatusOK {
		t.Fatalf("pause: %d", status)
	}
	if got := text(t, ctx, "#flash"); !strings.Contains(got, "Paused queue emails") {
		t.Fatalf("flash %q", got)
	}
	if got := text(t, ctx, "#paused-badge"); got != "paused" {
		t.Errorf("badge %q", got)
	}
	if got := text(t, ctx, "#pause-state"); !strings.Contains(got, "Paused: no worker takes") {
		t.Errorf("a paused queue's state says %q", got)
	}
	if s, _ := f.p.Stats(bg, "emails"); !s.Paused {
		t.Fatal("the click did not pause the queue")
	}
	noticed()
	if err := f.p.Enqueue(bg, &ap.Job{ID: "while-paused", Type: "ok.email", Queue: "emails"}); err != nil {
		t.Fatal(err)
	}
	noticed()
	do(t, ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#depths")))
	if got := text(t, ctx, "#depth-ready"); got != "1" || f.runs("while-paused") != 0 {
		t.Fatalf("ready %q, runs %d: want the job waiting", got, f.runs("while-paused"))
	}
	do(t, ctx, chromedp.Navigate(f.base+"/"), chromedp.WaitVisible(chromedp.CSS("#queues")))
	if got := text(t, ctx, `tr[data-queue="emails"] .badge.paused`); got != "paused" {
		t.Errorf("the queue list marks emails %q", got)
	}
	do(t, ctx, chromedp.Click(chromedp.CSS(`tr[data-queue="emails"] td a`)), chromedp.WaitVisible(chromedp.CSS("#resume-queue")))
	if status := submit(t, ctx, "#resume-queue button"); status != http.StatusOK {
		t.Fatalf("resume: %d", status)
	}
	if got := text(t, ctx, "#flash"); !strings.Contains(got, "Resumed queue emails") {
		t.Fatalf("flash %q", got)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("#paused-badge, #resume-queue").length`); n != 0 {
		t.Error("the page still shows the queue paused after the resume")
	}
	waitFor(t, "the waiting job to run", func() bool { return f.runs("while-paused") == 1 })

	// A group: paused by name, its jobs held and counted, resumed from its row.
	do(t, ctx, chromedp.SendKeys(chromedp.CSS(`#group-form input[name=group]`), "acme"))
	submit(t, ctx, "#pause-group")
	if got := text(t, ctx, "#flash"); !strings.Contains(got, "Paused group acme of queue emails") {
		t.Fatalf("flash %q", got)
	}
	noticed()
	jobs := []*ap.Job{{ID: "other-0", Type: "ok.email", Queue: "emails", Group: "other"}}
	for i := range 2 {
		jobs = append(jobs, &ap.Job{ID: fmt.Sprintf("acme-%d", i), Type: "ok.email", Queue: "emails", Group: "acme"})
	}
	if err := f.p.EnqueueBatch(bg, jobs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the other group's job to run", func() bool { return f.runs("other-0") == 1 })
	held := `tr[data-group="acme"] td.held`
	waitFor(t, "the page to show 2 held jobs", func() bool {
		do(t, ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(held)))
		return text(t, ctx, held) == "2"
	})
	if f.runs("acme-0")+f.runs("acme-1") != 0 {
		t.Fatal("a job of the paused group ran")
	}
	shot(t, ctx, "pause")
	if status := submit(t, ctx, `tr[data-group="acme"] button.resume-group`); status != http.StatusOK {
		t.Fatalf("resume the group: %d", status)
	}
	if got := text(t, ctx, "#flash"); !strings.Contains(got, "Resumed group acme of queue emails: moved 2 held jobs back") {
		t.Fatalf("flash %q", got)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("#paused-groups tr.group").length`); n != 0 {
		t.Errorf("%d paused groups listed after the resume", n)
	}
	waitFor(t, "the held jobs to run", func() bool { return f.runs("acme-0") == 1 && f.runs("acme-1") == 1 })
}
