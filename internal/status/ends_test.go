package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// batcher is a store with batch calls (driver.StoreBatcher) over one
// without: it records the keys of each GetEach, counts Gets, and holds
// Updates while its gate is shut.
type batcher struct {
	driver.Store
	mu         sync.Mutex
	getEach    [][]string // the keys of each GetEach call
	createEach []int      // the items of each CreateEach call
	updateEach []int      // the items of each UpdateEach call
	gets       atomic.Int64
	updates    atomic.Int64  // single Updates
	gate       chan struct{} // Update waits for it to close; nil: open
	// afterGet, when set, runs after each Get has read its value, before
	// it returns it.
	afterGet func()
	// afterGetEach, when set, runs after each GetEach has read its values,
	// before it returns them.
	afterGetEach func()
	// failEach, when set, fails every GetEach, CreateEach and UpdateEach
	// before it reaches the store.
	failEach atomic.Bool
}

var errEachFailed = errors.New("batch call failed (test)")

func (b *batcher) Get(ctx context.Context, key string) ([]byte, string, error) {
	b.gets.Add(1)
	v, rev, err := b.Store.Get(ctx, key)
	b.mu.Lock()
	after := b.afterGet
	b.mu.Unlock()
	if after != nil {
		after()
	}
	return v, rev, err
}

// wait waits for the gate (see shut) to open.
func (b *batcher) wait(ctx context.Context) error {
	b.mu.Lock()
	gate := b.gate
	b.mu.Unlock()
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *batcher) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	b.updates.Add(1)
	if err := b.wait(ctx); err != nil {
		return "", err
	}
	return b.Store.Update(ctx, key, value, rev, ttl)
}

func (b *batcher) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if b.failEach.Load() {
		return nil, errEachFailed
	}
	if err := b.wait(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.updateEach = append(b.updateEach, len(items))
	b.mu.Unlock()
	return driver.UpdateEach(ctx, b.Store, items)
}

func (b *batcher) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	if b.failEach.Load() {
		return nil, errEachFailed
	}
	b.mu.Lock()
	b.getEach = append(b.getEach, append([]string(nil), keys...))
	after := b.afterGetEach
	b.mu.Unlock()
	rs, err := driver.GetEach(ctx, b.Store, keys)
	if after != nil {
		after()
	}
	return rs, err
}

func (b *batcher) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if b.failEach.Load() {
		return nil, errEachFailed
	}
	b.mu.Lock()
	b.createEach = append(b.createEach, len(items))
	b.mu.Unlock()
	return driver.CreateEach(ctx, b.Store, items)
}

func (b *batcher) DeleteEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	return driver.DeleteEach(ctx, b.Store, items)
}

func (b *batcher) ListEach(ctx context.Context, prefixes []string, limit int) ([][]string, error) {
	return driver.ListEach(ctx, b.Store, prefixes, limit)
}

// shut holds the Updates until the returned func is called.
func (b *batcher) shut() (open func()) {
	gate := make(chan struct{})
	b.mu.Lock()
	b.gate = gate
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		b.gate = nil
		b.mu.Unlock()
		close(gate)
	}
}

var (
	_ driver.StoreBatcher      = (*batcher)(nil)
	_ driver.StoreBatchUpdater = (*batcher)(nil)
)

// settle takes a tracked delivery of j to a success, within a minute
// (Settled must not wait for the write).
func settle(t *testing.T, tk *Tracker, j Job) {
	t.Helper()
	tr := deliver(t, tk, j)
	tr.Ended(context.Background(), false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.Settled(context.Background(), decide.Decision{Outcome: decide.Succeeded, Failures: j.Failures}, j.TryCount+1, []byte("ok"), "")
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("Settled of %s waited for the write", j.ID)
	}
}

// Begin reads no record: a delivery of a job without a cancel mark costs
// no store read before its handler, only the listing of the marks, which
// the deliveries of a poll interval share.
func TestBeginReadsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &batcher{Store: newStore(t)}
	tk := New(Config{Store: kv.Of(b, kv.Status), All: true, Retention: time.Hour, Worker: "w1", Poll: time.Hour})
	jobs := make([]Job, 20)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprintf("j%d", i), Queue: "q", Type: "t"}
	}
	tk.Enqueued(ctx, jobs)
	before := b.gets.Load()
	for _, j := range jobs {
		tr := deliver(t, tk, j)
		tr.Ended(ctx, false)
	}
	if n := b.gets.Load() - before; n != 0 {
		t.Errorf("20 deliveries read %d records before their handlers, want 0", n)
	}
}

