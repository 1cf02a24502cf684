package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// memURL returns a memory:// URL of a broker of the test's own: every
// memory:// URL of the same name in this process shares one broker.
func memURL(t *testing.T) string {
	name := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	return fmt.Sprintf("memory://%s-%d", name, brokers.Add(1))
}

// brokers numbers the memory brokers, which outlive a test run (-count).
var brokers atomic.Int64

// ctl runs asyncctl in-process with the given stdin and returns its exit code
// and output.
func ctl(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// mustCtl is ctl that fails the test on an exit code other than want.
func mustCtl(t *testing.T, want int, stdin string, args ...string) string {
	t.Helper()
	code, out, errOut := ctl(t, stdin, args...)
	if code != want {
		t.Fatalf("asyncctl %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errOut)
	}
	return out
}

// seedJob is a job that test handlers dead-letter: a job of type "invalid"
// with reason invalid, any other with retries_exceeded after one try.
func seedJob(typ string, payload string) *ap.Job {
	return &ap.Job{Type: typ, Payload: []byte(payload), Headers: map[string]string{"tenant": "acme"}, Policy: ap.Policy{RetryLimit: ap.Limit(0)}}
}

// seed enqueues the jobs on the queue of the backend at rawURL, runs a worker
// that dead-letters every one of them, and returns once they all are dead,
// in order (one at a time, so that the dead-letter queue keeps their order).
func seed(t *testing.T, rawURL, queue string, jobs ...*ap.Job) []*ap.Job {
	t.Helper()
	ctx := context.Background()
	b, err := ap.Open(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dead := make(chan string, len(jobs))
	p, err := ap.New(b, ap.Config{
		Queues: map[string]ap.QueueConfig{queue: {Concurrency: 1, Prefetch: ap.Limit(0)}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks:  ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl.Job.ID }},
	})
	if err != nil {
		t.Fatal(err)
	}
	fail := func(_ context.Context, j *ap.Job) error {
		if j.Type == "invalid" {
			return ap.Invalid(errors.New("payload is not JSON"))
		}
		return fmt.Errorf("%s: smtp: connection refused", j.Type)
	}
	for _, typ := range []string{"email.send", "invalid", "report.build"} {
		if err := p.Handle(typ, fail); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	for _, j := range jobs {
		j.Queue = queue
		if err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-dead:
			if id != j.ID {
				t.Fatalf("dead-lettered %s, want %s", id, j.ID)
			}
		case <-time.After(time.Minute): // a safety net, not an assertion on time
			t.Fatalf("job %s was not dead-lettered", j.ID)
		}
	}
	return jobs
}

// deadIDs lists the IDs of the queue's dead letters through asyncctl.
func deadIDs(t *testing.T, url, queue string, args ...string) []string {
	t.Helper()
	code, out, errOut := ctl(t, "", append([]string{"dead", "list", "--url", url, "--queue", queue, "--all", "--json"}, args...)...)
	if code != exitOK && code != exitNotFound {
		t.Fatalf("dead list: exit %d: %s", code, errOut)
	}
	var page struct {
		DeadLetters []deadJSON `json:"dead_letters"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("dead list --json: %v\n%s", err, out)
	}
	ids := []string{}
	for _, dl := range page.DeadLetters {
		ids = append(ids, dl.ID)
	}
	return ids
}

func stats(t *testing.T, url, queue string) queueJSON {
	t.Helper()
	var qs []queueJSON
	out := mustCtl(t, exitOK, "", "queues", "--url", url, "--json", queue)
	if err := json.Unmarshal([]byte(out), &qs); err != nil || len(qs) != 1 {
		t.Fatalf("queues --json: %v\n%s", err, out)
	}
	return qs[0]
}

func ids(jobs ...*ap.Job) []string {
	out := []string{}
	for _, j := range jobs {
		out = append(out, j.ID)
	}
	return out
}

func same(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

func TestHelp(t *testing.T) {
	t.Parallel()
	out := mustCtl(t, exitOK, "", "help")
	for _, want := range []string{"dead redrive", "Exit codes:", "ASYNCPLATFORM_URL", "memory"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	if !strings.Contains(out, "?prefix=NAME") {
		t.Errorf("help does not document the Redis URL's ?prefix=:\n%s", out)
	}
	mustCtl(t, exitOK, "", "--help")
	// --json only where it changes what is printed.
	for _, name := range []string{"top", "completion", "dashboard"} {
		if out := mustCtl(t, exitOK, "", name, "--help"); strings.Contains(out, "\n  -json") {
			t.Errorf("%s --help offers --json, which it has no use for:\n%s", name, out)
		}
	}
	if out := mustCtl(t, exitOK, "", "queues", "--help"); !strings.Contains(out, "\n  -json") {
		t.Errorf("queues --help does not offer --json:\n%s", out)
	}
	pause, resume := mustCtl(t, exitOK, "", "pause", "--help"), mustCtl(t, exitOK, "", "resume", "--help")
	if strings.Contains(resume, "A paused queue keeps its jobs") || !strings.Contains(resume, "asyncctl resume emails") || !strings.Contains(pause, "exit code 3") || !strings.Contains(resume, "exit code 3") {
		t.Errorf("resume --help repeats pause's, or either does not say exit code 3:\n%s\n----\n%s", pause, resume)
	}
	if out := mustCtl(t, exitOK, "", "dead", "show", "--help"); !strings.Contains(out, "asyncctl dead show --queue emails 0193a3b2-7c1e-7d40-9a55-2f0c4e8b1a77 --json") {
		t.Errorf("dead show's --json example has no --queue:\n%s", out)
	}
	for _, cmd := range commands() {
		for _, args := range [][]string{append(strings.Fields(cmd.name), "--help"), append([]string{"help"}, strings.Fields(cmd.name)...)} {
			out := mustCtl(t, exitOK, "", args...)
			if !strings.Contains(out, "Examples:") || !strings.Contains(out, "Exit codes:") || !strings.Contains(out, "-url") {
				t.Errorf("asyncctl %s: no examples, exit codes or flags:\n%s", strings.Join(args, " "), out)
			}
		}
	}
}

func TestUsageErrors(t *testing.T) {
	// Not parallel: it replaces getenv.
	url := memURL(t)
	getenvIs(t, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"dead"}, "dead needs a subcommand: list, show, pop, redrive or purge"},
		{[]string{"dead", "drop"}, "dead needs a subcommand"},
		{[]string{"help", "nope"}, `no command "nope"`},
		{[]string{"queues", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"queues"}, "no backend URL: give --url or set ASYNCPLATFORM_URL"},
		{[]string{"queues", "--url", url, "bad/name"}, `queue name "bad/name" has '/' at byte 3`},
		{[]string{"enqueue", "--url", url, "--payload", "x"}, "--type is required"},
		{[]string{"enqueue", "--url", url, "--type", "t", "--payload", "x", "--file", "f"}, "not both"},
		{[]string{"enqueue", "--url", url, "--type", "t", "--payload", "x", "--header", "novalue"}, "is not KEY=VALUE"},
		{[]string{"dead", "list", "--url", url, "--reason", "bored"}, `--reason "bored" is not one of retries_exceeded`},
		{[]string{"dead", "list", "--url", url, "--cursor", "!!"}, "is not a cursor"},
		{[]string{"dead", "show", "--url", url}, "give one dead letter ID"},
		{[]string{"dead", "redrive", "--url", url}, "one of them"},
		{[]string{"dead", "redrive", "--url", url, "--all", "--type", "x"}, "one of them"},
		{[]string{"dead", "purge", "--url", url, "extra"}, "unexpected arguments"},
		{[]string{"queues", "--url", "nope://host"}, `no backend registered for this URL scheme "nope"`},
	} {
		code, _, errOut := ctl(t, "", tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("asyncctl %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
	}
}

// getenvIs makes $ASYNCPLATFORM_URL read as v for the test. Tests that call
// it share the variable, so they all set the same value.
func getenvIs(t *testing.T, v string) {
	t.Helper()
	old := getenv
	getenv = func(k string) string {
		if k == urlEnv {
			return v
		}
		return old(k)
	}
	t.Cleanup(func() { getenv = old })
}

func TestURLFromEnvironment(t *testing.T) {
	// Not parallel: it replaces getenv.
	getenvIs(t, memURL(t))
	mustCtl(t, exitOK, "", "enqueue", "--queue", "q", "--type", "t", "--payload", "x")
	if code, out, errOut := ctl(t, "", "queues", "q"); code != exitOK || !strings.Contains(out, "q ") {
		t.Errorf("queues with the URL from the environment: exit %d\n%s%s", code, out, errOut)
	}
}

// Credentials in the URL are never printed, errors included.
func TestCredentialsNeverPrinted(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"nope://user:s3cretpw@host:1/?key=k3yk3y",
		"nope://host/?AccountName=acct&AccountKey=k3yk3y%3D%3D",
		"nope://user:s3cret%2Fpw@host",
	} {
		code, out, errOut := ctl(t, "", "queues", "--url", raw)
		if code == exitOK {
			t.Fatalf("%s: exit 0", raw)
		}
		for _, secret := range []string{"s3cretpw", "k3yk3y", "s3cret/pw", "s3cret%2Fpw"} {
			if strings.Contains(out+errOut, secret) {
				t.Errorf("asyncctl printed %q: %s%s", secret, out, errOut)
			}
		}
	}
	if got := redactURL("amqp://guest:hunter22@127.0.0.1:5672/"); got != "amqp://guest:xxxxx@127.0.0.1:5672/" {
		t.Errorf("redactURL = %q", got)
	}
}

func TestQueues(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	seed(t, url, "emails", seedJob("email.send", "c"))
	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "emails", "--type", "email.send", "--payload", "a")
	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "emails", "--type", "email.send", "--payload", "b", "--delay", "1h")

	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "other", "--type", "t", "--payload", "c", "--delay", "1h")
	out := mustCtl(t, exitOK, "", "queues", "--url", url, "emails", "--queue", "other")
	want := regexp.MustCompile(`^QUEUE   READY  OLDEST READY  SCHEDULED  IN FLIGHT  DEAD  OLDEST DEAD
emails  1      [0-9]s  +1          0          1     [0-9]s
other   0      -             1          0          0     -
$`)
	if !want.MatchString(out) {
		t.Errorf("queues:\n%s\nwant:\n%s", out, want)
	}
	s := stats(t, url, "emails")
	if time.Since(s.OldestDead) > time.Minute {
		t.Errorf("queues --json: oldest_dead %v", s.OldestDead)
	}
	if time.Since(s.OldestReady) > time.Minute || s.ReadyWait < 0 || s.ReadyWait > 60 {
		t.Errorf("queues --json: oldest_ready %v, ready_wait_s %v", s.OldestReady, s.ReadyWait)
	}
	if s.OldestDead, s.OldestReady, s.ReadyWait = (time.Time{}), (time.Time{}), 0; !reflect.DeepEqual(s, queueJSON{Queue: "emails", Ready: 1, Scheduled: 1, Dead: 1}) {
		t.Errorf("queues --json = %+v", s)
	}

	// With no queue named, every queue of the backend; global flags before
	// the command name work too.
	url = memURL(t)
	mustCtl(t, exitNotFound, "", "--url", url, "queues")
	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "zeta", "--type", "t", "--payload", "a")
	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "alpha.x", "--type", "t", "--payload", "b", "--delay", "1h")
	var qs []queueJSON
	out = mustCtl(t, exitOK, "", "--url", url, "--json", "queues")
	if err := json.Unmarshal([]byte(out), &qs); err != nil {
		t.Fatal(err)
	}
	if len(qs) == 2 {
		qs[1].OldestReady, qs[1].ReadyWait = time.Time{}, 0
	}
	if len(qs) != 2 || !reflect.DeepEqual(qs[0], queueJSON{Queue: "alpha.x", Scheduled: 1}) || !reflect.DeepEqual(qs[1], queueJSON{Queue: "zeta", Ready: 1}) {
		t.Errorf("queues with no name: %+v", qs)
	}
	if out := mustCtl(t, exitOK, "", "--url", url, "queues"); !strings.HasPrefix(out, "QUEUE    READY") || !strings.Contains(out, "\nalpha.x  0      -             1 ") || !regexp.MustCompile(`\nzeta     1      \ds +0 `).MatchString(out) {
		t.Errorf("queues with no name:\n%s", out)
	}
}

// received starts a worker on the queue and returns the first job it gets.
func received(t *testing.T, url, queue string) *ap.Job {
	t.Helper()
	ctx := context.Background()
	b, err := ap.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make(chan *ap.Job, 1)
	p, err := ap.New(b, ap.Config{
		Queues: map[string]ap.QueueConfig{queue: {Concurrency: 1}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	p.Handle("t", func(_ context.Context, j *ap.Job) error {
		select {
		case got <- j:
		default:
		}
		return nil
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	select {
	case j := <-got:
		return j
	case <-time.After(time.Minute):
		t.Fatal("no job received")
		return nil
	}
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	file := filepath.Join(t.TempDir(), "payload.bin")
	binary := []byte{0, 1, 2, 0xff, '\n'}
	if err := os.WriteFile(file, binary, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		want  []byte
	}{
		{"flag", "", []string{"--payload", `{"to":"ann"}`}, []byte(`{"to":"ann"}`)},
		{"empty", "ignored", []string{"--payload", ""}, nil},
		{"file", "", []string{"--file", file}, binary},
		{"stdin", "from stdin\n", nil, []byte("from stdin\n")},
		{"stdin-dash", "dash", []string{"--file", "-"}, []byte("dash")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queue := "q-" + tc.name
			args := append([]string{"enqueue", "--url", url, "--queue", queue, "--type", "t", "--header", "tenant=acme", "--retry-limit", "2", "--poison-limit", "0"}, tc.args...)
			id := strings.TrimSpace(mustCtl(t, exitOK, tc.stdin, args...))
			j := received(t, url, queue)
			if j.ID != id || !bytes.Equal(j.Payload, tc.want) || j.Headers["tenant"] != "acme" || *j.Policy.RetryLimit != 2 || *j.Policy.PoisonLimit != 0 {
				t.Errorf("received %+v, want ID %s and payload %q", j, id, tc.want)
			}
		})
	}

	out := mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "later", "--type", "t", "--payload", "x", "--delay", "1h", "--id", "my-id", "--json")
	var got struct {
		ID        string    `json:"id"`
		Queue     string    `json:"queue"`
		Bytes     int       `json:"bytes"`
		NotBefore time.Time `json:"not_before"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.ID != "my-id" || got.Queue != "later" || got.Bytes != 1 || got.NotBefore.Before(time.Now()) {
		t.Errorf("enqueue --json = %s (%v)", out, err)
	}
	if s := stats(t, url, "later"); s.Scheduled != 1 || s.Ready != 0 {
		t.Errorf("a delayed job: %+v", s)
	}
}

// seedMix dead-letters five jobs: three email.send (retries_exceeded), one
// invalid (invalid), one report.build (retries_exceeded).
func seedMix(t *testing.T, url, queue string) []*ap.Job {
	return seed(t, url, queue,
		seedJob("email.send", `{"to":"a"}`), seedJob("invalid", "{{"), seedJob("email.send", `{"to":"b"}`),
		seedJob("report.build", "\x00\x01binary"), seedJob("email.send", `{"to":"c"}`))
}

func TestDeadList(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	jobs := seedMix(t, url, "q")

	out := mustCtl(t, exitOK, "", "dead", "list", "--url", url, "--queue", "q")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[2], "invalid") || !strings.Contains(lines[1], "email.send: smtp: connection refused") {
		t.Errorf("dead list:\n%s", out)
	}

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, ids(jobs...)},
		{[]string{"--type", "email.send"}, ids(jobs[0], jobs[2], jobs[4])},
		{[]string{"--reason", "invalid"}, ids(jobs[1])},
		{[]string{"--reason", "retries_exceeded", "--type", "report.build"}, ids(jobs[3])},
		{[]string{"--older-than", "1h"}, nil},
	} {
		if got := deadIDs(t, url, "q", tc.args...); !same(got, tc.want) {
			t.Errorf("dead list %v = %v, want %v", tc.args, got, tc.want)
		}
	}
	code, _, errOut := ctl(t, "", "dead", "list", "--url", url, "--queue", "q", "--older-than", "1h")
	if code != exitNotFound || !strings.Contains(errOut, "match the filter") {
		t.Errorf("dead list with nothing matching: exit %d, %s", code, errOut)
	}
	if code, _, _ := ctl(t, "", "dead", "list", "--url", url, "--queue", "empty"); code != exitNotFound {
		t.Errorf("dead list of an empty queue: exit %d", code)
	}

	// Pages of two, filtered, follow the cursor to the end.
	for _, filter := range [][]string{nil, {"--type", "email.send"}} {
		var got []string
		cursor := ""
		for range 10 {
			args := append([]string{"dead", "list", "--url", url, "--queue", "q", "--limit", "2", "--json", "--cursor", cursor}, filter...)
			var page struct {
				DeadLetters []deadJSON `json:"dead_letters"`
				Next        string     `json:"next"`
			}
			if err := json.Unmarshal([]byte(mustCtl(t, exitOK, "", args...)), &page); err != nil {
				t.Fatal(err)
			}
			if len(page.DeadLetters) > 2 {
				t.Fatalf("a page of %d", len(page.DeadLetters))
			}
			for _, dl := range page.DeadLetters {
				got = append(got, dl.ID)
			}
			if cursor = page.Next; cursor == "" {
				break
			}
		}
		want := deadIDs(t, url, "q", filter...)
		if !same(got, want) {
			t.Errorf("paged %v = %v, want %v", filter, got, want)
		}
	}
	// The table prints where the next page starts.
	if _, _, errOut := ctl(t, "", "dead", "list", "--url", url, "--queue", "q", "--limit", "2"); !strings.Contains(errOut, "more: add --cursor ") {
		t.Errorf("no cursor for the next page: %q", errOut)
	}
	// Listing changed nothing.
	if got := deadIDs(t, url, "q"); !same(got, ids(jobs...)) {
		t.Errorf("after listing: %v", got)
	}
}

