package asyncplatform

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// A job its type's limit refuses ends its delivery by the same settle path
// as any other: a tracked job's status says when it comes again, and no try
// is spent.
func TestOverLimitSettledLikeAnyEnd(t *testing.T) {
	ctx := t.Context()
	broker := memory.NewBroker()
	cfg := Config{Logger: quietLog, TrackStatus: true, LimitDelay: time.Minute,
		Limits: map[string]TypeLimit{"t": {Concurrency: 1}}}
	producer, err := New(broker.Connect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"first", "second"} {
		if err := producer.Enqueue(ctx, &Job{ID: id, Type: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	started := make(chan string, 2)
	p, err := New(broker.Connect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Handle("t", func(ctx context.Context, j *Job) error {
		started <- j.ID
		<-release
		return nil
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { close(release); _ = p.Stop(ctx) }()
	running := <-started
	other := map[string]string{"first": "second", "second": "first"}[running]
	var st JobStatus
	waitUntil(t, "the refused job's status to say when it comes again", func() bool {
		st, err = p.Status(ctx, other)
		return err == nil && st.State == StateScheduled
	})
	if wait := time.Until(st.RetryAt); wait < 20*time.Second || wait > 90*time.Second {
		t.Errorf("the refused job comes again in %v, want about LimitDelay (1m ±50%%)", wait)
	}
	if st.Failures != 0 || st.Crashes != 0 {
		t.Errorf("the refused job was charged: %d failures, %d crashes", st.Failures, st.Crashes)
	}
}