// Settled returns before the end is written; this process shows the end at
// once, another once it is written, which Flush waits for. The ends
// waiting while a batch is written go in the next batch: their records
// are read in one call.
func TestEndsWrittenInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &batcher{Store: newStore(t)}
	tk, other := newTracker(b, "w1"), newTracker(b, "w2")
	const n = 50
	jobs := make([]Job, n+1)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprintf("j%d", i), Queue: "q", Type: "t", Nonce: "n"}
	}
	tk.Enqueued(ctx, jobs)
	open := b.shut()
	for _, j := range jobs {
		settle(t, tk, j)
	}
	for _, j := range jobs[:3] {
		if r := get(t, tk, j.ID); r.State != Succeeded || string(r.Result) != "ok" {
			t.Errorf("here, before the write: %+v; want succeeded", r)
		}
		if r := get(t, other, j.ID); r.State != Waiting {
			t.Errorf("elsewhere, before the write: %+v; want waiting", r)
		}
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := tk.Flush(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Flush with the writes held: %v, want DeadlineExceeded", err)
	}
	open()
	flush(t, tk)
	for _, j := range jobs {
		if r := get(t, other, j.ID); r.State != Succeeded || r.Tries != 1 || string(r.Result) != "ok" {
			t.Fatalf("elsewhere, after Flush: %+v; want succeeded", r)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	most := 0
	for _, keys := range b.getEach {
		most = max(most, len(keys))
	}
	if len(b.getEach) > 3 || most < n/2 { // the writer takes the first one or few before the others come
		t.Errorf("%d ends read in %d calls, the largest of %d keys; want those that waited (about %d) read in one", n+1, len(b.getEach), most, n)
	}
	most = 0
	for _, k := range b.updateEach {
		most = max(most, k)
	}
	if len(b.updateEach) > 3 || most < n/2 || b.updates.Load() != 0 {
		t.Errorf("%d ends written in %d UpdateEach calls (the largest of %d items) and %d single Updates; want those that waited (about %d) written in one call, none alone", n+1, len(b.updateEach), most, b.updates.Load(), n)
	}
}

// An end whose record is written by another process between the writer's
// read and its batched write is written alone: the record read again, what
// it keeps (its last error) merged in.
func TestEndWrittenAfterAConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &batcher{Store: newStore(t)}
	tk := newTracker(b, "w1")
	jobs := []Job{{ID: "j1", Queue: "q", Type: "t", Nonce: "n"}, {ID: "j2", Queue: "q", Type: "t", Nonce: "n"}}
	tk.Enqueued(ctx, jobs)
	st := kv.Of(b.Store, kv.Status)
	b.mu.Lock()
	b.afterGetEach = func() {
		b.mu.Lock()
		b.afterGetEach = nil
		b.mu.Unlock()
		v, rev, err := st.Get(ctx, "job/"+key("j1"))
		if err != nil {
			t.Errorf("the other process's read: %v", err)
			return
		}
		var r Record
		if err := json.Unmarshal(v, &r); err != nil {
			t.Errorf("the other process's read: %v", err)
			return
		}
		r.Error = "boom"
		v, _ = json.Marshal(&r)
		if _, err := st.Update(ctx, "job/"+key("j1"), v, rev, time.Hour); err != nil {
			t.Errorf("the other process's write: %v", err)
		}
	}
	b.mu.Unlock()
	open := b.shut() // both ends wait, then go in one batch
	for _, j := range jobs {
		settle(t, tk, j)
	}
	open()
	flush(t, tk)
	other := newTracker(b, "w2")
	if r := get(t, other, "j1"); r.State != Succeeded || r.Error != "boom" {
		t.Errorf("the end written over another process's write: %+v; want succeeded, its error boom kept", r)
	}
	if r := get(t, other, "j2"); r.State != Succeeded {
		t.Errorf("the other end of the batch: %+v; want succeeded", r)
	}
	if n := b.updates.Load(); n != 1 {
		t.Errorf("%d single Updates, want 1 (the end refused by the batch)", n)
	}
}

// An end written after the record was written by another attempt keeps
// what the record knows and the delivery does not: the last error, the
// cancel mark.
func TestEndKeepsTheRecordsError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	tk := newTracker(d, "w1")
	j := Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n"}
	tk.Enqueued(ctx, []Job{j})
	tr := deliver(t, tk, j)
	tr.Ended(ctx, true)
	tr.Settled(ctx, decide.Decision{Outcome: decide.Retried, Failures: 1, RetryAt: clock}, 1, nil, "boom")
	flush(t, tk)
	j.Copy, j.TryCount, j.Failures = 1, 1, 1
	settle(t, tk, j)
	flush(t, tk)
	if r := get(t, newTracker(d, "w2"), "j1"); r.State != Succeeded || r.Error != "boom" || r.Failures != 1 || r.Tries != 2 || r.StartedAt.IsZero() {
		t.Errorf("after a failure then a success: %+v; want succeeded, 2 tries, 1 failure, the last error boom", r)
	}
}

