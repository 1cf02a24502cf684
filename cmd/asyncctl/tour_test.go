package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/dirstore"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/pause"
)

// tour is the new user's tour of issue 42 on the machine's Redis: what it
// enqueued, by the state each job must end in.
type tour struct {
	url   string
	want  map[string]ap.JobState // job ID → state
	dead  map[ap.Reason]string   // reason → the job ID dead-lettered for it
	queue map[string]string      // job ID → queue
}

// The tour's queues, and its paused group.
const (
	tourEmails, tourBilling, tourReports = "emails", "billing", "reports"
	tourGroup                            = "acme"
	tourUnserved                         = "outbox" // no worker serves it
)

// TestTour runs the new-user tour: hundreds of jobs over three queues, a
// paused group, a schedule, a dead letter of every reason of ap.Reasons();
// then it finds every job by state and by ID with asyncctl and with the
// dashboard, and checks that none of issue 42's quiet wrong answers come
// back (one subtest each).
func TestTour(t *testing.T) {
	t.Parallel()
	tr := runTour(t)
	t.Run("asyncctl/ByState", func(t *testing.T) {
		got := map[string]ap.JobState{}
		for _, s := range jobStates {
			for _, id := range ctlJobsInState(t, tr.url, s) {
				got[id] = s
			}
		}
		for id, want := range tr.want {
			if got[id] != want {
				t.Errorf("asyncctl jobs --state: job %s (queue %s) found in state %q, want %q", id, tr.queue[id], got[id], want)
			}
		}
	})
	t.Run("asyncctl/ByID", func(t *testing.T) {
		for id, want := range tr.want {
			var st ap.JobStatus
			out := mustCtl(t, exitOK, "", "--url", tr.url, "--json", "job", "show", id)
			if err := json.Unmarshal([]byte(out), &st); err != nil || st.State != want {
				t.Errorf("asyncctl job show %s: state %q (%v), want %q", id, st.State, err, want)
			}
		}
	})
	base := tourDashboard(t, tr.url)
	t.Run("dashboard/ByState", func(t *testing.T) {
		for _, s := range jobStates {
			code, body := httpGet(t, base+"jobs?n=500&state="+string(s))
			if code != http.StatusOK {
				t.Fatalf("GET jobs?state=%s: %d", s, code)
			}
			for id, want := range tr.want {
				if want == s && !strings.Contains(body, id) {
					t.Errorf("dashboard jobs?state=%s does not list job %s", s, id)
				}
			}
		}
	})
	t.Run("dashboard/ByID", func(t *testing.T) {
		for id, want := range tr.want {
			code, body := httpGet(t, base+"job?id="+id)
			if code != http.StatusOK || !strings.Contains(body, string(want)) {
				t.Errorf("dashboard job?id=%s: %d, want 200 naming state %q", id, code, want)
			}
		}
	})
	tr.quietWrongAnswers(t, base)
}

