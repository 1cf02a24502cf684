package dashboard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/dashboard"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// client is a browser-like HTTP client: a cookie jar, no redirects
// followed unless asked.
type client struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newClient(t *testing.T, f *fixture) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, base: f.base, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (c *client) get(path string) (*http.Response, string) {
	c.t.Helper()
	resp, err := c.hc.Get(c.base + path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (c *client) post(path string, form url.Values, header ...string) (*http.Response, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var tokenRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// token loads the queue's page and returns its CSRF token.
func (c *client) token(queue string) string {
	c.t.Helper()
	_, body := c.get("/queue?q=" + queue)
	m := tokenRE.FindStringSubmatch(body)
	if m == nil {
		c.t.Fatalf("no CSRF token in the page:\n%s", body)
	}
	return m[1]
}

func failing(n int) []*ap.Job {
	jobs := make([]*ap.Job, n)
	for i := range jobs {
		typ := "fail.email"
		if i%2 == 1 {
			typ = "fail.sms"
		}
		jobs[i] = &ap.Job{Type: typ, Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	return jobs
}

func TestPostWithoutTokenIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	f.enqueue("mail", 3, failing(3)...)
	c := newClient(t, f)
	good := c.token("mail")
	for _, tc := range []struct {
		name   string
		form   url.Values
		header []string
	}{
		{"no token", url.Values{"q": {"mail"}, "confirm": {"mail"}}, nil},
		{"wrong token", url.Values{"q": {"mail"}, "confirm": {"mail"}, "csrf": {good + "x"}}, nil},
		{"another site", url.Values{"q": {"mail"}, "confirm": {"mail"}, "csrf": {good}}, []string{"Sec-Fetch-Site", "cross-site"}},
		{"another origin", url.Values{"q": {"mail"}, "confirm": {"mail"}, "csrf": {good}}, []string{"Origin", "https://evil.example"}},
	} {
		for _, path := range []string{"/purge", "/pop", "/redrive", "/delete", "/enqueue", "/pause", "/resume"} {
			form := url.Values{}
			for k, v := range tc.form {
				form[k] = v
			}
			form.Set("match", "1")
			form.Set("type", "ok.email")
			resp, body := c.post(path, form, tc.header...)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s: POST %s: %d, want 403\n%s", tc.name, path, resp.StatusCode, body)
			}
		}
	}
	// A fresh client has no cookie: a token taken from another session is
	// no good either.
	other := newClient(t, f)
	if resp, _ := other.post("/purge", url.Values{"q": {"mail"}, "confirm": {"mail"}, "csrf": {good}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a token without its cookie: %d, want 403", resp.StatusCode)
	}
	if n := f.dead("mail"); n != 3 {
		t.Fatalf("%d dead letters after refused requests, want 3", n)
	}
	if s, _ := f.p.Stats(context.Background(), "mail"); s.Paused {
		t.Fatal("a refused POST /pause paused the queue")
	}
	// GET never acts.
	for _, path := range []string{"/purge", "/pause"} {
		if resp, _ := c.get(path + "?q=mail&confirm=mail&csrf=" + url.QueryEscape(good)); resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("GET %s: %d, want 405", path, resp.StatusCode)
		}
	}
	if s, _ := f.p.Stats(context.Background(), "mail"); s.Paused {
		t.Fatal("GET /pause paused the queue")
	}
	// With the token, it works.
	resp, _ := c.post("/purge", url.Values{"q": {"mail"}, "confirm": {"mail"}, "csrf": {good}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("purge with the token: %d, want 303", resp.StatusCode)
	}
	if n := f.dead("mail"); n != 0 {
		t.Fatalf("%d dead letters after the purge, want 0", n)
	}
}

func TestReadOnlyRefusesEveryAction(t *testing.T) {
	t.Parallel()
	key := []byte("a key both dashboards share")
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, config: dashboard.Config{ReadOnly: true, CSRFKey: key}})
	f.enqueue("mail", 4, failing(4)...)
	ctx := context.Background()
	// A paused queue with a paused group: the page shows both, and offers
	// to resume neither.
	if err := f.p.Pause(ctx, "mail"); err != nil {
		t.Fatal(err)
	}
	if err := f.p.PauseGroup(ctx, "mail", "acme"); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, f)
	resp, body := c.get("/queue?q=mail")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the queue: %d", resp.StatusCode)
	}
	if strings.Contains(body, `method="post"`) || !strings.Contains(body, `id="read-only"`) {
		t.Fatalf("a read-only page has a POST form, or does not say it is read-only:\n%s", body)
	}
	if err := contains(body, `id="paused-badge"`, `data-group="acme"`); err != nil {
		t.Fatalf("a read-only page does not show the pauses: %v\n%s", err, body)
	}
	// A read-only page has no token to give; a writable dashboard with the
	// same key, on the same host, gives one good for the client's cookie:
	// read-only mode alone must refuse.
	rw, err := dashboard.New(f.p, dashboard.Config{CSRFKey: key, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	rwSrv := httptest.NewServer(rw)
	defer rwSrv.Close()
	tok := (&client{t: t, base: rwSrv.URL, hc: c.hc}).token("mail")
	id := f.deadLetters("mail")[0].ID
	for _, form := range []url.Values{
		{"q": {"mail"}},             // pop
		{"q": {"mail"}, "id": {id}}, // redrive or delete one
		{"q": {"mail"}, "match": {"1"}, "confirm": {"yes"}}, // redrive all
		{"q": {"mail"}, "match": {"1"}, "confirm": {"yes"}, "type": {"fail.sms"}},
		{"q": {"mail"}, "confirm": {"mail"}},  // purge
		{"q": {"mail"}, "type": {"ok.email"}}, // enqueue
		{"q": {"mail"}, "group": {"acme"}},    // pause or resume a group
	} {
		for _, path := range []string{"/pop", "/redrive", "/delete", "/purge", "/enqueue", "/pause", "/resume"} {
			form.Set("csrf", tok)
			resp, body := c.post(path, form)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "This dashboard is read-only") {
				t.Errorf("read-only: POST %s %v: %d, want 403 saying read-only", path, form, resp.StatusCode)
			}
		}
	}
	if n := f.dead("mail"); n != 4 {
		t.Fatalf("%d dead letters, want 4: a read-only dashboard changed something", n)
	}
	if s, _ := f.p.Stats(ctx, "mail"); s.Ready+s.Scheduled+s.InFlight != 0 || !s.Paused {
		t.Fatalf("a read-only dashboard enqueued or resumed: %+v", s)
	}
	if g, _ := f.p.PausedGroups(ctx, "mail"); len(g) != 1 {
		t.Fatalf("a read-only dashboard resumed a group: paused groups %v", g)
	}
}

func TestAuthorize(t *testing.T) {
	t.Parallel()
	var asked []string
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, config: dashboard.Config{
		Authorize: func(r *http.Request, action string) error {
			asked = append(asked, action)
			if r.Header.Get("X-User") == "" {
				return errors.New("sign in <first>")
			}
			if action == dashboard.ActionPurge && r.Header.Get("X-User") != "admin" {
				return errors.New("only admins purge")
			}
			return nil
		},
	}})
	f.enqueue("mail", 2, failing(2)...)
	c := newClient(t, f)
	resp, body := c.get("/")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "sign in &lt;first&gt;") {
		t.Fatalf("anonymous GET /: %d, want 403 with the hook's error escaped\n%s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodGet, f.base+"/queue?q=mail", nil)
	req.Header.Set("X-User", "ann")
	r2, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	tok := tokenRE.FindStringSubmatch(string(b))[1]
	resp, _ = c.post("/purge", url.Values{"q": {"mail"}, "confirm": {"mail"}, "csrf": {tok}}, "X-User", "ann")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("ann purges: %d, want 403", resp.StatusCode)
	}
	resp, _ = c.post("/purge", url.Values{"q": {"mail"}, "confirm": {"mail"}, "csrf": {tok}}, "X-User", "admin")
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("admin purges: %d, want 303", resp.StatusCode)
	}
	want := []string{"view", "view", "purge", "purge"}
	if fmt.Sprint(asked) != fmt.Sprint(want) {
		t.Fatalf("Authorize was asked %v, want %v", asked, want)
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, config: dashboard.Config{Prefix: "/admin/jobs"}})
	c := newClient(t, f)
	resp, body := c.get("/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/jobs/: %d", resp.StatusCode)
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if err := contains(csp, "default-src 'none'", "script-src 'nonce-", "style-src 'self'", "frame-ancestors 'none'", "form-action 'self'"); err != nil {
		t.Errorf("Content-Security-Policy %q: %v", csp, err)
	}
	if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
		t.Errorf("Content-Security-Policy %q allows inline code", csp)
	}
	for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"} {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	// Every script is an embedded file with the page's nonce; no inline
	// script, no inline style, no event-handler attribute, nothing from
	// elsewhere.
	nonce := regexp.MustCompile(`'nonce-([^']+)'`).FindStringSubmatch(csp)[1]
	scripts := regexp.MustCompile(`<script[^>]*>`).FindAllString(body, -1)
	if len(scripts) != 1 || !strings.Contains(scripts[0], `src="/admin/jobs/static/app.js?v=`) || !strings.Contains(scripts[0], `nonce="`+nonce+`"`) {
		t.Errorf("scripts %q, want one: the embedded app.js with the nonce", scripts)
	}
	if regexp.MustCompile(`(?i)\son[a-z]+=|style=|<style|https?://`).MatchString(body) {
		t.Errorf("the page has an inline handler, an inline style or an outside address:\n%s", body)
	}
	for _, path := range []string{"/static/app.js", "/static/app.css"} {
		resp, body := c.get(path)
		if resp.StatusCode != http.StatusOK || len(body) < 100 {
			t.Errorf("GET %s: %d, %d bytes", path, resp.StatusCode, len(body))
		}
	}
	// The prefix alone redirects to the list; outside it, nothing.
	resp, _ = (&client{t: t, base: f.srv.URL, hc: c.hc}).get("/admin/jobs")
	if resp.StatusCode != http.StatusFound {
		t.Errorf("GET /admin/jobs: %d, want 302", resp.StatusCode)
	}
	resp, _ = (&client{t: t, base: f.srv.URL, hc: c.hc}).get("/admin/jobsx/")
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /admin/jobsx/: %d, want 404", resp.StatusCode)
	}
}

