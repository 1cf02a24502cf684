package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// trackedWorker starts a status-tracking platform on the backend at url,
// with the given handlers, stopped at the end of the test.
func trackedWorker(t *testing.T, url, worker string, handlers map[string]ap.Handler) *ap.Platform {
	t.Helper()
	ctx := context.Background()
	b, err := ap.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	p, err := ap.New(b, ap.Config{
		TrackStatus: true,
		WorkerName:  worker,
		Policy:      ap.Policy{RetryLimit: ap.Limit(0)},
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range handlers {
		if err := p.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

// readerOf returns a platform on url that is not started: it reads the
// statuses other processes (asyncctl) read, not a worker's own view, which
// shows an end before the worker's status writer has written it.
func readerOf(t *testing.T, url string) *ap.Platform {
	t.Helper()
	b, err := ap.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	r, err := ap.New(b, ap.Config{TrackStatus: true})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func waitState(t *testing.T, p *ap.Platform, id string, want ap.JobState) ap.JobStatus {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // a safety net, not an assertion on time
	for {
		st, err := p.Status(context.Background(), id)
		if err == nil && st.State == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %q: %+v, %v; want %s", id, st, err, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestJobShow(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	p := trackedWorker(t, url, "w1", map[string]ap.Handler{
		"ok": func(_ context.Context, j *ap.Job) error {
			j.SetResult([]byte(`{"n":5}`))
			return nil
		},
		"bin":  func(_ context.Context, j *ap.Job) error { j.SetResult([]byte{0, 1, 'b', 'i', 'n'}); return nil },
		"fail": func(context.Context, *ap.Job) error { return errors.New("smtp: connection refused") },
	})
	ctx := context.Background()
	ok, bin, fail := &ap.Job{Type: "ok"}, &ap.Job{Type: "bin"}, &ap.Job{Type: "fail"}
	for _, j := range []*ap.Job{ok, bin, fail} {
		if err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	reader := readerOf(t, url) // what asyncctl, another process, reads
	waitState(t, reader, ok.ID, ap.StateSucceeded)
	waitState(t, reader, bin.ID, ap.StateSucceeded)
	waitState(t, reader, fail.ID, ap.StateDeadLettered)

	out := mustCtl(t, exitOK, "", "job", "show", "--url", url, ok.ID)
	for _, want := range []string{"ID:        " + ok.ID, "Type:      ok", "Queue:     default", "State:     succeeded", "Tries:     1 (failures 0, crashes 0)", "Worker:    w1", "Result:    7 bytes", `{"n":5}`, "Enqueued:  ", "Started:   "} {
		if !strings.Contains(out, want) {
			t.Errorf("job show lacks %q:\n%s", want, out)
		}
	}
	out = mustCtl(t, exitOK, "", "job", "show", bin.ID, "--url", url) // flags after the ID
	if !strings.Contains(out, "00 01 62 69 6e") {
		t.Errorf("job show of a binary result:\n%s", out)
	}
	out = mustCtl(t, exitOK, "", "job", "show", "--url", url, fail.ID)
	for _, want := range []string{"State:     dead_lettered (retries_exceeded)", "Error:     smtp: connection refused", "Tries:     1 (failures 1, crashes 0)",
		"History:\n", "  waiting        try 0\n", "  running        try 1\n", "  dead_lettered  try 1  retries_exceeded\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("job show of a dead letter lacks %q:\n%s", want, out)
		}
	}
	var st ap.JobStatus
	out = mustCtl(t, exitOK, "", "job", "show", "--url", url, "--json", ok.ID)
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if st.ID != ok.ID || st.State != ap.StateSucceeded || string(st.Result) != `{"n":5}` {
		t.Errorf("job show --json = %+v", st)
	}
	if n := len(st.History); n != 3 || st.History[n-1].State != ap.StateSucceeded || st.History[n-1].Try != 1 {
		t.Errorf("job show --json: history %+v; want waiting, running, succeeded", st.History)
	}
	code, _, errOut := ctl(t, "", "job", "show", "--url", url, "no-such-id")
	if code != exitNotFound || !strings.Contains(errOut, `no status for job "no-such-id"`) {
		t.Errorf("job show of a missing ID: exit %d, %s", code, errOut)
	}
	for _, args := range [][]string{{"job", "show"}, {"job", "show", "a", "b"}, {"job", "cancel"}} {
		if code, _, _ := ctl(t, "", append(args, "--url", url)...); code != exitUsage {
			t.Errorf("asyncctl %q: exit %d, want %d", args, code, exitUsage)
		}
	}
	if code, _, errOut := ctl(t, "", "job", "--url", url); code != exitUsage || !strings.Contains(errOut, "show or cancel") {
		t.Errorf("asyncctl job: exit %d, %s", code, errOut)
	}
}

func TestJobCancel(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	started := make(chan struct{}, 1)
	p := trackedWorker(t, url, "w1", map[string]ap.Handler{
		"long": func(ctx context.Context, _ *ap.Job) error {
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		},
	})
	ctx := context.Background()
	running := &ap.Job{Type: "long"}
	later := &ap.Job{Type: "long", NotBefore: time.Now().Add(time.Hour)}
	for _, j := range []*ap.Job{running, later} {
		if err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	<-started
	// The worker shows the job running at once; other processes once its
	// poll has written the running state (a handler running a poll interval).
	reader := readerOf(t, url)
	waitState(t, reader, running.ID, ap.StateRunning)

	out := mustCtl(t, exitOK, "", "job", "cancel", "--url", url, running.ID)
	if !strings.Contains(out, "cancel requested for job "+running.ID+" (running)") {
		t.Errorf("job cancel of a running job: %s", out)
	}
	st := waitState(t, reader, running.ID, ap.StateCancelled)
	if st.Reason != ap.ReasonCancelled || st.Failures != 0 {
		t.Errorf("after job cancel: %+v", st)
	}
	code, _, errOut := ctl(t, "", "job", "cancel", "--url", url, running.ID)
	if code != exitError || !strings.Contains(errOut, "finished already (cancelled)") {
		t.Errorf("job cancel of a cancelled job: exit %d, %s", code, errOut)
	}

	out = mustCtl(t, exitOK, "", "job", "cancel", "--url", url, later.ID)
	if !strings.Contains(out, "(scheduled): it will not run") {
		t.Errorf("job cancel of a scheduled job: %s", out)
	}
	out = mustCtl(t, exitOK, "", "job", "show", "--url", url, later.ID)
	if !strings.Contains(out, "State:     scheduled, cancel requested") {
		t.Errorf("job show after cancel: %s", out)
	}
	mustCtl(t, exitOK, "", "job", "cancel", "--url", url, later.ID) // twice is not an error

	code, _, _ = ctl(t, "", "job", "cancel", "--url", url, "no-such-id")
	if code != exitNotFound {
		t.Errorf("job cancel of a missing ID: exit %d", code)
	}
}

// TestJobHostile: a status whose fields would act on a terminal is printed
// escaped, in text and in JSON.
func TestJobHostile(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	typ := "type" + hostile
	p := trackedWorker(t, url, "worker"+hostile, map[string]ap.Handler{
		typ: func(_ context.Context, j *ap.Job) error {
			j.SetResult([]byte("result" + hostile))
			return errors.New("error" + hostile)
		},
	})
	job := &ap.Job{ID: "id" + hostile, Type: typ}
	if err := p.Enqueue(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	waitState(t, readerOf(t, url), job.ID, ap.StateDeadLettered)
	out := mustCtl(t, exitOK, "", "job", "show", "--url", url, job.ID)
	if r := raw(out); len(r) > 0 {
		t.Errorf("job show prints %v raw:\n%s", r, out)
	}
	if n := strings.Count(out, "\nState:"); n != 1 {
		t.Errorf("job show: %d State lines:\n%s", n, out)
	}
	out = mustCtl(t, exitOK, "", "job", "show", "--url", url, "--json", job.ID)
	if r := raw(out); len(r) > 0 {
		t.Errorf("job show --json prints %v raw:\n%s", r, out)
	}
	var st ap.JobStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.ID != job.ID || st.Worker != "worker"+hostile || st.Type != typ {
		t.Errorf("job show --json does not read back: %+v, %v", st, err)
	}
	// A forged status whose history would act on a terminal.
	b, err := ap.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	forged, _ := json.Marshal(map[string]any{"id": "forged", "queue": "q", "type": "t", "state": "retrying", "updated_at": now,
		"history": map[string]any{"dropped": 3, "changes": []map[string]any{
			{"state": "retrying", "at": now, "try": 1, "reason": "reason" + hostile},
			{"state": "running" + hostile, "at": now}, // not a state: dropped
		}}})
	if _, err := s.Create(context.Background(), kv.Status.Prefix()+"job/forged", forged, time.Minute); err != nil {
		t.Fatal(err)
	}
	out = mustCtl(t, exitOK, "", "job", "show", "--url", url, "forged")
	if r := raw(out); len(r) > 0 {
		t.Errorf("job show of a forged history prints %v raw:\n%s", r, out)
	}
	if !strings.Contains(out, "(4 earlier changes not kept") || strings.Count(out, "  try ") != 1 {
		t.Errorf("job show of a forged history: want 1 change shown, 4 dropped:\n%s", out)
	}
	out = mustCtl(t, exitOK, "", "job", "show", "--url", url, "--json", "forged")
	if r := raw(out); len(r) > 0 {
		t.Errorf("job show --json of a forged history prints %v raw:\n%s", r, out)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.History) != 1 || st.History[0].Reason != "reason"+hostile || st.HistoryDropped != 4 {
		t.Errorf("job show --json of a forged history does not read back: %+v, %v", st, err)
	}

	code, _, errOut := ctl(t, "", "job", "cancel", "--url", url, job.ID)
	if r := raw(errOut); code != exitError || len(r) > 0 {
		t.Errorf("job cancel of a finished job: exit %d, %v raw:\n%s", code, r, errOut)
	}
	code, _, errOut = ctl(t, "", "job", "show", "--url", url, "no"+hostile)
	if r := raw(errOut); code != exitNotFound || len(r) > 0 {
		t.Errorf("job show of a missing hostile ID: exit %d, %v raw:\n%s", code, r, errOut)
	}
}

// After a redrive by asyncctl (which tracks no queue itself), job show says
// the job waits again, not dead_lettered, and then follows its new run.
func TestJobShowAfterRedrive(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	var runs atomic.Int32
	p := trackedWorker(t, url, "w1", map[string]ap.Handler{
		"once": func(context.Context, *ap.Job) error {
			if runs.Add(1) == 1 {
				return errors.New("first try fails")
			}
			return nil
		},
	})
	job := &ap.Job{Type: "once"}
	if err := p.Enqueue(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	reader := readerOf(t, url)
	waitState(t, reader, job.ID, ap.StateDeadLettered)
	mustCtl(t, exitOK, "", "pause", "--url", url, "default") // the redriven job waits
	time.Sleep(2 * ap.PausePoll)                             // the worker reads the pause
	mustCtl(t, exitOK, "", "dead", "redrive", "--url", url, "--queue", "default", job.ID)
	var st ap.JobStatus
	if err := json.Unmarshal([]byte(mustCtl(t, exitOK, "", "job", "show", "--url", url, "--json", job.ID)), &st); err != nil {
		t.Fatal(err)
	}
	if st.State != ap.StateWaiting || st.Copy != 1 {
		t.Errorf("job show after the redrive: %s copy %d, want waiting copy 1", st.State, st.Copy)
	}
	mustCtl(t, exitOK, "", "resume", "--url", url, "default")
	waitState(t, reader, job.ID, ap.StateSucceeded)
}

// A job enqueued by asyncctl with --track-status has a status at once, on
// a queue no worker has taken it from yet.
func TestEnqueueTrackStatus(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	id := strings.TrimSpace(mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "reports", "--type", "t", "--payload", "x", "--track-status"))
	var st ap.JobStatus
	if err := json.Unmarshal([]byte(mustCtl(t, exitOK, "", "job", "show", "--url", url, "--json", id)), &st); err != nil {
		t.Fatal(err)
	}
	if st.State != ap.StateWaiting || st.Queue != "reports" {
		t.Errorf("job show of a job enqueued with --track-status: %+v", st)
	}
	id = strings.TrimSpace(mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "reports", "--type", "t", "--payload", "x", "--delay", "1h", "--track-status"))
	if out := mustCtl(t, exitOK, "", "job", "show", "--url", url, id); !strings.Contains(out, "State:     scheduled") {
		t.Errorf("job show of a delayed job enqueued with --track-status:\n%s", out)
	}
}
