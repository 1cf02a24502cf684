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
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// workers lists a running platform, exit 3 when none runs; a forged
// worker record reaches the terminal escaped, and --json reads back.
func TestWorkers(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	mustCtl(t, exitNotFound, "", "workers", "--url", url)
	ctx := context.Background()
	b, err := ap.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, err := ap.New(b, ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), WorkerName: "w1",
		Queues: map[string]ap.QueueConfig{"mail": {Concurrency: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) { // a safety net, not an assertion on time
		if list, _ := p.Workers(ctx); len(list) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker never wrote its record")
		}
	}
	out := mustCtl(t, exitOK, "", "workers", "--url", url)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME") || !strings.Contains(lines[1], "w1") || !strings.Contains(lines[1], "mail") {
		t.Fatalf("workers:\n%s", out)
	}
	s, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := json.Marshal(map[string]any{"name": "n" + hostile, "host": "h" + hostile, "version": "v" + hostile,
		"queues": []string{"q" + hostile}, "beat_at": time.Now(), "interval": int64(time.Minute)})
	if _, err := s.Create(ctx, kv.Workers.Prefix()+"w-forged", forged, time.Minute); err != nil {
		t.Fatal(err)
	}
	out = mustCtl(t, exitOK, "", "workers", "--url", url)
	if r := raw(out); len(r) > 0 {
		t.Errorf("workers prints %v raw:\n%s", r, out)
	}
	if n := strings.Count(out, "\n"); n != 3 {
		t.Errorf("workers: %d lines, want a header and 2 rows:\n%s", n, out)
	}
	out = mustCtl(t, exitOK, "", "workers", "--json", "--url", url)
	if r := raw(out); len(r) > 0 {
		t.Errorf("workers --json prints %v raw:\n%s", r, out)
	}
	var list []workerJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 2 || list[1].Name != "n"+hostile && list[0].Name != "n"+hostile {
		t.Errorf("workers --json does not read back: %+v, %v", list, err)
	}
}
