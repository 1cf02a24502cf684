package asyncplatform

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// slowReleases is a store whose batched compare-and-delete takes a while,
// as a store far away would.
type slowReleases struct {
	driver.Store
	batches atomic.Int64
}

func (s *slowReleases) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	s.batches.Add(1)
	time.Sleep(500 * time.Millisecond)
	out := make([]driver.BatchResult, len(items))
	for i, it := range items {
		out[i].Err = driver.DeleteValue(ctx, s.Store, it.Key, it.Rev, it.Value)
	}
	return out, nil
}

// The release of a succeeded job's unique key is written after its settle,
// in batches; Stop returns once the releases of the jobs it settled are
// written, so the key is free for every process from then on.
func TestUniqueReleasedByStop(t *testing.T) {
	t.Parallel()
	mem := memory.NewBroker().Connect()
	st := &slowReleases{Store: mem}
	b := hiddenClaims{Backend: struct{ driver.Backend }{mem}, store: st}
	p, err := New(b, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	if err := p.Handle("t", func(context.Context, *Job) error { handled.Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the job", func() bool { return handled.Load() == 1 })
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Enqueue(ctx, &Job{Type: "t", UniqueKey: "k"}); err != nil {
		t.Fatalf("Enqueue of the key of a job that succeeded before Stop returned: %v; want it free", err)
	}
	if st.batches.Load() == 0 {
		t.Error("the release was not batched (no DeleteValueEach)")
	}
}
