package main

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// asyncctl jobs lists jobs by state and type, paged by its cursor: a
// queue's waiting, scheduled, retrying and running jobs from the broker
// (its platform tracks no queue's status), in line, and with --source
// status, or without a queue, from the status records; --counts counts
// tracked jobs.
func TestJobsList(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	p := readerOf(t, url)
	ctx := context.Background()
	var waiting []string
	for i := range 3 {
		j := &ap.Job{Type: "mail", Queue: "emails"}
		if i == 2 {
			j.Type = "sms"
		}
		if err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		waiting = append(waiting, j.ID)
	}
	later := &ap.Job{Type: "mail", Queue: "emails", NotBefore: time.Now().Add(time.Hour)}
	if err := p.Enqueue(ctx, later); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		source, want string
		ids          []string
	}{{"", "broker", waiting}, {"status", "status", sorted(waiting)}} {
		var got []string
		cursor := ""
		for range 10 {
			args := []string{"jobs", "--url", url, "--json", "--queue", "emails", "--state", "waiting", "--limit", "1"}
			if c.source != "" {
				args = append(args, "--source", c.source)
			}
			if cursor != "" {
				args = append(args, "--cursor", cursor)
			}
			out := mustCtl(t, exitOK, "", args...)
			var page struct {
				Jobs   []ap.JobStatus `json:"jobs"`
				Next   string         `json:"next"`
				Source string         `json:"source"`
			}
			if err := json.Unmarshal([]byte(out), &page); err != nil {
				t.Fatal(err)
			}
			if page.Source != c.want {
				t.Fatalf("--source %q: read from %q, want %q", c.source, page.Source, c.want)
			}
			for _, j := range page.Jobs {
				got = append(got, j.ID)
			}
			if cursor = page.Next; cursor == "" {
				break
			}
		}
		if strings.Join(got, ",") != strings.Join(c.ids, ",") {
			t.Fatalf("--source %q: waiting jobs listed: %v, want %v", c.source, got, c.ids)
		}
	}
	_, table, errOut := ctl(t, "", "jobs", "--url", url, "--queue", "emails", "--state", "waiting")
	if !strings.Contains(errOut, "from the broker") || !strings.Contains(table, "ENQUEUED") {
		t.Fatalf("a table from the broker does not say so:\n%s\n%s", table, errOut)
	}
	out := mustCtl(t, exitOK, "", "jobs", "--url", url, "--queue", "emails", "--state", "scheduled")
	if !strings.Contains(out, later.ID) || strings.Count(out, "\n") != 2 {
		t.Fatalf("scheduled jobs:\n%s", out)
	}
	out = mustCtl(t, exitOK, "", "jobs", "--url", url, "--type", "sms")
	if strings.Count(out, "\n") != 2 || !strings.Contains(out, waiting[2]) {
		t.Fatalf("jobs of type sms:\n%s", out)
	}
	out = mustCtl(t, exitOK, "", "jobs", "--url", url, "--counts")
	if !strings.Contains(out, "WAITING") || !regexpLine(out, `^emails +3 +1 +0`) {
		t.Fatalf("jobs --counts:\n%s", out)
	}
	code, _, errOut := ctl(t, "", "jobs", "--url", url, "--queue", "emails", "--state", "retrying")
	if code != exitNotFound || !strings.Contains(errOut, "on the broker") {
		t.Fatalf("no retrying jobs: exit %d, %s", code, errOut)
	}
	code, _, errOut = ctl(t, "", "jobs", "--url", url, "--queue", "emails", "--state", "retrying", "--source", "status")
	if code != exitNotFound || !strings.Contains(errOut, "only the jobs of queues that track status") {
		t.Fatalf("no retrying jobs in the status records: exit %d, %s", code, errOut)
	}
	for _, args := range [][]string{{"--state", "done"}, {"--limit", "0"}, {"--limit", "501"}, {"--cursor", "a/b"}, {"--counts", "--state", "waiting"},
		{"--source", "disk"}, {"--source", "broker"}, {"--queue", "emails", "--state", "waiting", "--cursor", "a/b"}, {"--counts", "--source", "status"}} {
		code, _, errOut := ctl(t, "", append([]string{"jobs", "--url", url}, args...)...)
		if code != exitUsage {
			t.Errorf("jobs %v: exit %d, want %d: %s", args, code, exitUsage, errOut)
		}
	}
}

// A status record with control characters in every field (written to the
// store by anyone who can write to it) is printed escaped, in the table,
// in JSON and in the counts.
func TestJobsHostile(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	b, err := ap.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	s, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	rec := map[string]any{
		"id": "id" + hostile, "queue": "q" + hostile, "type": "type" + hostile, "state": "waiting",
		"error": "error" + hostile, "reason": "reason" + hostile, "worker": "w" + hostile, "updated_at": time.Now(),
	}
	v, _ := json.Marshal(rec)
	if _, err := s.Create(context.Background(), kv.Status.Prefix()+"job/hostile", v, 0); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{}, {"--json"}, {"--counts"}, {"--counts", "--json"}, {"--type", "type" + hostile}} {
		out := mustCtl(t, exitOK, "", append([]string{"jobs", "--url", url}, args...)...)
		if r := raw(out); len(r) > 0 || !strings.Contains(out, "type") && !strings.Contains(out, "WAITING") && !strings.Contains(out, "waiting") {
			t.Errorf("jobs %q prints %v raw:\n%s", args, r, out)
		}
	}
	code, _, errOut := ctl(t, "", "jobs", "--url", url, "--state", "running\x1b[2J")
	if r := raw(errOut); code != exitUsage || len(r) > 0 {
		t.Errorf("a hostile --state: exit %d, %v raw:\n%s", code, r, errOut)
	}
}

func sorted(ss []string) []string {
	out := slices.Clone(ss)
	slices.Sort(out)
	return out
}

// regexpLine reports whether a line of s matches the regular expression re.
func regexpLine(s, re string) bool {
	return regexp.MustCompile("(?m)" + re).MatchString(s)
}

// A message forged on the broker (a valid envelope with control
// characters in its ID, type and error) is printed escaped when jobs
// are read from the broker, in the table and in JSON; a body that is not
// a job is skipped and counted.
func TestJobsHostileBrowsed(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	b, err := ap.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	forged := wire.EncodeJob(&wire.Job{ID: "id" + hostile, Type: "type" + hostile, Errors: []string{"error" + hostile}, Failures: 1, NotBefore: time.Now().Add(time.Hour)})
	if err := b.Enqueue(context.Background(), "emails", []driver.Message{
		{ID: "a", Body: forged},
		{ID: "b", Body: []byte("junk" + hostile)},
		{ID: "c", Body: forged, NotBefore: time.Now().Add(time.Hour)},
	}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--state", "waiting"}, {"--state", "waiting", "--json"}, {"--state", "retrying"}, {"--state", "retrying", "--json"}} {
		code, out, errOut := ctl(t, "", append([]string{"jobs", "--url", url, "--queue", "emails"}, args...)...)
		if r := raw(out + errOut); code != exitOK || len(r) > 0 || !strings.Contains(out, "type") {
			t.Errorf("jobs %q: exit %d, prints %v raw:\n%s\n%s", args, code, r, out, errOut)
		}
		if args[1] == "waiting" && len(args) == 2 && !strings.Contains(errOut, "skipped 1 messages") {
			t.Errorf("jobs %q does not count the message that is not a job:\n%s", args, errOut)
		}
	}
}
