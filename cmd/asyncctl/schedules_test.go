package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// runSchedules starts a platform on the backend at url running the
// schedules, and returns it once each has published its definition.
func runSchedules(t *testing.T, url string, handled chan<- *ap.Job, ss ...ap.Schedule) *ap.Platform {
	t.Helper()
	ctx := context.Background()
	b, err := ap.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	p, err := ap.New(b, ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WorkerName: "w1", Schedules: ss})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if err := p.Handle(s.Job.Type, func(_ context.Context, j *ap.Job) error { handled <- j; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx) })
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if list, _ := p.Schedules(ctx); len(list) == len(ss) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatal("the schedules were never published")
		}
	}
}

func TestSchedules(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	mustCtl(t, exitNotFound, "", "schedules", "list", "--url", url)
	handled := make(chan *ap.Job, 16)
	runSchedules(t, url, handled,
		ap.Schedule{Name: "reports/daily", Cron: "0 30 9 * * *", CatchUp: 2, Job: ap.Job{Type: "report", Queue: "default", Payload: []byte("p")}},
		ap.Schedule{Name: "cleanup", Every: time.Hour, Job: ap.Job{Type: "clean"}},
	)
	out := mustCtl(t, exitOK, "", "schedules", "list", "--url", url)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") ||
		!strings.Contains(lines[1], "cleanup") || !strings.Contains(lines[1], "every 1h0m0s") ||
		!strings.Contains(lines[2], "reports/daily") || !strings.Contains(lines[2], "0 30 9 * * *") || !strings.Contains(lines[2], "w1") {
		t.Fatalf("schedules list:\n%s", out)
	}
	var list []scheduleJSON
	if err := json.Unmarshal([]byte(mustCtl(t, exitOK, "", "schedules", "list", "--json", "--url", url, "reports/daily")), &list); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	next := time.Date(now.Year(), now.Month(), now.Day(), 9, 30, 0, 0, time.UTC)
	if !next.After(now) {
		next = next.AddDate(0, 0, 1)
	}
	if len(list) != 1 || list[0].Name != "reports/daily" || list[0].CatchUp != 2 || list[0].Type != "report" ||
		!list[0].Next.Equal(next) || !list[0].Last.IsZero() || !list[0].Triggerable || list[0].Worker != "w1" {
		t.Fatalf("schedules list --json reports/daily = %+v; want its definition, next %v", list, next)
	}
	mustCtl(t, exitNotFound, "", "schedules", "list", "--url", url, "nope")

	id := strings.TrimSpace(mustCtl(t, exitOK, "", "schedules", "trigger", "--url", url, "reports/daily"))
	select {
	case j := <-handled:
		if j.ID != id || j.Type != "report" || string(j.Payload) != "p" || j.Headers[ap.ScheduleTriggerHeader] == "" {
			t.Fatalf("triggered %q; handled %+v", id, j)
		}
	case <-time.After(time.Minute):
		t.Fatal("the triggered job was never handled")
	}
	mustCtl(t, exitNotFound, "", "schedules", "trigger", "--url", url, "nope")
	for _, args := range [][]string{
		{"schedules"},
		{"schedules", "trigger", "--url", url},
		{"schedules", "trigger", "--url", url, "a", "b"},
		{"schedules", "trigger", "--url", url, "bad//name"},
		{"schedules", "list", "--url", url, "bad name"},
	} {
		if code, _, _ := ctl(t, "", args...); code != exitUsage {
			t.Errorf("asyncctl %q: exit %d; want %d", args, code, exitUsage)
		}
	}
}

// Nothing a worker published reaches the terminal raw: a schedule's name,
// type and worker name as schedules list prints them, and the JSON reads
// back the same.
func TestSchedulesHostile(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	handled := make(chan *ap.Job, 16)
	ctx := context.Background()
	b, err := ap.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	typ := "type" + hostile
	p, err := ap.New(b, ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WorkerName: "worker" + hostile,
		Schedules: []ap.Schedule{{Name: "s", Every: time.Hour, Job: ap.Job{Type: typ}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle(typ, func(_ context.Context, j *ap.Job) error { handled <- j; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	for list, _ := p.Schedules(ctx); len(list) == 0; list, _ = p.Schedules(ctx) {
		time.Sleep(10 * time.Millisecond)
	}
	out := mustCtl(t, exitOK, "", "schedules", "list", "--url", url)
	if r := raw(out); len(r) > 0 {
		t.Errorf("schedules list prints %v raw:\n%s", r, out)
	}
	if n := strings.Count(out, "\n"); n != 2 {
		t.Errorf("schedules list: %d lines, want a header and 1 row:\n%s", n, out)
	}
	out = mustCtl(t, exitOK, "", "schedules", "list", "--json", "--url", url)
	if r := raw(out); len(r) > 0 {
		t.Errorf("schedules list --json prints %v raw:\n%s", r, out)
	}
	var list []scheduleJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Type != typ || list[0].Worker != "worker"+hostile {
		t.Errorf("schedules list --json does not read back: %+v, %v", list, err)
	}
	out = mustCtl(t, exitOK, "", "schedules", "trigger", "--url", url, "s")
	if r := raw(out); len(r) > 0 {
		t.Errorf("schedules trigger prints %v raw:\n%s", r, out)
	}
}
