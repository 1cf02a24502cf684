package unique_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/unique"
)

// batchStore is a driver.Store with a CreateEach (the rest of
// driver.StoreBatcher is not called by Take) that counts its calls and the
// single Creates; with fail set, CreateEach writes its items and then
// fails, as a batch whose answer was lost.
type batchStore struct {
	driver.Store
	creates, batches atomic.Int64
	gets, delValues  atomic.Int64
	fail             bool
}

func (s *batchStore) Get(ctx context.Context, key string) ([]byte, string, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, key)
}

func (s *batchStore) DeleteValue(ctx context.Context, key, rev string, value []byte) error {
	s.delValues.Add(1)
	return driver.DeleteValue(ctx, s.Store, key, rev, value)
}

func (s *batchStore) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	s.creates.Add(1)
	return s.Store.Create(ctx, key, value, ttl)
}

func (s *batchStore) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	s.batches.Add(1)
	out := make([]driver.BatchResult, len(items))
	for i, it := range items {
		rev, err := s.Store.Create(ctx, it.Key, it.Value, it.TTL)
		out[i] = driver.BatchResult{Rev: rev, Err: err}
	}
	if s.fail {
		return nil, errors.New("connection reset")
	}
	return out, nil
}

func (s *batchStore) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	out := make([]driver.BatchResult, len(keys))
	for i, k := range keys {
		v, rev, err := s.Store.Get(ctx, k)
		out[i] = driver.BatchResult{Value: v, Rev: rev, Err: err}
	}
	return out, nil
}

func (s *batchStore) DeleteEach(context.Context, []driver.BatchItem) ([]driver.BatchResult, error) {
	return nil, errors.New("not used")
}

func (s *batchStore) ListEach(context.Context, []string, int) ([][]string, error) {
	return nil, errors.New("not used")
}

func newBatchClaims(t *testing.T) (*unique.Claims, *kv.Store, *batchStore) {
	t.Helper()
	b, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	bs := &batchStore{Store: d}
	st := kv.Of(bs, kv.Unique)
	return unique.New(unique.Config{Store: st}), st, bs
}

// TestTakeBatched: the keys of a batch of requests are created in one
// CreateEach on a store that batches (one round trip), not one Create
// each; a single request takes one Create.
func TestTakeBatched(t *testing.T) {
	t.Parallel()
	c, st, bs := newBatchClaims(t)
	reqs := make([]unique.Request, 50)
	for i := range reqs {
		reqs[i] = unique.Request{Key: fmt.Sprint("k", i), JobID: fmt.Sprint("j", i), Window: time.Hour}
	}
	claims, refused, err := c.Take(context.Background(), reqs)
	if err != nil || refused != nil {
		t.Fatalf("Take = %v, %v", refused, err)
	}
	if b, n := bs.batches.Load(), bs.creates.Load(); b != 1 || n != 0 {
		t.Errorf("Take of %d keys: %d CreateEach calls and %d Creates; want one CreateEach", len(reqs), b, n)
	}
	for i, cl := range claims {
		if cl.Rev == "" || holder(t, st, cl.Key) != reqs[i].JobID {
			t.Errorf("claims[%d] = %+v, key held by %q; want %s's claim", i, cl, holder(t, st, cl.Key), reqs[i].JobID)
		}
	}
	if _, _, err := c.Take(context.Background(), []unique.Request{{Key: "one", JobID: "j", Window: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	if b, n := bs.batches.Load(), bs.creates.Load(); b != 1 || n != 1 {
		t.Errorf("Take of a single key: %d CreateEach calls and %d Creates in all; want one each", b, n)
	}
}

// TestTakeBatchLost: a batch that wrote its keys and then failed (its
// answer lost) fails the Take, and the keys it wrote with this Take's
// tokens are given back; a key held before stays its holder's.
func TestTakeBatchLost(t *testing.T) {
	t.Parallel()
	c, st, bs := newBatchClaims(t)
	take(t, c, "held", "old", unique.OnFinish)
	bs.fail = true
	reqs := []unique.Request{
		{Key: "a", JobID: "j0", Window: time.Hour},
		{Key: "held", JobID: "j1", Window: time.Hour},
		{Key: "b", JobID: "j2", Window: time.Hour},
	}
	if _, _, err := c.Take(context.Background(), reqs); err == nil {
		t.Fatal("Take over a batch that failed: no error")
	}
	for _, k := range []string{"a", "b"} {
		if h := holder(t, st, k); h != "" {
			t.Errorf("key %q held by %s after a failed batch; want it given back", k, h)
		}
	}
	if h := holder(t, st, "held"); h != "old" {
		t.Errorf("key held by %q after a failed batch; want its old holder", h)
	}
}

// TestReleaseOneRoundTrip: a release by the job that took the claim is one
// compare-and-delete on a store that has one (no read first); one whose
// header's token is not the stored one deletes nothing, and reads the key
// to say so.
func TestReleaseOneRoundTrip(t *testing.T) {
	t.Parallel()
	c, st, bs := newBatchClaims(t)
	ctx := context.Background()
	cl := take(t, c, "k", "j1", unique.OnFinish)
	forged := cl
	forged.Token = "AAAAAAAAAAAAAAAAAAAAAA"
	gets := bs.gets.Load()
	c.Release(ctx, "q", "j1", forged.Header(), false)
	if h := holder(t, st, "k"); h != "j1" {
		t.Fatalf("a forged header released the key: held by %q", h)
	}
	if bs.gets.Load() == gets {
		t.Error("a release refused by its token read nothing to say why")
	}
	gets, dels := bs.gets.Load(), bs.delValues.Load()
	c.Release(ctx, "q", "j1", cl.Header(), false)
	if h := holder(t, st, "k"); h != "" {
		t.Fatalf("the release left the key held by %q", h)
	}
	if g, d := bs.gets.Load()-gets-1, bs.delValues.Load()-dels; g != 0 || d != 1 { // holder's Get above counts one
		t.Errorf("a release: %d Gets and %d DeleteValues; want one DeleteValue alone", g, d)
	}
}
