package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/dashboard"
	"github.com/asyncplatform/asyncplatform/driver"
)

// noticed waits until every worker has read the pauses again.
func noticed() { time.Sleep(2*ap.PausePoll + 250*time.Millisecond) }

// flashOf follows an action's redirect (c.post's answer) and returns the
// flash it left.
func (c *client) flashOf(resp *http.Response, _ string) string {
	c.t.Helper()
	if resp.StatusCode != http.StatusSeeOther {
		c.t.Fatalf("an action answered %d, want 303", resp.StatusCode)
	}
	_, body := c.get(strings.TrimPrefix(resp.Header.Get("Location"), strings.TrimPrefix(c.base, c.srvURL())))
	m := regexp.MustCompile(`(?s)<p class="flash [a-z]+" id="flash" role="status">(.*?)</p>`).FindStringSubmatch(body)
	if m == nil {
		c.t.Fatalf("no flash in the page the action led to:\n%s", body)
	}
	return m[1]
}

// srvURL is the scheme and host of the client's base.
func (c *client) srvURL() string {
	u, _ := url.Parse(c.base)
	return u.Scheme + "://" + u.Host
}

// The queue's pause state, shown and flipped: a job enqueued while the
// queue is paused waits, and runs once it is resumed.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var asked []string
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, config: dashboard.Config{
		Authorize: func(r *http.Request, action string) error {
			if action != dashboard.ActionView {
				mu.Lock()
				asked = append(asked, action)
				mu.Unlock()
			}
			return nil
		},
	}})
	ctx := context.Background()
	c := newClient(t, f)
	_, body := c.get("/queue?q=mail")
	if err := contains(body, `id="pause-queue"`, "Running: workers take this queue"); err != nil || strings.Contains(body, `id="resume-queue"`) {
		t.Fatalf("a running queue's page: %v, or it offers to resume\n%s", err, body)
	}
	tok := tokenRE.FindStringSubmatch(body)[1]

	flash := c.flashOf(c.post("/pause", url.Values{"q": {"mail"}, "csrf": {tok}}))
	if !strings.Contains(flash, "Paused queue mail") {
		t.Errorf("flash %q", flash)
	}
	if s, err := f.p.Stats(ctx, "mail"); err != nil || !s.Paused {
		t.Fatalf("after POST /pause: %+v, %v: not paused", s, err)
	}
	_, body = c.get("/queue?q=mail")
	if err := contains(body, `id="paused-badge"`, `id="resume-queue"`, "Paused: no worker takes"); err != nil || strings.Contains(body, `id="pause-queue"`) {
		t.Fatalf("a paused queue's page: %v, or it offers to pause\n%s", err, body)
	}
	_, body = c.get("/")
	if !regexp.MustCompile(`data-queue="mail">\s*<td><a [^>]*>mail</a> <span class="badge paused">paused</span>`).MatchString(body) {
		t.Errorf("the queue list does not mark mail paused:\n%s", body)
	}

	noticed()
	if err := f.p.Enqueue(ctx, &ap.Job{ID: "while-paused", Type: "ok.email", Queue: "mail"}); err != nil {
		t.Fatal(err)
	}
	noticed()
	if n := f.runs("while-paused"); n != 0 {
		t.Fatal("a job ran while its queue was paused")
	}
	if s, _ := f.p.Stats(ctx, "mail"); s.Ready != 1 {
		t.Fatalf("%+v, want the job waiting", s)
	}

	flash = c.flashOf(c.post("/resume", url.Values{"q": {"mail"}, "csrf": {tok}}))
	if !strings.Contains(flash, "Resumed queue mail") {
		t.Errorf("flash %q", flash)
	}
	waitFor(t, "the job to run after the resume", func() bool { return f.runs("while-paused") == 1 })
	_, body = c.get("/queue?q=mail")
	if strings.Contains(body, `id="paused-badge"`) || !strings.Contains(body, `id="pause-queue"`) {
		t.Fatalf("the page still shows the queue paused:\n%s", body)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"pause", "resume"}; !slices.Equal(asked, want) {
		t.Errorf("Authorize was asked %v, want %v", asked, want)
	}
}