// Begin sees a Cancel made by another process once a listing of the marks
// that began after it is MarkAge polls old at most; and a mark left by an
// earlier life of the job (another enqueue's record) cancels nothing.
func TestBeginSeesCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	tk, other := newTracker(d, "w1"), newTracker(d, "w2")
	j := Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n1"}
	tk.Enqueued(ctx, []Job{j})
	if _, cancelled := tk.Begin(ctx, j); cancelled {
		t.Fatal("cancelled before Cancel")
	}
	if err := other.Cancel(ctx, "j1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(MarkAge*tk.cfg.Poll + time.Millisecond)
	if _, cancelled := tk.Begin(ctx, j); !cancelled {
		t.Error("Begin a listing's age after Cancel did not see it")
	}

	// The job enqueued again (a redrive: another nonce); its old mark stays.
	j.Nonce = "n2"
	tk.Enqueued(ctx, []Job{j})
	time.Sleep(MarkAge*tk.cfg.Poll + time.Millisecond)
	tr, cancelled := tk.Begin(ctx, j)
	if tr == nil || cancelled {
		t.Errorf("Begin of the job's next life with the old mark left: %v, cancelled %v; want a track, not cancelled", tr, cancelled)
	}
}

// A Get whose store read comes before the end is written, and returns
// after, still shows the end.
func TestGetDuringTheWrite(t *testing.T) {
	t.Parallel()
	b := &batcher{Store: newStore(t)}
	tk := newTracker(b, "w1")
	j := Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n"}
	tk.Enqueued(context.Background(), []Job{j})
	open := b.shut()
	settle(t, tk, j)
	b.mu.Lock()
	b.afterGet = func() {
		b.mu.Lock()
		b.afterGet = nil
		b.mu.Unlock()
		open()
		flush(t, tk)
	}
	b.mu.Unlock()
	if r := get(t, tk, "j1"); r.State != Succeeded {
		t.Errorf("Get read before the write, returned after: %+v; want succeeded", r)
	}
}

// The set of marks a listing hands out is not written after: a poll reads
// it while this process's Cancel and ends add and drop marks.
func TestMarksReadWhileChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1")
	if err := tk.Cancel(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	tk.Enqueued(ctx, []Job{{ID: "j1", Queue: "q", Type: "t"}})
	if err := tk.Cancel(ctx, "j1"); err != nil {
		t.Fatal(err)
	}
	set, err := tk.listMarks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			k := fmt.Sprintf("k%d", i)
			tk.marks.add(k)
			tk.marks.drop(k)
			tk.marks.drop("j1")
		}
	}()
	for range 200 {
		for k := range set {
			_ = k
		}
	}
	<-done
}

// A batch whose calls fail loses no end: the ends of a batch whose read,
// create or update failed are read again and written one by one, over a
// record (its waiting state) as over none.
func TestEndsWrittenWhenBatchCallsFail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &batcher{Store: newStore(t)}
	tk := newTracker(b, "w1")
	jobs := make([]Job, 20)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprintf("j%d", i), Queue: "q", Type: "t", Nonce: "n"}
	}
	tk.Enqueued(ctx, jobs[:10]) // the others have no record yet
	if r := get(t, newTracker(b, "w0"), jobs[0].ID); r.State != Waiting {
		t.Fatalf("after Enqueued: %+v; want waiting", r)
	}
	b.failEach.Store(true)
	open := b.shut() // the ends wait, then go in batches
	for _, j := range jobs {
		settle(t, tk, j)
	}
	open()
	flush(t, tk)
	b.failEach.Store(false)
	other := newTracker(b, "w2")
	for _, j := range jobs {
		if r := get(t, other, j.ID); r.State != Succeeded || r.Tries != 1 || string(r.Result) != "ok" {
			t.Errorf("%s after its batch's calls failed: %+v; want succeeded, 1 try, result ok", j.ID, r)
		}
	}
}