// TestHostileRecordIsText checks the server's side of escaping: the
// browser test checks that no script runs.
func TestHostileRecordIsText(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	f.enqueue("mail", 1, hostileJob())
	c := newClient(t, f)
	dl := f.deadLetters("mail")[0]
	pages := []string{"/queue?q=mail", "/letter?q=mail&id=" + url.QueryEscape(dl.ID), "/letter?q=mail&view=hex&id=" + url.QueryEscape(dl.ID),
		"/queue?q=mail&text=" + url.QueryEscape("<script>"), "/letter?q=mail&id=" + url.QueryEscape("<script>nope")}
	for _, p := range pages {
		_, body := c.get(p)
		if n := strings.Count(body, "<script"); n != 1 {
			t.Errorf("%s: %d <script tags, want 1 (the dashboard's own)", p, n)
		}
		if strings.Contains(body, "<img") || strings.Contains(body, `onerror="`) {
			t.Errorf("%s: markup from the record reached the page", p)
		}
	}
	_, body := c.get("/letter?q=mail&id=" + url.QueryEscape(dl.ID))
	if err := contains(body, "&lt;script&gt;window.__xss=1&lt;/script&gt;", `\u202egnp.exe\x1b[31m`, "second line &lt;/pre&gt;"); err != nil {
		t.Errorf("the record's text is not shown escaped: %v", err)
	}
}

