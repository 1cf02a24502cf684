package nats

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	gonats "github.com/nats-io/nats.go"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// TestDedupeKeyUnguessable: the server drops a publish whose Nats-Msg-Id
// it stored within DuplicateWindow, so no writer to the broker may be able
// to compute a copy's ID ahead of it, and two jobs' copies may never share
// one. A writer publishes ahead under the IDs the next copies had by their
// names alone (<queue>/<job>.<copy>, and a report's <queue>/<job>@<copy>);
// job x's copy 1 and job x.1's copy 0 shared the name x.1. Every real copy
// and report must still arrive.
func TestDedupeKeyUnguessable(t *testing.T) {
	url := realURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := queueName(t)
	out := q + "-out"
	b := newBackend(t, url, q)
	t.Cleanup(func() { _ = b.DeleteQueue(context.Background(), out) })

	forge := func(queue, id string) {
		t.Helper()
		m := &gonats.Msg{Subject: b.workSubject(queue), Data: []byte("forged " + id), Header: gonats.Header{}}
		m.Header.Set(hdrMsgID, token(queue)+"/"+id)
		if _, err := b.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	forge(q, "fail-once-1.1")
	forge(out, "order-77@0")

	p, err := ap.New(b, ap.Config{
		Queues: map[string]ap.QueueConfig{q: {Concurrency: 4, Output: out}, out: {Concurrency: 4}},
		Lease:  5 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	reports := map[string]bool{}
	if err := p.Handle("t", func(_ context.Context, j *ap.Job) error {
		mu.Lock()
		runs[j.ID]++
		mu.Unlock()
		if j.ID != "x.1" && j.ID != "order-77" && j.CopyNumber() == 0 {
			return fmt.Errorf("the first try of %s fails", j.ID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Handle(ap.ReportType, ap.JSON(func(_ context.Context, _ *ap.Job, r ap.OutcomeReport) error {
		mu.Lock()
		reports[r.Key] = true
		mu.Unlock()
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	quick := ap.Policy{BackoffBase: 10 * time.Millisecond, BackoffCap: 10 * time.Millisecond}
	for _, id := range []string{"x.1", "x", "fail-once-1", "order-77"} {
		if err := p.Enqueue(ctx, &ap.Job{ID: id, Type: "t", Queue: q, Policy: quick}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop(context.Background()) }()

	wantRuns := map[string]int{"x.1": 1, "x": 2, "fail-once-1": 2, "order-77": 1}
	wantReports := []string{"x.1@0", "x@1", "fail-once-1@1", "order-77@0"}
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id, n := range wantRuns {
			if runs[id] < n {
				return false
			}
		}
		for _, k := range wantReports {
			if !reports[k] {
				return false
			}
		}
		return true
	}
	for !done() {
		select {
		case <-ctx.Done():
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("runs %v (want %v), reports %v (want %v): a copy or report was dropped as a duplicate", runs, wantRuns, reports, wantReports)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestDedupeKeyDropsRepublish: the same copy published twice (a publish
// retried after a lost ack, or two workers writing the same next copy)
// is stored once; the same message without a Dedupe key is keyed by its
// ID as before.
func TestDedupeKeyDropsRepublish(t *testing.T) {
	url := realURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := queueName(t)
	b := newBackend(t, url, q)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	msgs := []driver.Message{
		{ID: "j.1", Dedupe: "key-one", Body: []byte("copy 1 of j")},
		{ID: "j.1", Dedupe: "key-one", Body: []byte("copy 1 of j, written again")},
		{ID: "j.1", Dedupe: "key-two", Body: []byte("copy 0 of j.1")},
		{ID: "old", Body: []byte("no key")},
		{ID: "old", Body: []byte("no key, written again")},
	}
	for _, m := range msgs {
		if err := b.Enqueue(ctx, q, []driver.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for len(got) < 3 {
		ds, err := b.Receive(ctx, q, 10, 5*time.Second)
		if err != nil {
			t.Fatalf("received %q, then: %v", got, err)
		}
		for _, d := range ds {
			got = append(got, string(d.Body))
			if err := b.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	defer rcancel()
	if ds, err := b.Receive(rctx, q, 10, 5*time.Second); err == nil {
		for _, d := range ds {
			got = append(got, string(d.Body))
		}
	}
	want := map[string]bool{"copy 1 of j": true, "copy 0 of j.1": true, "no key": true}
	if len(got) != len(want) {
		t.Fatalf("stored %q; want each of %v once", got, want)
	}
	for _, g := range got {
		if !want[g] {
			t.Fatalf("stored %q; want each of %v once", got, want)
		}
	}
}