// quietWrongAnswers checks, one subtest each, that the quiet wrong answers
// listed in issue 42 do not recur.
func (tr *tour) quietWrongAnswers(t *testing.T, base string) {
	url := tr.url
	t.Run("DeadListEveryQueue", func(t *testing.T) {
		// Without --queue it lists every queue's, or refuses naming the
		// queues that hold some: never the default queue's alone.
		code, out, errOut := ctl(t, "", "--url", url, "--json", "dead", "list", "--all")
		for _, q := range []string{tourEmails, tourBilling, tourReports} {
			if code != exitOK && (code != exitUsage || !strings.Contains(errOut, q)) {
				t.Errorf("dead list without --queue: exit %d, and its refusal does not name queue %s: %s", code, q, errOut)
			}
			if code == exitUsage {
				out += mustCtl(t, exitOK, "", "--url", url, "--json", "dead", "list", "--all", "--queue", q)
			}
		}
		for r, id := range tr.dead {
			if !strings.Contains(out, id) {
				t.Errorf("dead list misses the %s dead letter %s (queue %s)", r, id, tr.queue[id])
			}
		}
	})
	t.Run("DeadShowEveryQueue", func(t *testing.T) {
		for r, id := range tr.dead {
			if code, _, errOut := ctl(t, "", "--url", url, "dead", "show", id); code != exitOK {
				t.Errorf("dead show %s (%s, queue %s) without --queue: exit %d: %s", id, r, tr.queue[id], code, errOut)
			}
		}
	})
	t.Run("PauseTypo", func(t *testing.T) {
		code, out, _ := ctl(t, "", "--url", url, "pause", "emials")
		if code != exitNotFound || strings.Contains(out, "paused") {
			t.Errorf("pause emials (a typo): exit %d, stdout %q; want exit %d and no word of pausing", code, out, exitNotFound)
		}
	})
	t.Run("UnknownQueueNotZeros", func(t *testing.T) {
		for _, cmd := range [][]string{{"queues", "nosuch"}, {"top", "nosuch"}} {
			if code, out, _ := ctl(t, "", append([]string{"--url", url}, cmd...)...); code != exitNotFound {
				t.Errorf("%s: exit %d, want %d (a queue nothing holds is not an empty one)\n%s", strings.Join(cmd, " "), code, exitNotFound, out)
			}
		}
	})
	t.Run("CancelledEverywhere", func(t *testing.T) {
		q := tr.queue[tr.dead[ap.ReasonCancelled]]
		out := mustCtl(t, exitOK, "", "--url", url, "--json", "dead", "list", "--all", "--queue", q, "--reason", "cancelled")
		if !strings.Contains(out, tr.dead[ap.ReasonCancelled]) {
			t.Errorf("dead list --reason cancelled misses the cancelled job:\n%s", out)
		}
		if !slices.Contains(completions(t, "bash", "asyncctl dead list --reason ca"), "cancelled") {
			t.Error("completion of --reason does not offer cancelled")
		}
		if b, err := os.ReadFile("README.md"); err != nil || !strings.Contains(string(b), "cancelled") {
			t.Errorf("cmd/asyncctl/README.md does not name the reason cancelled (%v)", err)
		}
	})
	t.Run("HeldQueueNotAQueue", func(t *testing.T) {
		var qs []queueJSON
		if err := json.Unmarshal([]byte(mustCtl(t, exitOK, "", "--url", url, "--json", "queues")), &qs); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, q := range qs {
			if _, _, held := pause.SplitHeld(q.Queue); held {
				t.Errorf("queues lists the held queue %q as a queue of its own", q.Queue)
			}
			if q.Queue == tourBilling {
				found = slices.ContainsFunc(q.Groups, func(g groupJSON) bool { return g.Group == tourGroup && g.Paused && g.Held > 0 })
			}
		}
		if !found {
			t.Errorf("queues does not show group %s of %s paused with jobs held: %+v", tourGroup, tourBilling, qs)
		}
	})
	t.Run("DeadLetterPageByJobID", func(t *testing.T) {
		for r, id := range tr.dead {
			if code, _ := httpGet(t, base+"job?id="+id); code != http.StatusOK {
				t.Errorf("dashboard job?id=%s (a %s dead letter): %d, want 200", id, r, code)
			}
		}
	})
	t.Run("EnqueuedHasStatus", func(t *testing.T) {
		// asyncctl cannot know whether the queue's workers track status:
		// --track-status says they do, and the job is waiting at once.
		out := mustCtl(t, exitOK, "", "--url", url, "--json", "enqueue", "--queue", tourUnserved, "--type", "ok", "--payload", "x", "--track-status")
		var e struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(out), &e); err != nil || e.ID == "" {
			t.Fatalf("enqueue --json: %v\n%s", err, out)
		}
		var st ap.JobStatus
		out = mustCtl(t, exitOK, "", "--url", url, "--json", "job", "show", e.ID)
		if err := json.Unmarshal([]byte(out), &st); err != nil || st.State != ap.StateWaiting {
			t.Errorf("job show of a job asyncctl enqueued, before any worker: state %q (%v), want waiting", st.State, err)
		}
	})
	t.Run("OldestReadyKnown", func(t *testing.T) {
		// The queue EnqueuedHasStatus enqueued to has a ready job no worker
		// takes: both tools say how long it has waited, on Redis known.
		q := stats(t, url, tourUnserved)
		if q.Ready < 1 || q.ReadyWait < 0 || q.OldestReady.IsZero() || time.Since(q.OldestReady) > time.Hour {
			t.Errorf("queues %s --json: ready %d, ready_wait_s %v, oldest_ready %v; want the age of its oldest ready job", tourUnserved, q.Ready, q.ReadyWait, q.OldestReady)
		}
		_, body := httpGet(t, base)
		row := regexp.MustCompile(`(?s)<tr data-queue="` + tourUnserved + `">.*?</tr>`).FindString(body)
		if m := regexp.MustCompile(`class="age oldest-ready"[^>]*>([^<]*)<`).FindStringSubmatch(row); m == nil || !regexp.MustCompile(`^\d+ (s|min|h|d)$`).MatchString(m[1]) {
			t.Errorf("dashboard queues page, queue %s: oldest ready cell %q, want an age", tourUnserved, m)
		}
	})
	t.Run("NoTimesOfOne", func(t *testing.T) {
		out := mustCtl(t, exitOK, "", "help")
		for _, c := range commands() {
			_, h, _ := ctl(t, "", c.name+" --help")
			_, h2, e2 := ctl(t, "", append(strings.Fields(c.name), "--help")...)
			out += h + h2 + e2
		}
		if m := regexp.MustCompile(`\b1 times\b`).FindString(out); m != "" {
			t.Errorf("help says %q", m)
		}
		_, pauseHelp, pe := ctl(t, "", "pause", "--help")
		_, resumeHelp, re := ctl(t, "", "resume", "--help")
		if pauseHelp+pe == resumeHelp+re {
			t.Error("resume --help repeats pause's text")
		}
	})
	t.Run("RedisUnreachable", func(t *testing.T) {
		// The binary: go-redis's logger is set up by main.
		code, out, errOut := exe(t, "redis://"+closedAddr(t)+"/0", "", "dashboard", "--listen", "127.0.0.1:0")
		if code == exitOK || out != "" {
			t.Errorf("dashboard with Redis unreachable: exit %d, stdout %q: it started anyway", code, out)
		}
		if strings.Contains(errOut, "pool.go:") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("dashboard with Redis unreachable: want one line on stderr, none of go-redis's own:\n%s", errOut)
		}
	})
	// Last: it changes a dead letter.
	t.Run("RedriveChangesStatus", func(t *testing.T) {
		id := tr.dead[ap.ReasonRetriesExceeded]
		mustCtl(t, exitOK, "", "--url", url, "dead", "redrive", "--queue", tr.queue[id], id)
		var st ap.JobStatus
		out := mustCtl(t, exitOK, "", "--url", url, "--json", "job", "show", id)
		if err := json.Unmarshal([]byte(out), &st); err != nil || st.State == ap.StateDeadLettered {
			t.Errorf("job show after its redrive: state %q (%v), want anything but dead_lettered", st.State, err)
		}
	})
}

