package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/dashboard"
	"github.com/asyncplatform/asyncplatform/driver"
)

// countingBackend counts the dead-letter records its ListDead returns.
type countingBackend struct {
	*memory.Backend
	listed atomic.Int64
}

func (b *countingBackend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	recs, next, err := b.Backend.ListDead(ctx, queue, cursor, limit)
	b.listed.Add(int64(len(recs)))
	return recs, next, err
}

// lastLetterRE finds a letter page's link with its position hint.
var letterHrefRE = regexp.MustCompile(`<a href="([^"]*/letter\?[^"]*)">([^<]+)</a>`)

// TestLookupByIDBounded: the page of one dead letter (/letter, /raw) named
// by an ID it cannot find reads at most LookupLimit records, not the whole
// dead-letter queue, and says how far it looked; a record past the limit
// still opens from a listing's link, whose position hint takes it to its
// page.
func TestLookupByIDBounded(t *testing.T) {
	t.Parallel()
	const n, limit = 2500, dashboard.DefaultLookupLimit
	b := &countingBackend{Backend: memory.NewBroker().Connect()}
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, backend: b, config: dashboard.Config{PageSize: 100}})
	f.enqueue("mail", n, failing(n)...)
	c := newClient(t, f)

	for _, path := range []string{"/letter?q=mail&id=no-such-record", "/raw?q=mail&id=no-such-record"} {
		before := b.listed.Load()
		resp, body := c.get(path)
		read := b.listed.Load() - before
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
		}
		if read > limit {
			t.Errorf("GET %s read %d of the %d dead letters, want at most %d (LookupLimit)", path, read, n, limit)
		}
		if strings.HasPrefix(path, "/letter") && !strings.Contains(body, "first 1000 dead letters") {
			t.Errorf("GET %s: the page does not say how far it looked:\n%s", path, body)
		}
	}

	// The last record, past the limit: by ID alone it is not found; from
	// its listing's link it is.
	all := f.deadLetters("mail")
	last := all[len(all)-1].ID
	if resp, _ := c.get("/letter?q=mail&id=" + last); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /letter for the record at %d without its position: %d, want 404 (past LookupLimit)", n, resp.StatusCode)
	}
	var link string
	for next := "/queue?q=mail"; next != "" && link == ""; {
		_, body := c.get(next)
		for _, m := range letterHrefRE.FindAllStringSubmatch(body, -1) {
			if m[2] == last {
				link = strings.ReplaceAll(m[1], "&amp;", "&")
			}
		}
		next = ""
		if m := nextRE.FindStringSubmatch(body); m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if link == "" {
		t.Fatalf("no listing page links to %s", last)
	}
	link = strings.TrimPrefix(link, f.base)
	before := b.listed.Load()
	if resp, _ := c.get(link); resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s (the last record, from its listing): %d, want 200", link, resp.StatusCode)
	}
	if read := b.listed.Load() - before; read > limit {
		t.Errorf("opening the last record from its listing read %d records, want at most %d", read, limit)
	}
}

// A dead letter's page opens by its job's ID too, not only by the record's
// own ID (the job's ID and its copy number).
func TestLetterByJobID(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	job := &ap.Job{ID: "job-by-id", Type: "fail.email", Payload: []byte(`{}`)}
	f.enqueue("mail", 1, job)
	// Redriven and dead-lettered again, its record's ID has a copy number.
	if _, err := f.p.Redrive(context.Background(), "mail"); err != nil {
		t.Fatal(err)
	}
	f.waitDead("mail", 1)
	dl := f.deadLetters("mail")[0]
	if dl.ID == dl.Job.ID {
		t.Fatalf("the record's ID %q is its job's", dl.ID)
	}
	c := newClient(t, f)
	for _, id := range []string{dl.ID, dl.Job.ID} {
		resp, body := c.get("/letter?q=mail&id=" + url.QueryEscape(id))
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "job-by-id") {
			t.Errorf("GET /letter by %q: %d", id, resp.StatusCode)
		}
		if resp, _ := c.get("/raw?q=mail&id=" + url.QueryEscape(id)); resp.StatusCode != http.StatusOK {
			t.Errorf("GET /raw by %q: %d", id, resp.StatusCode)
		}
	}
}

// A dead letter's page opened by a record's own ID shows that record, even
// when an earlier record's job has that ID (a job named "v.1" redriven and
// dead again has the record "v.1.1"; job "v"'s second record is "v.1").
func TestLetterByOwnIDFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}})
	f.enqueue("mail", 1, &ap.Job{ID: "v.1", Type: "fail.email", Payload: []byte(`{}`)})
	if _, err := f.p.Redrive(ctx, "mail", "v.1"); err != nil {
		t.Fatal(err)
	}
	f.waitDead("mail", 1)
	f.enqueue("mail", 2, &ap.Job{ID: "v", Type: "fail.email", Payload: []byte(`{}`)})
	if _, err := f.p.Redrive(ctx, "mail", "v"); err != nil {
		t.Fatal(err)
	}
	f.waitDead("mail", 2)
	var ids []string
	for _, dl := range f.deadLetters("mail") {
		ids = append(ids, dl.ID+" (job "+dl.Job.ID+")")
	}
	if strings.Join(ids, ", ") != "v.1.1 (job v.1), v.1 (job v)" {
		t.Fatalf("records %v: the setting is not the one this test needs", ids)
	}
	c := newClient(t, f)
	_, body := c.get("/letter?q=mail&id=v.1")
	if !strings.Contains(body, `name="id" value="v.1">`) {
		t.Errorf("GET /letter by the record ID v.1 shows another record: its forms act on %v", regexp.MustCompile(`name="id" value="[^"]*"`).FindAllString(body, -1))
	}
}
