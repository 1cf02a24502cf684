package asyncplatform_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	_ "github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// A job retried twice, then dead-lettered, has every state change in its
// status's history, in order, with non-decreasing times, its tries and the
// reasons of its retries and of its dead letter, as another process reads
// it: on memory and on the machine's Redis.
func TestStatusHistory(t *testing.T) {
	t.Parallel()
	t.Run("Memory", func(t *testing.T) {
		t.Parallel()
		be, err := memory.New(context.Background(), memory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		testStatusHistory(t, be, be)
	})
	t.Run("Redis", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		url := testenv.Getenv("ASYNCPLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0") + "?prefix=hist" + strings.ToLower(rand.Text()[:8])
		open := func() driver.Backend {
			be, err := ap.Open(ctx, url)
			if err != nil {
				testenv.Unreachable(t, "Redis", err)
			}
			t.Cleanup(func() { be.Close() })
			return be
		}
		testStatusHistory(t, open(), open())
	})
}

// testStatusHistory runs a worker over be and reads the job's status from
// a platform over other (another process's connection, or the same
// backend).
func testStatusHistory(t *testing.T, be, other driver.Backend) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	const queue = "history"
	cfg := ap.Config{
		Queues: map[string]ap.QueueConfig{queue: {TrackStatus: true, Concurrency: 1}},
		// A backoff long enough that each retry's copy comes after its
		// attempt's end has been handed to the status writer.
		Policy:          ap.Policy{RetryLimit: ap.Limit(2), BackoffBase: 100 * time.Millisecond, BackoffCap: 100 * time.Millisecond},
		StatusRetention: 10 * time.Minute, // the test's records on a shared server expire
		Logger:          log,
	}
	if d, ok := be.(driver.QueueDeleter); ok {
		t.Cleanup(func() { _ = d.DeleteQueue(context.Background(), queue) })
	}
	w, err := ap.New(be, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("fails", func(ctx context.Context, j *ap.Job) error {
		return fmt.Errorf("try %d failed\nstack trace", j.TryCount)
	}); err != nil {
		t.Fatal(err)
	}
	reader, err := ap.New(other, ap.Config{Queues: cfg.Queues, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	job := &ap.Job{Type: "fails", Queue: queue}
	if err := w.Enqueue(ctx, job); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := w.Status(ctx, job.ID)
		if err == nil && st.State == ap.StateDeadLettered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job did not end within a minute: %+v, %v", st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := w.Stop(stop); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop: %v", err)
	}

	st, err := reader.Status(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range st.History {
		s := fmt.Sprintf("%s/%d", c.State, c.Try)
		if c.Reason != "" {
			s += "(" + c.Reason + ")"
		}
		got = append(got, s)
	}
	want := []string{
		"waiting/0", "running/1", "retrying/1(try 1 failed)", "running/2", "retrying/2(try 2 failed)",
		"running/3", "dead_lettered/3(retries_exceeded)",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") || st.HistoryDropped != 0 {
		t.Fatalf("history\n%s\n(%d dropped), want\n%s", strings.Join(got, " "), st.HistoryDropped, strings.Join(want, " "))
	}
	for i := 1; i < len(st.History); i++ {
		if st.History[i].At.Before(st.History[i-1].At) {
			t.Errorf("change %d (%s) at %v, before change %d at %v", i, st.History[i].State, st.History[i].At, i-1, st.History[i-1].At)
		}
	}
	if last := st.History[len(st.History)-1]; !last.At.Equal(st.UpdatedAt) {
		t.Errorf("the last change at %v, the status updated at %v", last.At, st.UpdatedAt)
	}
}