// runTour enqueues the tour on a Redis prefix of the test's own, runs it
// on one worker, and returns once every job is where it will stay.
func runTour(t *testing.T) *tour {
	t.Helper()
	url := prefixedRedis(t)
	t.Cleanup(func() { dropPrefix(t, url) })
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	payloads, err := dirstore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	open := func() driver.Backend {
		b, err := ap.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	cfg := ap.Config{
		TrackStatus: true, Logger: quiet, WorkerName: "tour",
		Policy:           ap.Policy{RetryLimit: ap.Limit(0)},
		UnhandledRetries: ap.Limit(0),
		PayloadStore:     payloads, OffloadThreshold: 1024,
		Queues: map[string]ap.QueueConfig{
			tourEmails: {Concurrency: 4}, tourBilling: {Concurrency: 4}, tourReports: {Concurrency: 4},
		},
	}
	producer, err := ap.New(open(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &tour{url: url, want: map[string]ap.JobState{}, dead: map[ap.Reason]string{}, queue: map[string]string{}}
	add := func(j *ap.Job, want ap.JobState) *ap.Job {
		t.Helper()
		if err := producer.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		tr.want[j.ID], tr.queue[j.ID] = want, j.Queue
		return j
	}
	dead := func(r ap.Reason, j *ap.Job) {
		add(j, ap.StateDeadLettered)
		tr.dead[r] = j.ID
	}

	// Poisoned: its first delivery is taken and dropped before the worker
	// starts, so the worker's is a crash over PoisonLimit 0.
	dead(ap.ReasonPoisoned, &ap.Job{Queue: tourReports, Type: "ok", Policy: ap.Policy{PoisonLimit: ap.Limit(0)}})
	raw := open()
	lease := max(raw.Capabilities().MinLease, 500*time.Millisecond)
	if ds, err := raw.Receive(ctx, tourReports, 1, lease); err != nil || len(ds) != 1 {
		t.Fatalf("taking the poisoned job's first delivery: %d, %v", len(ds), err)
	}
	// Hundreds of jobs that succeed, and some scheduled an hour ahead.
	for i := range 300 {
		q := []string{tourEmails, tourBilling, tourReports}[i%3]
		add(&ap.Job{Queue: q, Type: "ok", Payload: []byte(fmt.Sprint(i))}, ap.StateSucceeded)
	}
	for i := range 15 {
		q := []string{tourEmails, tourBilling, tourReports}[i%3]
		add(&ap.Job{Queue: q, Type: "ok", NotBefore: time.Now().Add(time.Hour)}, ap.StateScheduled)
	}
	// A paused group: its jobs are held, waiting.
	if err := producer.PauseGroup(ctx, tourBilling, tourGroup); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		add(&ap.Job{Queue: tourBilling, Type: "ok", Group: tourGroup}, ap.StateWaiting)
	}
	// A dead letter of every reason.
	var redriven atomic.Bool
	dead(ap.ReasonRetriesExceeded, &ap.Job{Queue: tourEmails, Type: "fail-until-redriven"})
	dead(ap.ReasonInvalid, &ap.Job{Queue: tourEmails, Type: "invalid"})
	dead(ap.ReasonPermanent, &ap.Job{Queue: tourBilling, Type: "permanent"})
	dead(ap.ReasonUnhandled, &ap.Job{Queue: tourBilling, Type: "nohandler"})
	dead(ap.ReasonExpired, &ap.Job{Queue: tourReports, Type: "ok", Deadline: time.Now().Add(lease / 2)})
	missing := add(&ap.Job{Queue: tourReports, Type: "ok", Payload: []byte(strings.Repeat("x", 4096))}, ap.StateDeadLettered)
	tr.dead[ap.ReasonPayloadMissing] = missing.ID
	refs, err := payloads.Refs() // the only payload offloaded
	if err != nil || len(refs) != 1 {
		t.Fatalf("offloaded payloads: %q, %v; want the one of job %s", refs, err, missing.ID)
	}
	if err := payloads.Delete(ctx, refs[0]); err != nil {
		t.Fatal(err)
	}
	cancelled := add(&ap.Job{Queue: tourEmails, Type: "block"}, ap.StateCancelled)
	tr.dead[ap.ReasonCancelled] = cancelled.ID
	time.Sleep(lease) // the poisoned delivery's lease and the expired job's deadline pass

	worker, err := ap.New(open(), func() ap.Config {
		c := cfg
		c.Schedules = []ap.Schedule{{Name: "tour-nightly", Every: time.Hour, Job: ap.Job{Queue: tourReports, Type: "ok"}}}
		return c
	}())
	if err != nil {
		t.Fatal(err)
	}
	handlers := map[string]ap.Handler{
		"ok":        func(context.Context, *ap.Job) error { return nil },
		"invalid":   func(context.Context, *ap.Job) error { return ap.Invalid(errors.New("payload is not JSON")) },
		"permanent": func(context.Context, *ap.Job) error { return ap.Permanent(errors.New("account closed")) },
		"block":     func(ctx context.Context, _ *ap.Job) error { <-ctx.Done(); return ctx.Err() },
		"fail-until-redriven": func(context.Context, *ap.Job) error {
			if redriven.Load() {
				return nil
			}
			return errors.New("smtp: connection refused")
		},
	}
	for typ, h := range handlers {
		if err := worker.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := worker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = worker.Stop(context.Background()) })
	wf := ap.NewWorkflow("").
		Add("charge", &ap.Job{Queue: tourBilling, Type: "fail-until-redriven"}).
		Add("receipt", &ap.Job{Queue: tourBilling, Type: "ok"}, "charge")
	if err := worker.EnqueueWorkflow(ctx, wf); err != nil {
		t.Fatal(err)
	}

	reader := readerOf(t, url)
	waitState(t, reader, cancelled.ID, ap.StateRunning)
	mustCtl(t, exitOK, "", "--url", url, "job", "cancel", cancelled.ID)
	wst := waitWorkflow(t, worker, wf.ID)
	for _, s := range wst.Steps {
		st := ap.StateDeadLettered
		if s.Name == "receipt" {
			tr.dead[ap.ReasonDependencyFailed] = s.JobID
		}
		tr.want[s.JobID], tr.queue[s.JobID] = st, tourBilling
	}
	for id, want := range tr.want {
		waitState(t, reader, id, want)
	}
	for _, r := range ap.Reasons() {
		if tr.dead[r] == "" {
			t.Fatalf("the tour has no dead letter of reason %s", r)
		}
	}
	// Every dead letter is in its dead-letter queue with its reason.
	for r, id := range tr.dead {
		var dl deadJSON
		out := mustCtl(t, exitOK, "", "--url", url, "--json", "dead", "show", "--queue", tr.queue[id], id)
		if err := json.Unmarshal([]byte(out), &dl); err != nil || dl.Reason != string(r) {
			t.Fatalf("dead show %s: reason %q (%v), want %s", id, dl.Reason, err, r)
		}
	}
	redriven.Store(true)
	return tr
}

// ctlJobsInState lists, with asyncctl, the IDs of every tracked job in
// state s, page by page.
func ctlJobsInState(t *testing.T, url string, s ap.JobState) []string {
	t.Helper()
	var ids []string
	cursor := ""
	for range 100 {
		args := []string{"--url", url, "--json", "jobs", "--state", string(s), "--limit", "500"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		code, out, errOut := ctl(t, "", args...)
		if code != exitOK && code != exitNotFound {
			t.Fatalf("jobs --state %s: exit %d: %s", s, code, errOut)
		}
		var page struct {
			Jobs []ap.JobStatus `json:"jobs"`
			Next string         `json:"next"`
		}
		if code == exitOK {
			if err := json.Unmarshal([]byte(out), &page); err != nil {
				t.Fatalf("jobs --json: %v\n%s", err, out)
			}
		}
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		if cursor = page.Next; cursor == "" {
			return ids
		}
	}
	t.Fatalf("jobs --state %s: more than 100 pages", s)
	return nil
}

// tourDashboard runs asyncctl dashboard on url until the test ends and
// returns its base URL.
func tourDashboard(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, []string{"--url", url, "dashboard", "--listen", "127.0.0.1:0", "--read-only"}, strings.NewReader(""), pw, io.Discard)
		pw.Close()
	}()
	t.Cleanup(func() { cancel(); <-done })
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("asyncctl dashboard printed no address: %v", err)
	}
	go io.Copy(io.Discard, pr)
	m := regexp.MustCompile(`(http://127\.0\.0\.1:\d+/)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("asyncctl dashboard printed %q", line)
	}
	return m[1]
}

// httpGet returns the status and body of a GET of u.
func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitWorkflow waits until the workflow is done.
func waitWorkflow(t *testing.T, p *ap.Platform, id string) ap.WorkflowStatus {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // a safety net, not an assertion on time
	for {
		st, err := p.WorkflowStatus(context.Background(), id)
		if err == nil && st.Done() {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("workflow %s: %+v, %v; not done", id, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dropPrefix deletes every key of the Redis at rawURL under its prefix=:
// the tour's queues, its status records and the rest of its store.
func dropPrefix(t *testing.T, rawURL string) {
	addr, query, _ := strings.Cut(rawURL, "?")
	prefix := strings.TrimPrefix(query, "prefix=")
	opts, err := goredis.ParseURL(addr)
	if err != nil || prefix == "" || strings.ContainsAny(prefix, "*?[]&") {
		t.Errorf("cleanup of %s: %v", rawURL, err)
		return
	}
	rdb := goredis.NewClient(opts)
	defer rdb.Close()
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Logf("cleanup of %s: %v", rawURL, err)
	}
}
