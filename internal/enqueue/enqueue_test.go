package enqueue

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/payload"
	"github.com/asyncplatform/asyncplatform/internal/status"
	"github.com/asyncplatform/asyncplatform/internal/unique"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

var quiet = slog.New(slog.DiscardHandler)

// recording is a memory backend that records its Enqueue calls.
type recording struct {
	*memory.Backend
	mu    sync.Mutex
	calls []string // the queue of each call
	msgs  []driver.Message
}

func (r *recording) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	r.mu.Lock()
	r.calls = append(r.calls, queue)
	r.msgs = append(r.msgs, msgs...)
	r.mu.Unlock()
	return r.Backend.Enqueue(ctx, queue, msgs)
}

// memStore is a payload store in memory.
type memStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memStore) Put(_ context.Context, id string, b []byte) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref := id + "/p"
	s.m[ref] = bytes.Clone(b)
	return ref, nil
}

func (s *memStore) Get(_ context.Context, ref string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[ref]
	if !ok {
		return nil, payload.ErrNotFound
	}
	return b, nil
}

func (s *memStore) Delete(_ context.Context, ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, ref)
	return nil
}

// setup returns an engine over a recording memory backend; tracked: the
// status of every queue is tracked; store: a payload store, or nil.
func setup(t *testing.T, tracked bool, maxBody int, store payload.Store) (*Engine, *recording) {
	t.Helper()
	m, err := memory.New(context.Background(), memory.Config{Broker: memory.NewBroker()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	b := &recording{Backend: m}
	st, err := driver.StoreOf(m)
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{
		Backend:  b,
		Codec:    wire.Codec{MaxBody: maxBody},
		Status:   status.New(status.Config{Store: kv.Of(st, kv.Status), All: tracked, Retention: time.Hour, Logger: quiet}),
		Claims:   unique.New(unique.Config{Store: kv.Of(st, kv.Unique), Log: quiet}),
		Payloads: payload.New(store, quiet),
	}), b
}

func job(id, queue string) Job {
	return Job{Job: wire.Job{ID: id, Type: "t", EnqueuedAt: time.Now()}, Queue: queue}
}

// The nonce of a tracked queue's job is made once and kept in the caller's
// slice: the enqueue retried with it writes the same message.
func TestEnqueueKeepsNonce(t *testing.T) {
	ctx := context.Background()
	e, b := setup(t, true, 1<<20, nil)
	jobs := []Job{job("a", "q"), job("b", "r")} // a batch: one Put per queue
	if err := e.Enqueue(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if jobs[0].Nonce == "" || jobs[1].Nonce == "" {
		t.Fatal("the caller's jobs have no nonce after Enqueue")
	}
	if err := e.Enqueue(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if len(b.msgs) != 4 || !bytes.Equal(b.msgs[0].Body, b.msgs[2].Body) || !bytes.Equal(b.msgs[1].Body, b.msgs[3].Body) {
		t.Errorf("the retried enqueue wrote other messages")
	}
	if jobs[0].Headers[wire.StatusHeader] != "" {
		t.Errorf("the caller's headers were written to: %v", jobs[0].Headers)
	}
}

// A batch goes with one backend call per queue, in the order of each
// queue's first job.
func TestEnqueueOneCallPerQueue(t *testing.T) {
	e, b := setup(t, false, 1<<20, nil)
	if err := e.Enqueue(context.Background(), []Job{job("a", "x"), job("b", "y"), job("c", "x")}); err != nil {
		t.Fatal(err)
	}
	if len(b.calls) != 2 || b.calls[0] != "x" || b.calls[1] != "y" {
		t.Errorf("calls: %v; want [x y]", b.calls)
	}
}

// A job over the backend's limit is refused with ErrTooLarge without a
// payload store, and offloaded with one.
func TestEnqueueTooLargeOrOffloaded(t *testing.T) {
	ctx := context.Background()
	big := job("big", "q")
	big.Payload = make([]byte, 8192)

	e, b := setup(t, false, 4096, nil)
	if err := e.Enqueue(ctx, []Job{big}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("without a store: %v; want ErrTooLarge", err)
	}
	if len(b.calls) != 0 {
		t.Errorf("a refused job was sent: %v", b.calls)
	}
	if m := e.MaxPayload(big); m <= 0 || m >= 4096-Headroom {
		t.Errorf("MaxPayload %d; want within (0, %d)", m, 4096-Headroom)
	}

	store := &memStore{m: map[string][]byte{}}
	e, b = setup(t, false, 4096, store)
	if err := e.Enqueue(ctx, []Job{big}); err != nil {
		t.Fatalf("with a store: %v", err)
	}
	var w wire.Job
	if err := wire.DecodeJob(b.msgs[0].Body, &w, nil); err != nil {
		t.Fatal(err)
	}
	if w.PayloadRef == "" || len(store.m) != 1 {
		t.Errorf("offloaded: ref %q, %d payloads stored; want a ref and 1", w.PayloadRef, len(store.m))
	}
}

// A unique job whose key is held is refused and not stored; the others of
// its batch are, and carry their claims.
func TestEnqueueUniqueRefused(t *testing.T) {
	ctx := context.Background()
	e, b := setup(t, false, 1<<20, nil)
	u := func(id string) Job {
		j := job(id, "q")
		j.UniqueKey, j.UniqueWindow = "k", time.Hour
		return j
	}
	err := e.Enqueue(ctx, []Job{u("a"), u("b"), job("c", "q")})
	var ref *RefusedError
	if !errors.As(err, &ref) || len(ref.Held) != 3 || ref.Held[0] != nil || ref.Held[1] == nil || ref.Held[2] != nil {
		t.Fatalf("Enqueue: %v; want b refused alone", err)
	}
	if len(b.msgs) != 2 {
		t.Fatalf("%d messages stored; want 2", len(b.msgs))
	}
	var w wire.Job
	if err := wire.DecodeJob(b.msgs[0].Body, &w, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := unique.Parse(w.Headers[unique.Header]); !ok {
		t.Errorf("the stored unique job carries no claim: %v", w.Headers)
	}
}
