package unique_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/unique"
)

// slowReleases is a store that answers each single release (DeleteValue)
// after delay, well within the release timeout: slow, not stalled.
type slowReleases struct {
	*valueDeleter
	delay time.Duration
}

func (s *slowReleases) DeleteValue(ctx context.Context, key, rev string, value []byte) error {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.valueDeleter.DeleteValue(ctx, key, rev, value)
}

// TestReleaseLaterBatchFailsSlowStore: when a batch call fails, every
// claim of the batch is released one by one (no release is lost to a
// failed batch), on a store that answers each of those releases within
// ReleaseTimeout, however many rounds of the workers they take.
func TestReleaseLaterBatchFailsSlowStore(t *testing.T) {
	t.Parallel()
	_, _, bs := newBatchClaims(t)
	vd := &valueDeleter{batchStore: bs}
	const timeout = 400 * time.Millisecond
	s := &slowReleases{valueDeleter: vd, delay: timeout / 3}
	st := kv.Of(s, kv.Unique)
	c := unique.New(unique.Config{Store: st, ReleaseTimeout: timeout})
	const n = 16 * 8 // eight rounds of the 16 workers: more than two timeouts in all
	claims := make([]unique.Claim, n)
	for i := range claims {
		claims[i] = take(t, c, fmt.Sprint("k", i), fmt.Sprint("j", i), unique.OnFinish)
	}
	vd.failEach.Store(true)
	for i, cl := range claims {
		c.ReleaseLater("q", fmt.Sprint("j", i), cl.Header(), false)
	}
	flush(t, c)
	held := 0
	for i := range claims {
		if _, _, err := st.Get(context.Background(), fmt.Sprint("k", i)); !errors.Is(err, driver.ErrKeyNotFound) {
			held++
		}
	}
	if held > 0 {
		t.Errorf("%d of %d keys still held after their batch failed: their releases one by one were given up though each took %v of a %v timeout", held, n, s.delay, timeout)
	}
}

// stallsAfterBatch is a store whose batch call fails at once (the first
// once gate is closed) and whose single release calls then wait for their
// context to end.
type stallsAfterBatch struct {
	*valueDeleter
	gate           chan struct{}
	batches, calls atomic.Int64
}

func (s *stallsAfterBatch) DeleteValueEach(context.Context, []driver.BatchItem) ([]driver.BatchResult, error) {
	s.batches.Add(1)
	<-s.gate
	return nil, errors.New("connection reset")
}

func (s *stallsAfterBatch) DeleteValue(ctx context.Context, _, _ string, _ []byte) error {
	s.calls.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

func (s *stallsAfterBatch) Get(ctx context.Context, _ string) ([]byte, string, error) {
	s.calls.Add(1)
	<-ctx.Done()
	return nil, "", ctx.Err()
}

// TestReleaseLaterGivesUpOnStall: when the batch call fails at once and
// the store then stops answering, the first release that ends with its
// timeout gives up the batch's releases not yet started, so the batch does
// not take a ReleaseTimeout per round of the workers.
func TestReleaseLaterGivesUpOnStall(t *testing.T) {
	t.Parallel()
	_, _, bs := newBatchClaims(t)
	s := &stallsAfterBatch{valueDeleter: &valueDeleter{batchStore: bs}, gate: make(chan struct{})}
	const timeout = 50 * time.Millisecond
	c := unique.New(unique.Config{Store: kv.Of(s, kv.Unique), ReleaseTimeout: timeout})
	const n = 50 // four rounds of the single releases' 16 workers
	claims := make([]unique.Claim, n)
	for i := range claims {
		claims[i] = take(t, c, fmt.Sprint("k", i), fmt.Sprint("j", i), unique.OnFinish)
	}
	// The first batch is held at its call until the other claims wait:
	// they are the second batch.
	for i, cl := range claims {
		c.ReleaseLater("q", fmt.Sprint("j", i), cl.Header(), false)
	}
	close(s.gate)
	flush(t, c)
	if got, batches := s.calls.Load(), s.batches.Load(); got > 16*batches {
		t.Errorf("%d store calls for %d releases in %d batches on a stalled store, want at most 16 a batch (one round of the workers): the releases after the first round's timeouts were not given up", got, n, batches)
	}
}
