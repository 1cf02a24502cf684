package status

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// heldBatches is a batcher whose CreateEach and UpdateEach wait for its
// gate, and which records how many batch calls were in flight at once and
// any key two calls in flight shared.
type heldBatches struct {
	*batcher
	gate chan struct{} // CreateEach and UpdateEach wait for it while shut is set
	shut bool

	mu      sync.Mutex
	held    map[string]bool
	calls   int // in flight now
	most    int // in flight at once, at most
	overlap []string
}

func (h *heldBatches) enter(keys []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		if h.held[k] {
			h.overlap = append(h.overlap, k)
		}
		h.held[k] = true
	}
	h.calls++
	h.most = max(h.most, h.calls)
}

// hold waits for the gate while the writes are held.
func (h *heldBatches) hold() {
	h.mu.Lock()
	shut := h.shut
	h.mu.Unlock()
	if shut {
		<-h.gate
	}
}

func (h *heldBatches) leave(keys []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		delete(h.held, k)
	}
	h.calls--
}

func itemKeys(items []driver.BatchItem) []string {
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = it.Key
	}
	return keys
}

func (h *heldBatches) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	h.enter(keys)
	defer h.leave(keys)
	return h.batcher.GetEach(ctx, keys)
}

func (h *heldBatches) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	keys := itemKeys(items)
	h.enter(keys)
	defer h.leave(keys)
	h.hold()
	return h.batcher.CreateEach(ctx, items)
}

func (h *heldBatches) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	keys := itemKeys(items)
	h.enter(keys)
	defer h.leave(keys)
	h.hold()
	return h.batcher.UpdateEach(ctx, items)
}

// While a batch of ends is being written, the ends behind it go in
// another batch written at once (up to batchWriters), but an end whose
// key a batch being written holds waits for a later batch: no two batches
// in flight share a key, and the job's later end is written last.
func TestEndBatchesOverlap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := &heldBatches{batcher: &batcher{Store: newStore(t)}, gate: make(chan struct{}), held: map[string]bool{}}
	tk := newTracker(h, "w1")
	n := 2*driver.MaxBatch + driver.MaxBatch/2
	jobs := make([]Job, n)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprintf("j%d", i), Queue: "q", Type: "t", Nonce: "n"}
	}
	tk.Enqueued(ctx, jobs)
	h.mu.Lock()
	h.shut, h.most = true, 0
	h.mu.Unlock()
	// The first job's end is held in its batch's write; its second try
	// ends meanwhile, then the others.
	settle(t, tk, jobs[0])
	waitFor(t, "the first batch held in its write", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.calls == 1
	})
	again := jobs[0]
	again.TryCount = 1
	settle(t, tk, again)
	for _, j := range jobs[1:] {
		settle(t, tk, j)
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		h.mu.Lock()
		most := h.most
		h.mu.Unlock()
		if most >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ends waited behind a batch held in its write for 30s, and no other batch was written meanwhile: %d batch call(s) in flight at once", n, most)
		}
		time.Sleep(time.Millisecond)
	}
	close(h.gate)
	flush(t, tk)
	h.mu.Lock()
	overlap := h.overlap
	h.mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("batches in flight at once shared keys %q", overlap[:min(len(overlap), 5)])
	}
	other := newTracker(h, "w2")
	for _, j := range jobs {
		r := get(t, other, j.ID)
		want := 1
		if j.ID == again.ID {
			want = 2
		}
		if r.State != Succeeded || r.Tries != want {
			t.Fatalf("after Flush: %+v; want succeeded after %d tries", r, want)
		}
	}
}
