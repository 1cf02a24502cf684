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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// seedDead makes n dead letters on the queue of the backend at rawURL, at
// once (their order is not kept), and returns their job IDs, sorted.
func seedDead(t *testing.T, rawURL, queue string, n int) []string {
	t.Helper()
	ctx := context.Background()
	b, err := ap.Open(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dead := make(chan string, n)
	p, err := ap.New(b, ap.Config{
		Queues: map[string]ap.QueueConfig{queue: {Concurrency: 8}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks:  ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl.Job.ID }},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle("fail", func(context.Context, *ap.Job) error { return ap.Permanent(errors.New("no")) }); err != nil {
		t.Fatal(err)
	}
	jobs := make([]*ap.Job, n)
	for i := range jobs {
		jobs[i] = &ap.Job{Type: "fail", Queue: queue, Payload: fmt.Appendf(nil, "job %d", i)}
	}
	if err := p.EnqueueBatch(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	var ids []string
	for range n {
		select {
		case id := <-dead:
			ids = append(ids, id)
		case <-time.After(time.Minute): // a safety net, not an assertion on time
			t.Fatalf("%d of %d jobs dead-lettered", len(ids), n)
		}
	}
	slices.Sort(ids)
	return ids
}

// drain takes every ready job of the queue with a worker and returns their
// IDs, sorted, once the queue is empty.
func drain(t *testing.T, rawURL, queue string) []string {
	t.Helper()
	ctx := context.Background()
	b, err := ap.Open(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var mu sync.Mutex
	var ids []string
	p, err := ap.New(b, ap.Config{
		Queues: map[string]ap.QueueConfig{queue: {Concurrency: 8}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"fail", "t"} {
		p.Handle(typ, func(_ context.Context, j *ap.Job) error {
			mu.Lock()
			ids = append(ids, j.ID)
			mu.Unlock()
			return nil
		})
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		s, err := p.Stats(ctx, queue)
		if err != nil {
			t.Fatal(err)
		}
		if s.Ready <= 0 && s.InFlight <= 0 && s.Scheduled <= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue did not drain: %+v", s)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

// stopAfter makes the next long operation see Ctrl-C once it did n
// records: it returns the context to run it with. Tests that use it do not
// run in parallel.
func stopAfter(t *testing.T, n int) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	done := 0
	afterRecords = func(k int) {
		if done += k; done >= n {
			cancel()
		}
	}
	t.Cleanup(func() { afterRecords = nil; cancel() })
	return ctx
}

// Ctrl-C stops redrive, purge, pop-all and enqueue --from between two
// records: each says how far it got, exits 130, and what it did and did not
// do add up to every record, none lost, none twice.
func TestInterrupted(t *testing.T) {
	url := memURL(t)
	all := seedDead(t, url, "q", 250)

	// redrive: chunks of 100; stopped after the first.
	var out, errOut bytes.Buffer
	code := run(stopAfter(t, 1), []string{"dead", "redrive", "--url", url, "--queue", "q", "--all"}, strings.NewReader(""), &out, &errOut)
	if code != exitInterrupted || out.String() != "redrove 100 of 250 dead letters to queue \"q\"\n" ||
		!strings.Contains(errOut.String(), "interrupted: redrove 100 of 250 dead letters to queue \"q\"; the other 150 are still dead letters") {
		t.Fatalf("redrive: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	if s := stats(t, url, "q"); s.Ready != 100 || s.Dead != 150 {
		t.Fatalf("after an interrupted redrive: %+v, want 100 ready and 150 dead", s)
	}
	dead := deadIDs(t, url, "q")
	slices.Sort(dead)
	ready := drain(t, url, "q")
	if got := slices.Sorted(slices.Values(append(slices.Clone(ready), dead...))); !slices.Equal(got, all) {
		t.Fatalf("the redriven jobs and the dead letters are not the seeded jobs, each once: %d ready, %d dead", len(ready), len(dead))
	}

	// pop-all, saving JSON lines: stopped after 30; each popped record is
	// printed, and only those are gone.
	out.Reset()
	errOut.Reset()
	code = run(stopAfter(t, 30), []string{"dead", "pop", "--url", url, "--queue", "q", "--yes", "--json"}, strings.NewReader(""), &out, &errOut)
	if code != exitInterrupted || strings.Count(out.String(), "\n") != 30 || !strings.Contains(errOut.String(), "interrupted: popped 30 dead letters of queue \"q\"; the others are still there") {
		t.Fatalf("pop: exit %d\n%d lines\n%s", code, strings.Count(out.String(), "\n"), errOut.String())
	}
	popped := filepath.Join(t.TempDir(), "popped.jsonl")
	if err := os.WriteFile(popped, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	left := deadIDs(t, url, "q")
	if len(left) != 120 || slices.ContainsFunc(left, func(id string) bool { return strings.Contains(out.String(), id) }) {
		t.Fatalf("after popping 30 of 150: %d left, or a popped one is still there", len(left))
	}

	// enqueue --from the popped records: stopped after 12 lines.
	out.Reset()
	errOut.Reset()
	code = run(stopAfter(t, 12), []string{"enqueue", "--url", url, "--from", popped, "--queue", "other", "--json"}, strings.NewReader(""), &out, &errOut)
	var summary struct{ Enqueued, Lines int }
	if err := json.Unmarshal(out.Bytes(), &summary); code != exitInterrupted || err != nil || summary.Enqueued != 12 || summary.Lines != 12 ||
		!strings.Contains(errOut.String(), "interrupted: enqueued 12 jobs, up to line 12 of "+popped+"; --skip 12 goes on from there") {
		t.Fatalf("enqueue --from: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	afterRecords = nil
	if out := mustCtl(t, exitOK, "", "enqueue", "--url", url, "--from", popped, "--skip", "12"); out != "enqueued 18 jobs from 18 lines\n" {
		t.Fatalf("enqueue --from --skip 12: %q", out)
	}
	if s := stats(t, url, "q"); s.Ready != 30 || s.Dead != 120 {
		t.Fatalf("the popped records, enqueued again, went back to their own queue: %+v", s)
	}
	if code, out, _ := ctl(t, "", "queues", "--url", url, "--json", "other"); code != exitNotFound {
		t.Fatalf("--queue is only the default of lines without a queue: queue other is known: exit %d\n%s", code, out)
	}
	again := drain(t, url, "q")
	for _, id := range again {
		if !strings.Contains(out.String()+string(mustRead(t, popped)), id) {
			t.Fatalf("job %s was enqueued, but not popped", id)
		}
	}
	if len(again) != 30 || len(slices.Compact(slices.Clone(again))) != 30 {
		t.Fatalf("enqueued %d jobs from 30 popped ones, or some twice", len(again))
	}

	// purge, one record at a time: stopped after 50 of 120.
	out.Reset()
	errOut.Reset()
	code = run(stopAfter(t, 50), []string{"dead", "purge", "--url", url, "--queue", "q", "--yes"}, strings.NewReader(""), &out, &errOut)
	if code != exitInterrupted || out.String() != "deleted 50 dead letters of queue \"q\"\n" || !strings.Contains(errOut.String(), "interrupted: deleted 50 dead letters") {
		t.Fatalf("purge: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	if s := stats(t, url, "q"); s.Dead != 70 {
		t.Fatalf("after purging 50 of 120: %+v", s)
	}
	afterRecords = nil
	if out := mustCtl(t, exitOK, "", "dead", "purge", "--url", url, "--queue", "q", "--yes", "--json"); !strings.Contains(out, `"purged": 70`) {
		t.Fatalf("purge: %s", out)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Progress goes to a terminal only: piped, or with --json, stderr carries
// nothing but the command's own lines.
func TestNoProgressWhenPiped(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	seedDead(t, url, "q", 5)
	for _, args := range [][]string{
		{"dead", "pop", "--url", url, "--queue", "q", "--yes", "--max", "2"},
		{"dead", "pop", "--url", url, "--queue", "q", "--yes", "--max", "1", "--json"},
		{"dead", "redrive", "--url", url, "--queue", "q", "--all"},
	} {
		_, out, errOut := ctl(t, "", args...)
		if errOut != "" && !strings.HasPrefix(errOut, "the dead-letter queue") || strings.ContainsAny(out+errOut, "\r\x1b") {
			t.Errorf("asyncctl %s printed %q on stderr (stdout %q)", strings.Join(args, " "), errOut, out)
		}
	}
}

// enqueue --from refuses a bad line, saying which and how to go on.
func TestEnqueueFromBadLine(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	file := filepath.Join(t.TempDir(), "jobs.jsonl")
	os.WriteFile(file, []byte(`{"type":"t","payload_text":"one"}`+"\n\n"+`{"payload_text":"no type"}`+"\n"), 0o600)
	code, out, errOut := ctl(t, "", "enqueue", "--url", url, "--from", file, "--queue", "q")
	if code != exitUsage || out != "" || !strings.Contains(errOut, "jobs.jsonl line 3: no type: give it in the line or with --type (1 jobs of the lines before it were enqueued; --skip 2 goes on from line 3)") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if out := mustCtl(t, exitOK, "", "enqueue", "--url", url, "--from", file, "--queue", "q", "--type", "dflt", "--skip", "2", "--new-ids"); out != "enqueued 1 jobs from 1 lines\n" {
		t.Fatalf("with --type: %q", out)
	}
	if s := stats(t, url, "q"); s.Ready != 2 {
		t.Fatalf("%+v", s)
	}
	mustCtl(t, exitUsage, "", "enqueue", "--url", url, "--from", file, "--payload", "x")
	mustCtl(t, exitUsage, "", "enqueue", "--url", url, "--type", "t", "--payload", "x", "--skip", "1")
}
