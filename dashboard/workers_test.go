package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// The workers page lists the running platform with its queues and
// concurrency; the history page counts the attempts its handlers ran, by
// queue and type, once the worker has flushed them.
func TestWorkersAndHistoryPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail", "sms"}})
	c := newClient(t, f)
	waitBody(t, c, "/workers", `<tr class="worker">`)
	_, body := c.get("/workers")
	if err := contains(body, "test-worker", "mail, sms", `<td class="n">8</td>`, `id="nav-workers"`); err != nil {
		t.Errorf("/workers: %v\n%s", err, body)
	}
	f.enqueue("mail", 0, &ap.Job{Type: "ok.email"}, &ap.Job{Type: "ok.email"}, &ap.Job{Type: "ok.email"})
	f.enqueue("sms", 1, &ap.Job{Type: "fail.sms"})
	body = waitBody(t, c, "/history", `<td class="type">ok.email</td>`)
	if err := contains(body, `<a href="/queue?q=mail">mail</a>`, `<td class="type">fail.sms</td>`, `id="history-minutes"`); err != nil {
		t.Errorf("/history: %v\n%s", err, body)
	}
	if resp, _ := c.get("/history?span=7d"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("/history?span=7d: %d, want 400", resp.StatusCode)
	}
	for _, span := range []string{"1h", "6h", "24h"} {
		if resp, _ := c.get("/history?span=" + span); resp.StatusCode != http.StatusOK {
			t.Errorf("/history?span=%s: %d", span, resp.StatusCode)
		}
	}
}

// waitBody polls a page until it contains want, and returns it.
func waitBody(t *testing.T, c *client, path, want string) string {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) { // a safety net, not an assertion on time
		_, body := c.get(path)
		if strings.Contains(body, want) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never showed %q:\n%s", path, want, body)
		}
	}
}

const forgedText = "<script>window.__xss=1</script>\x1b[2J\u202e\"><img src=x onerror=\"x\">"

// forgeWorkerAndHistory writes a worker record and a history bucket full of
// markup and terminal controls straight into the store.
func forgeWorkerAndHistory(t *testing.T, d driver.Backend) {
	t.Helper()
	s, err := driver.StoreOf(d)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w, _ := json.Marshal(map[string]any{"name": "n" + forgedText, "host": "h" + forgedText, "version": "v" + forgedText,
		"queues": []string{"q" + forgedText, strings.Repeat("long", 1000)}, "pid": -1, "beat_at": time.Now(), "started_at": time.Now(), "interval": int64(time.Minute)})
	if _, err := s.Create(ctx, kv.Workers.Prefix()+"w-forged", w, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, kv.Workers.Prefix()+"w-garbage", []byte("{<script>"), time.Minute); err != nil {
		t.Fatal(err)
	}
	h, _ := json.Marshal(map[string]any{"s": []map[string]any{{"q": "q" + forgedText, "t": "t" + forgedText, "ok": 5, "f": -3}}})
	k := kv.History.Prefix() + fmt.Sprintf("m/%012d", time.Now().Unix()/60)
	if _, err := s.Create(ctx, k, h, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// Forged worker records and history buckets show as text: no markup, no
// terminal controls, no link from a forged queue, strings cut.
func TestForgedWorkerAndHistory(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, noStart: true})
	forgeWorkerAndHistory(t, f.backend)
	c := newClient(t, f)
	for _, p := range []string{"/workers", "/history"} {
		resp, body := c.get(p)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
		if n := strings.Count(body, "<script"); n != 1 || strings.Contains(body, "<img") || strings.Contains(body, "\x1b") || strings.Contains(body, "\u202e") {
			t.Errorf("%s: markup or controls from a record reached the page:\n%s", p, body)
		}
		if strings.Contains(body, "queue?q=q") || strings.Contains(body, strings.Repeat("long", 60)) {
			t.Errorf("%s: a forged queue got a link, or a forged string was not cut:\n%s", p, body)
		}
		if !strings.Contains(body, "&lt;script&gt;") {
			t.Errorf("%s: the forged record is not shown as text:\n%s", p, body)
		}
	}
}

// In a browser, under the Content-Security-Policy and without it, the
// workers and history pages show forged records as text and run none of
// their scripts.
func TestBrowserWorkersAndHistory(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	forgeWorkerAndHistory(t, f.backend)
	// The platform writes its first worker record at a heartbeat after
	// Start, so the page is read once the record is in the store.
	waitBody(t, newClient(t, f), "/workers", "test-worker")
	noCSP := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.d.ServeHTTP(stripCSP{w}, r)
	}))
	defer noCSP.Close()
	for _, base := range []string{f.base, noCSP.URL} {
		csp := base == f.base
		do(t, ctx, chromedp.Navigate(base+"/workers"), chromedp.WaitVisible(chromedp.CSS("#workers")))
		checkNoScriptRan(t, ctx, csp)
		if got := text(t, ctx, "body"); !strings.Contains(got, "n<script>window.__xss=1</script>") || !strings.Contains(got, "test-worker") {
			t.Errorf("/workers: the forged name is not shown as text, or the real worker is missing:\n%s", got)
		}
		do(t, ctx, chromedp.Click(chromedp.CSS("#nav-history")), chromedp.WaitVisible(chromedp.CSS("#history-totals")))
		checkNoScriptRan(t, ctx, csp)
		if got := text(t, ctx, "#history-totals"); !strings.Contains(got, "t<script>window.__xss=1</script>") {
			t.Errorf("/history: the forged type is not shown as text:\n%s", got)
		}
	}
}
