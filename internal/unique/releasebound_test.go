package unique_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/unique"
)

// stalledReleases is a store whose release calls (DeleteValueEach,
// DeleteValue, Get, Delete) wait for their context to end once stalled is
// set. It counts the calls after a batch call (the writer makes them in
// turn: a batch call, then its releases one by one) whose deadline is
// more than timeout after that batch call's.
type stalledReleases struct {
	*valueDeleter
	timeout time.Duration

	mu          sync.Mutex
	stalled     bool
	batches     int
	calls, late int
	batch       time.Time // the deadline of the last DeleteValueEach call
}

func (s *stalledReleases) stall(ctx context.Context, batch bool) error {
	s.mu.Lock()
	if !s.stalled {
		s.mu.Unlock()
		return nil
	}
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(24 * time.Hour)
	}
	s.calls++
	switch {
	case batch:
		s.batches++
		s.batch = d
	case d.After(s.batch.Add(s.timeout)):
		s.late++
	}
	s.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (s *stalledReleases) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if err := s.stall(ctx, true); err != nil {
		return nil, err
	}
	return s.valueDeleter.DeleteValueEach(ctx, items)
}

func (s *stalledReleases) DeleteValue(ctx context.Context, key, rev string, value []byte) error {
	if err := s.stall(ctx, false); err != nil {
		return err
	}
	return s.valueDeleter.DeleteValue(ctx, key, rev, value)
}

func (s *stalledReleases) Get(ctx context.Context, key string) ([]byte, string, error) {
	if err := s.stall(ctx, false); err != nil {
		return nil, "", err
	}
	return s.valueDeleter.Get(ctx, key)
}

func (s *stalledReleases) Delete(ctx context.Context, key, rev string) error {
	if err := s.stall(ctx, false); err != nil {
		return err
	}
	return s.valueDeleter.Store.Delete(ctx, key, rev)
}

// TestReleaseLaterBoundedOnStalledStore: on a store that stopped
// answering, a batch of ReleaseLater takes at most two ReleaseTimeouts
// (the batch call, then its releases one by one together), whatever the
// number of claims: no store call of the batch has a deadline later than
// one ReleaseTimeout after the batch call's. This is what bounds how long
// the writer outlives Stop.
func TestReleaseLaterBoundedOnStalledStore(t *testing.T) {
	t.Parallel()
	_, _, bs := newBatchClaims(t)
	const timeout = 50 * time.Millisecond
	s := &stalledReleases{valueDeleter: &valueDeleter{batchStore: bs}, timeout: timeout}
	c := unique.New(unique.Config{Store: kv.Of(s, kv.Unique), ReleaseTimeout: timeout})
	const n = 50 // four rounds of the single releases' 16 workers
	claims := make([]unique.Claim, n)
	for i := range claims {
		claims[i] = take(t, c, fmt.Sprint("k", i), fmt.Sprint("j", i), unique.OnFinish)
	}
	s.mu.Lock()
	s.stalled = true
	s.mu.Unlock()
	for i, cl := range claims {
		c.ReleaseLater("q", fmt.Sprint("j", i), cl.Header(), false)
	}
	flush(t, c)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.batches == 0 {
		t.Fatal("no batch call")
	}
	if s.late > 0 {
		t.Errorf("%d of %d store calls (%d batches) had a deadline more than ReleaseTimeout (%v) after their batch call's: a batch outlives two ReleaseTimeouts", s.late, s.calls, s.batches, timeout)
	}
}