var letterLinkRE = regexp.MustCompile(`<a href="[^"]*/letter\?[^"]*">([^<]+)</a>`)

func TestPagingReachesTheEnd(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, config: dashboard.Config{PageSize: 100, ScanLimit: 400}})
	f.enqueue("mail", 1200, failing(1200)...)
	c := newClient(t, f)
	for _, tc := range []struct {
		query string
		want  int
	}{
		{"", 1200},
		{"&type=fail.sms", 600},
		{"&text=" + url.QueryEscape(`"N":1199`), 1}, // the last record, by its payload, case folded
		{"&type=fail.s*&reason=permanent&newer=1h", 600},
		{"&type=nothing", 0},
		{"&older=1h", 0},
	} {
		seen := map[string]bool{}
		next := "/queue?q=mail" + tc.query
		pages := 0
		for next != "" {
			pages++
			if pages > 200 {
				t.Fatalf("%s: more than 200 pages", tc.query)
			}
			resp, body := c.get(next)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: GET %s: %d", tc.query, next, resp.StatusCode)
			}
			for _, m := range letterLinkRE.FindAllStringSubmatch(body, -1) {
				if seen[m[1]] {
					t.Fatalf("%s: %s listed twice", tc.query, m[1])
				}
				seen[m[1]] = true
			}
			next = ""
			if m := nextRE.FindStringSubmatch(body); m != nil {
				next = strings.ReplaceAll(m[1], "&amp;", "&")
			} else if !strings.Contains(body, `id="end-of-queue"`) {
				t.Fatalf("%s: neither a next page nor the end", tc.query)
			}
		}
		if len(seen) != tc.want {
			t.Errorf("%s: %d records listed over %d pages, want %d", tc.query, len(seen), pages, tc.want)
		}
	}
}

func TestMatchingActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	f.enqueue("mail", 30, failing(30)...)
	c := newClient(t, f)
	tok := c.token("mail")
	// Asking first: the count, and nothing done.
	resp, body := c.post("/delete", url.Values{"q": {"mail"}, "match": {"1"}, "type": {"fail.sms"}, "csrf": {tok}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Delete 15 dead letters?") {
		t.Fatalf("delete matching without confirm: %d\n%s", resp.StatusCode, body)
	}
	if n := f.dead("mail"); n != 30 {
		t.Fatalf("%d dead letters after the question, want 30", n)
	}
	resp, _ = c.post("/delete", url.Values{"q": {"mail"}, "match": {"1"}, "type": {"fail.sms"}, "confirm": {"yes"}, "csrf": {tok}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("delete matching: %d", resp.StatusCode)
	}
	for _, dl := range f.deadLetters("mail") {
		if dl.Job.Type != "fail.email" {
			t.Fatalf("a %s is left after deleting every fail.sms", dl.Job.Type)
		}
	}
	if n := f.dead("mail"); n != 15 {
		t.Fatalf("%d dead letters, want 15", n)
	}
	// Delete with no filter is a purge's job.
	if resp, _ := c.post("/delete", url.Values{"q": {"mail"}, "match": {"1"}, "confirm": {"yes"}, "csrf": {tok}}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("delete everything: %d, want 400", resp.StatusCode)
	}
	// Purge needs the queue's name.
	c.post("/purge", url.Values{"q": {"mail"}, "confirm": {"mai"}, "csrf": {tok}})
	if n := f.dead("mail"); n != 15 {
		t.Fatalf("a purge with the wrong name removed records: %d left", n)
	}
	_, body = c.get("/queue?q=mail")
	if !strings.Contains(body, "Nothing was purged") {
		t.Errorf("the refused purge left no message")
	}
	// Enqueue, then pop: the popped record is shown.
	resp, _ = c.post("/enqueue", url.Values{"q": {"mail"}, "type": {"fail.email"}, "job_id": {"job-from-form"}, "payload": {`{"to":"ann"}`}, "headers": {"who: ann\ntenant: 7"}, "csrf": {tok}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("enqueue: %d", resp.StatusCode)
	}
	f.waitDead("mail", 16)
	resp, body = c.post("/pop", url.Values{"q": {"mail"}, "csrf": {tok}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="popped"`) {
		t.Fatalf("pop: %d\n%s", resp.StatusCode, body)
	}
	if n := f.dead("mail"); n != 15 {
		t.Fatalf("%d dead letters after pop, want 15", n)
	}
	// The enqueued job, its headers and payload.
	var dl ap.DeadLetter
	for _, d := range f.deadLetters("mail") {
		if d.Job.ID == "job-from-form" {
			dl = d
		}
	}
	if dl.Job.Headers["who"] != "ann" || dl.Job.Headers["tenant"] != "7" || string(dl.Job.Payload) != `{"to":"ann"}` {
		t.Fatalf("the enqueued job: %+v", dl.Job)
	}
}

func TestQueueListFindsEveryQueue(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, config: dashboard.Config{Queues: []string{"not-yet"}}})
	// A queue no platform works, that the dashboard is not told about.
	if err := f.p.Enqueue(context.Background(), &ap.Job{Type: "x", Queue: "orphans"}); err != nil {
		t.Fatal(err)
	}
	f.enqueue("mail", 2, failing(2)...)
	_, body := newClient(t, f).get("/")
	for _, q := range []string{"mail", "orphans", "not-yet"} {
		if !strings.Contains(body, `<tr data-queue="`+q+`">`) {
			t.Errorf("queue %s is not in the list", q)
		}
	}
	if !regexp.MustCompile(`(?s)data-queue="orphans">.*?<td class="n ready">1</td>`).MatchString(body) {
		t.Errorf("orphans does not show its one ready job")
	}
	if !regexp.MustCompile(`(?s)data-queue="mail">.*?<td class="age oldest"[^>]*>\d+ s ago</td>`).MatchString(body) {
		t.Errorf("mail does not show the age of its oldest dead letter")
	}
}

func TestTrustedOrigins(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, config: dashboard.Config{TrustedOrigins: []string{"https://admin.example.com"}}})
	c := newClient(t, f)
	tok := c.token("mail")
	resp, _ := c.post("/purge", url.Values{"q": {"mail"}, "confirm": {"mail"}, "csrf": {tok}}, "Origin", "https://admin.example.com")
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a POST from a trusted origin: %d, want 303", resp.StatusCode)
	}
	resp, _ = c.post("/purge", url.Values{"q": {"mail"}, "confirm": {"mail"}}, "Origin", "https://admin.example.com")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a POST from a trusted origin without the token: %d, want 403", resp.StatusCode)
	}
	if _, err := dashboard.New(f.p, dashboard.Config{TrustedOrigins: []string{"not a url"}}); err == nil {
		t.Fatal("a bad trusted origin was taken")
	}
}

func TestConfigIsChecked(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	for _, cfg := range []dashboard.Config{
		{Prefix: "jobs"},
		{Prefix: `/jobs"><script>`},
		{Queues: []string{"no spaces"}},
		{CSRFKey: []byte("short")},
		{PageSize: dashboard.MaxPageSize + 1},
		{ScanLimit: -1},
	} {
		if _, err := dashboard.New(f.p, cfg); err == nil {
			t.Errorf("New took %+v", cfg)
		}
	}
	if _, err := dashboard.New(nil, dashboard.Config{}); err == nil {
		t.Error("New took a nil platform")
	}
}

// hostileJSON is issue 34's payload: 9,990 nested arrays around 5,000
// numbers, 30 KB that indented would make a 300 MB page.
func hostileJSON() []byte {
	return []byte(strings.Repeat("[", 9990) + strings.Repeat("1,", 4999) + "1" + strings.Repeat("]", 9990))
}

// TestNestedJSONPageIsBounded: any viewer can open a dead letter, so its
// page stays small whatever JSON the record holds (BenchmarkNestedJSONPage
// measures its time and memory).
func TestNestedJSONPageIsBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	f.enqueue("mail", 1, &ap.Job{Type: "fail.nested", Payload: hostileJSON()})
	c := newClient(t, f)
	dl := f.deadLetters("mail")[0]
	for _, view := range []string{"", "json"} {
		resp, body := c.get("/letter?q=mail&view=" + view + "&id=" + url.QueryEscape(dl.ID))
		if resp.StatusCode != http.StatusOK || len(body) > 1<<20 || !strings.Contains(body, "nested deeper than") || !strings.Contains(body, "[[[[1,1,1") {
			t.Errorf("view %q: %d, a page of %d bytes; want 200, under 1 MiB, the payload as text with a note", view, resp.StatusCode, len(body))
		}
	}
}

// A record's fields are whatever its writer wrote: its reason picks no CSS
// class outside the fixed list, and the page names the queue it was read
// from, not the one the record claims (issue 34 finding 11).
func TestForgedRecordFields(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, noStart: true})
	ctx := context.Background()
	forged := &wire.Dead{Reason: "x danger flash ok", Queue: "payroll", DeadAt: time.Now(), Job: wire.Job{ID: "forged", Type: "t"}}
	if err := f.backend.Enqueue(ctx, "mail", []driver.Message{{ID: "forged", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := f.backend.Receive(ctx, "mail", 1, time.Minute)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	if err := f.backend.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: "forged", Body: wire.EncodeDead(forged)}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, f)
	_, body := c.get("/queue?q=mail")
	if !strings.Contains(body, `<span class="reason-other">x danger flash ok</span>`) {
		t.Errorf("the forged reason's class is not reason-other:\n%s", body)
	}
	_, body = c.get("/letter?q=mail&id=forged")
	if !regexp.MustCompile(`id="record-queue">mail <span class="hint">\(the record names queue payroll\)`).MatchString(body) {
		t.Errorf("the letter page does not name the queue read (mail) first:\n%s", body)
	}
	_, body = c.get("/queue?q=mail&reason=permanent")
	if strings.Contains(body, "reason-other") {
		t.Errorf("a filter on a known reason listed the forged record")
	}
}