// A paused group's jobs are held while the others run, listed with their
// count, and moved back by the resume, which says how many.
func TestPauseGroupAndResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	ctx := context.Background()
	c := newClient(t, f)
	tok := c.token("mail")
	if _, body := c.get("/queue?q=mail"); !strings.Contains(body, `id="no-paused-groups"`) {
		t.Fatalf("no paused group is not said:\n%s", body)
	}
	flash := c.flashOf(c.post("/pause", url.Values{"q": {"mail"}, "group": {"acme"}, "csrf": {tok}}))
	if !strings.Contains(flash, "Paused group acme of queue mail") {
		t.Errorf("flash %q", flash)
	}
	if g, err := f.p.PausedGroups(ctx, "mail"); err != nil || !slices.Equal(g, []string{"acme"}) {
		t.Fatalf("paused groups %v, %v; want acme", g, err)
	}
	if s, _ := f.p.Stats(ctx, "mail"); s.Paused {
		t.Fatal("pausing a group paused the queue")
	}
	noticed()
	var jobs []*ap.Job
	for i := range 3 {
		jobs = append(jobs, &ap.Job{ID: fmt.Sprintf("acme-%d", i), Type: "ok.email", Queue: "mail", Group: "acme"})
	}
	for i := range 2 {
		jobs = append(jobs, &ap.Job{ID: fmt.Sprintf("other-%d", i), Type: "ok.email", Queue: "mail", Group: "other"})
	}
	if err := f.p.EnqueueBatch(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the other group's jobs to run", func() bool { return f.runs("other-0") == 1 && f.runs("other-1") == 1 })
	held := regexp.MustCompile(`(?s)<tr class="group" data-group="acme">\s*<td class="mono name">acme</td>\s*<td class="n held">(\d+)</td>`)
	waitFor(t, "the page to show 3 jobs held for acme", func() bool {
		_, body := c.get("/queue?q=mail")
		m := held.FindStringSubmatch(body)
		return m != nil && m[1] == "3"
	})
	for i := range 3 {
		if f.runs(fmt.Sprintf("acme-%d", i)) != 0 {
			t.Fatal("a job of the paused group ran")
		}
	}
	// The queue list shows the group on its queue, and its held queue
	// not as a queue of its own (with Pause buttons on its page).
	_, body := c.get("/")
	if err := contains(body, `<span class="badge group">group acme paused, 3 held</span>`); err != nil || strings.Contains(body, `data-queue="mail.held.acme"`) {
		t.Errorf("the queue list with a paused group: %v, or its held queue is a row:\n%s", err, body)
	}

	flash = c.flashOf(c.post("/resume", url.Values{"q": {"mail"}, "group": {"acme"}, "csrf": {tok}}))
	if !strings.Contains(flash, "Resumed group acme of queue mail: moved 3 held jobs back to the queue.") {
		t.Errorf("flash %q", flash)
	}
	waitFor(t, "the held jobs to run", func() bool {
		return f.runs("acme-0") == 1 && f.runs("acme-1") == 1 && f.runs("acme-2") == 1
	})
	if _, body := c.get("/queue?q=mail"); !strings.Contains(body, `id="no-paused-groups"`) || strings.Contains(body, `data-group="acme"`) {
		t.Fatalf("acme is still listed after its resume:\n%s", body)
	}
	if _, body := c.get("/"); strings.Contains(body, "acme") {
		t.Errorf("the queue list names acme after its resume:\n%s", body)
	}
}

// A group's name reaches the page from the store, where any writer to the
// broker can put one, and from the form: either is shown as text.
func TestHostileGroupIsText(t *testing.T) {
	t.Parallel()
	b := memory.NewBroker().Connect()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, backend: b})
	ctx := context.Background()
	s, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	const hostile = `"><img src=x onerror="window.__xss=1"><script>window.__xss=2</script>`
	if _, err := s.Create(ctx, "_flow/group/mail/"+hostile, nil, 0); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, f)
	_, body := c.get("/queue?q=mail")
	checkInert := func(where, body string) {
		t.Helper()
		if n := strings.Count(body, "<script"); n != 1 {
			t.Errorf("%s: %d <script tags, want 1 (the dashboard's own)", where, n)
		}
		if strings.Contains(body, "<img") || strings.Contains(body, `onerror="`) {
			t.Errorf("%s: markup from a group's name reached the page:\n%s", where, body)
		}
	}
	checkInert("the queue's page", body)
	_, list := c.get("/")
	checkInert("the queue list", list)
	if strings.Contains(list, "window.__xss") {
		t.Errorf("the queue list shows a store key that is not a group name:\n%s", list)
	}
	// PausedGroups leaves out a key that is not a group name: a name
	// written into the store around the platform is not listed at all.
	if strings.Contains(body, "window.__xss") {
		t.Errorf("a store key that is not a group name was listed:\n%s", body)
	}
	tok := tokenRE.FindStringSubmatch(body)[1]
	for _, path := range []string{"/resume", "/pause"} {
		flash := c.flashOf(c.post(path, url.Values{"q": {"mail"}, "group": {hostile}, "csrf": {tok}}))
		if !strings.Contains(flash, "&lt;script&gt;") {
			t.Errorf("POST %s: the refusal %q does not show the name escaped", path, flash)
		}
		_, body := c.get("/queue?q=mail")
		checkInert("after POST "+path, body)
	}
	// The page says what went wrong; nothing was paused by the form.
	if g, err := f.p.PausedGroups(ctx, "mail"); err != nil || len(g) != 0 {
		t.Fatalf("paused groups %q, %v: want none (the key written to the store is not a group name)", g, err)
	}
}

// hideStore is a backend without a store (as RabbitMQ without a companion
// store): it cannot pause.
type hideStore struct{ driver.Backend }

func TestPauseWithoutStore(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, backend: hideStore{memory.NewBroker().Connect()}})
	c := newClient(t, f)
	_, body := c.get("/queue?q=mail")
	if err := contains(body, "Pausing needs the backend's store"); err != nil ||
		strings.Contains(body, `id="pause-queue"`) || strings.Contains(body, `id="group-form"`) {
		t.Fatalf("a backend without a store: %v, or pause forms offered\n%s", err, body)
	}
	tok := tokenRE.FindStringSubmatch(body)[1]
	flash := c.flashOf(c.post("/pause", url.Values{"q": {"mail"}, "csrf": {tok}}))
	if !strings.Contains(flash, "Nothing was paused. Pausing needs the backend") {
		t.Errorf("flash %q", flash)
	}
}