func TestDeadShow(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	jobs := seedMix(t, url, "q")

	out := mustCtl(t, exitOK, "", "dead", "show", "--url", url, "--queue", "q", jobs[0].ID)
	for _, want := range []string{
		"ID:        " + jobs[0].ID, "Type:      email.send", "Reason:    retries_exceeded",
		"Tries:     1 (failures 1, crashes 0)", "tenant: acme", "Payload:   10 bytes", `{"to":"a"}`,
		"email.send: smtp: connection refused", "History:\n  try 1 at ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dead show lacks %q:\n%s", want, out)
		}
	}
	// A binary payload is a hex dump; flags may follow the ID.
	out = mustCtl(t, exitOK, "", "dead", "show", jobs[3].ID, "--url", url, "--queue", "q")
	if !strings.Contains(out, "00 01 62 69 6e 61 72 79") {
		t.Errorf("dead show of a binary payload:\n%s", out)
	}

	var dl deadJSON
	out = mustCtl(t, exitOK, "", "dead", "show", "--url", url, "--queue", "q", "--json", jobs[3].ID)
	if err := json.Unmarshal([]byte(out), &dl); err != nil {
		t.Fatal(err)
	}
	if dl.ID != jobs[3].ID || string(dl.Payload) != "\x00\x01binary" || dl.PayloadText != nil || dl.Reason != "retries_exceeded" || dl.TryCount != 1 || dl.Headers["tenant"] != "acme" {
		t.Errorf("dead show --json = %+v", dl)
	}
	code, _, errOut := ctl(t, "", "dead", "show", "--url", url, "--queue", "q", "no-such-id")
	if code != exitNotFound || !strings.Contains(errOut, `no dead letter "no-such-id"`) {
		t.Errorf("dead show of a missing ID: exit %d, %s", code, errOut)
	}
}

func TestDeadPop(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	jobs := seedMix(t, url, "q")

	// Pop the first, ignore a bad answer, redrive the second, keep the third.
	code, out, errOut := ctl(t, "p\nwhat\nr\nk\n", "dead", "pop", "--url", url, "--queue", "q")
	if code != exitOK {
		t.Fatalf("dead pop: exit %d: %s", code, errOut)
	}
	if strings.Count(out, "ID: ") != 3 || strings.Count(errOut, "[p/r/k/q]") != 4 || !strings.Contains(errOut, "popped 1, redrove 1") {
		t.Errorf("dead pop:\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
	if got := deadIDs(t, url, "q"); !same(got, ids(jobs[2:]...)) {
		t.Errorf("after pop, redrive, keep: %v, want %v", got, ids(jobs[2:]...))
	}
	if s := stats(t, url, "q"); s.Ready != 1 {
		t.Errorf("the redriven job is not ready: %+v", s)
	}

	// End of input keeps the record.
	mustCtl(t, exitOK, "", "dead", "pop", "--url", url, "--queue", "q")
	if got := deadIDs(t, url, "q"); len(got) != 3 {
		t.Errorf("after EOF: %v", got)
	}

	// --yes --max pops without asking, printing JSON lines.
	out = mustCtl(t, exitOK, "", "dead", "pop", "--url", url, "--queue", "q", "--yes", "--max", "2", "--json")
	var popped []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var dl deadJSON
		if err := json.Unmarshal([]byte(line), &dl); err != nil {
			t.Fatalf("%v: %q", err, line)
		}
		popped = append(popped, dl.ID)
	}
	if !same(popped, ids(jobs[2:4]...)) {
		t.Errorf("popped %v, want %v", popped, ids(jobs[2:4]...))
	}
	out = mustCtl(t, exitOK, "", "dead", "pop", "--url", url, "--queue", "q", "--yes")
	if !strings.HasPrefix(out, "popped "+jobs[4].ID+" email.send retries_exceeded") {
		t.Errorf("dead pop --yes: %q", out)
	}
	code, _, errOut = ctl(t, "p\n", "dead", "pop", "--url", url, "--queue", "q")
	if code != exitNotFound || !strings.Contains(errOut, `no dead letters in queue "q"`) {
		t.Errorf("dead pop of an empty queue: exit %d, %s", code, errOut)
	}
}

func TestDeadRedrive(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	jobs := seedMix(t, url, "q")

	// By ID, one missing.
	code, out, errOut := ctl(t, "", "dead", "redrive", "--url", url, "--queue", "q", jobs[1].ID, "nope")
	if code != exitOK || out != "redrove 1 dead letters to queue \"q\"\n" || !strings.Contains(errOut, `no dead letter "nope"`) {
		t.Errorf("redrive by ID: exit %d\n%s%s", code, out, errOut)
	}
	// By filter.
	out = mustCtl(t, exitOK, "", "dead", "redrive", "--url", url, "--queue", "q", "--type", "email.send", "--json")
	if !strings.Contains(out, `"redriven": 3`) {
		t.Errorf("redrive by filter: %s", out)
	}
	if got := deadIDs(t, url, "q"); !same(got, ids(jobs[3])) {
		t.Errorf("left: %v", got)
	}
	if s := stats(t, url, "q"); s.Ready != 4 || s.Dead != 1 {
		t.Errorf("after redriving 4: %+v", s)
	}
	// Nothing matches.
	if code, _, _ := ctl(t, "", "dead", "redrive", "--url", url, "--queue", "q", "--reason", "poisoned"); code != exitNotFound {
		t.Errorf("redrive of nothing: exit %d", code)
	}
	// All.
	mustCtl(t, exitOK, "", "dead", "redrive", "--url", url, "--queue", "q", "--all")
	if s := stats(t, url, "q"); s.Ready != 5 || s.Dead != 0 {
		t.Errorf("after --all: %+v", s)
	}
	if code, _, _ := ctl(t, "", "dead", "redrive", "--url", url, "--queue", "q", "--all"); code != exitNotFound {
		t.Errorf("redrive --all of an empty queue: exit %d", code)
	}
}

// --rate redrives in chunks; the test checks the count, never the time taken.
func TestDeadRedriveRate(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	seedMix(t, url, "q")
	out := mustCtl(t, exitOK, "", "dead", "redrive", "--url", url, "--queue", "q", "--all", "--rate", "4", "--json")
	if !strings.Contains(out, `"redriven": 5`) {
		t.Errorf("redrive --rate: %s", out)
	}
	if s := stats(t, url, "q"); s.Ready != 5 || s.Dead != 0 {
		t.Errorf("after redrive --rate: %+v", s)
	}
}

func TestDeadPurge(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	seedMix(t, url, "q")

	for _, answer := range []string{"n\n", "", "maybe\n"} {
		code, _, errOut := ctl(t, answer, "dead", "purge", "--url", url, "--queue", "q")
		if code != exitDeclined || !strings.Contains(errOut, `Delete 5 dead letters of queue "q" for good? [y/N]`) || !strings.Contains(errOut, "nothing deleted") {
			t.Errorf("purge answered %q: exit %d, %s", answer, code, errOut)
		}
	}
	if s := stats(t, url, "q"); s.Dead != 5 {
		t.Fatalf("declined purge deleted: %+v", s)
	}
	if out := mustCtl(t, exitOK, "yes\n", "dead", "purge", "--url", url, "--queue", "q"); out != "deleted 5 dead letters of queue \"q\"\n" {
		t.Errorf("purge: %q", out)
	}
	code, _, errOut := ctl(t, "y\n", "dead", "purge", "--url", url, "--queue", "q")
	if code != exitNotFound || strings.Contains(errOut, "[y/N]") {
		t.Errorf("purge of an empty queue asked or did not exit 3: exit %d, %s", code, errOut)
	}

	seed(t, url, "q", seedJob("email.send", "x"))
	if out := mustCtl(t, exitOK, "", "dead", "purge", "--url", url, "--queue", "q", "--yes", "--json"); !strings.Contains(out, `"purged": 1`) {
		t.Errorf("purge --yes --json: %s", out)
	}
}

// Every backend package is linked in and registers its scheme.
func TestSchemes(t *testing.T) {
	t.Parallel()
	registered := strings.Join(driver.Schemes(), ",")
	for _, s := range []string{"memory", "redis", "amqp", "nats"} {
		if !strings.Contains(","+registered+",", ","+s+",") {
			t.Logf("scheme %s:// is not registered (yet): %s", s, registered)
		}
	}
}

// Without --queue, dead list and dead show look in every queue, never in
// "default" alone: "no dead letters" is said only when no queue has one.
func TestDeadWithoutQueue(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "quiet", "--type", "t", "--payload", "x")
	code, _, errOut := ctl(t, "", "dead", "list", "--url", url)
	if code != exitNotFound || !strings.Contains(errOut, "no dead letters in any of the 1 queue the backend holds") {
		t.Errorf("dead list with no dead letters anywhere: exit %d, %s", code, errOut)
	}
	emails := seed(t, url, "emails", seedJob("email.send", "a"))
	code, out, errOut := ctl(t, "", "dead", "list", "--url", url)
	if code != exitOK || !strings.Contains(out, emails[0].ID) || !strings.Contains(errOut, "queue emails (the only one with dead letters)") {
		t.Errorf("dead list, one queue with dead letters: exit %d\n%s\n%s", code, out, errOut)
	}
	billing := seed(t, url, "billing", seedJob("report.build", "b"))
	code, _, errOut = ctl(t, "", "dead", "list", "--url", url)
	if code != exitUsage || !strings.Contains(errOut, "2 queues hold dead letters: billing, emails; name one with --queue") {
		t.Errorf("dead list, two queues with dead letters: exit %d, %s", code, errOut)
	}
	for _, j := range []*ap.Job{emails[0], billing[0]} {
		out := mustCtl(t, exitOK, "", "dead", "show", "--url", url, j.ID)
		if !strings.Contains(out, "Queue:     "+j.Queue) {
			t.Errorf("dead show %s without --queue:\n%s", j.ID, out)
		}
	}
	code, _, errOut = ctl(t, "", "dead", "show", "--url", url, "no-such-id")
	if code != exitNotFound || !strings.Contains(errOut, `no dead letter "no-such-id" in any of the 3 queues the backend holds`) {
		t.Errorf("dead show of a missing ID without --queue: exit %d, %s", code, errOut)
	}
}
