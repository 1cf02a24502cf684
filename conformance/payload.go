package conformance

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/dirstore"
)

// offloadConfig is e.config with a directory payload store of the case's own.
func (e *env) offloadConfig(t *testing.T, threshold int) (ap.Config, *dirstore.DirStore) {
	store, err := dirstore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.config()
	cfg.PayloadStore = store
	cfg.OffloadThreshold = threshold
	return cfg, store
}

func randomPayload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

// storeEmpty waits until the store holds no payload: nothing left behind.
func (e *env) storeEmpty(s *dirstore.DirStore) {
	e.t.Helper()
	var refs []string
	e.waitFor("the payload store to be empty", func() bool {
		refs, _ = s.Refs()
		return len(refs) == 0
	})
}

func testOffload10MiB(t *testing.T, e *env) {
	cfg, store := e.offloadConfig(t, 0)
	want := randomPayload(10 << 20)
	got := make(chan []byte, 1)
	w := e.worker(cfg).handle(t, "big", func(_ context.Context, j *ap.Job) error {
		got <- j.Payload
		return nil
	})
	e.enqueue(w.P, &ap.Job{Type: "big", Payload: want})
	w.start(t)
	select {
	case b := <-got:
		if !bytes.Equal(b, want) {
			t.Fatalf("the 10 MiB payload came back different (%d bytes)", len(b))
		}
	case <-time.After(e.opts.Wait):
		t.Fatalf("the 10 MiB job was never delivered\n%s", e.rec)
	}
	e.storeEmpty(store)
}

func testOffloadBoundary(t *testing.T, e *env) {
	const threshold = 1024
	cfg, store := e.offloadConfig(t, threshold)
	producerCfg := cfg
	producerCfg.Queues = nil
	producer := e.worker(producerCfg).P
	sizes := []int{threshold - 1, threshold, threshold + 1}
	payloads := map[string][]byte{}
	for _, n := range sizes {
		j := &ap.Job{Type: "b", Payload: randomPayload(n)}
		e.enqueue(producer, j)
		payloads[j.ID] = j.Payload
		if len(j.Payload) != n {
			t.Fatalf("Enqueue changed the caller's payload")
		}
	}
	if refs, _ := store.Refs(); len(refs) != 1 {
		t.Errorf("%d payloads offloaded, want 1 (only the one over the threshold)", len(refs))
	}
	done := make(chan string, len(sizes))
	w := e.worker(cfg).handle(t, "b", func(_ context.Context, j *ap.Job) error {
		if !bytes.Equal(j.Payload, payloads[j.ID]) {
			return ap.Permanent(errors.New("payload differs"))
		}
		done <- j.ID
		return nil
	})
	w.start(t)
	for range sizes {
		select {
		case <-done:
		case <-time.After(e.opts.Wait):
			t.Fatalf("not every boundary payload arrived intact\n%s", e.rec)
		}
	}
	e.storeEmpty(store)
}

func testOffloadMissing(t *testing.T, e *env) {
	cfg, store := e.offloadConfig(t, 16)
	producerCfg := cfg
	producerCfg.Queues = nil
	job := &ap.Job{Type: "m", Payload: randomPayload(100)}
	e.enqueue(e.worker(producerCfg).P, job)
	refs, _ := store.Refs()
	if len(refs) != 1 {
		t.Fatalf("%d payloads offloaded, want 1", len(refs))
	}
	_ = store.Delete(context.Background(), refs[0]) // the store lost it
	w := e.worker(cfg).handle(t, "m", ok).start(t)
	dl := e.waitDead(w.P, 1)[0]
	if dl.Reason != ap.ReasonPayloadMissing || dl.PayloadRef != refs[0] || dl.Job.ID != job.ID {
		t.Errorf("dead letter reason %q ref %q job %s; want payload_missing %q %s", dl.Reason, dl.PayloadRef, dl.Job.ID, refs[0], job.ID)
	}
	if n := e.rec.count(job.ID); n != 0 {
		t.Errorf("the handler ran %d times without its payload", n)
	}
}

func testOffloadLifecycle(t *testing.T, e *env) {
	cfg, store := e.offloadConfig(t, 16)
	w := e.worker(cfg).handle(t, "l", firstLifeHandler)
	keep, purge := &ap.Job{Type: "l", Payload: randomPayload(200)}, &ap.Job{Type: "l", Payload: randomPayload(300)}
	e.enqueue(w.P, keep)
	w.start(t)
	e.waitDead(w.P, 1) // keep is the oldest dead letter
	e.enqueue(w.P, purge)
	dls := e.waitDead(w.P, 2)
	if refs, _ := store.Refs(); len(refs) != 2 {
		t.Fatalf("the store holds %d payloads while 2 dead letters point at them", len(refs))
	}
	for _, dl := range dls {
		if dl.PayloadRef == "" {
			t.Errorf("listed dead letter %s has no payload reference", dl.Job.ID)
		}
	}
	ctx := ctxT(t, e.opts.Wait)
	var seen []byte
	err := w.P.NextDeadLetter(ctx, e.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
		if dl.Job.ID != keep.ID {
			return false, errors.New("not the oldest dead letter")
		}
		seen = dl.Job.Payload
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(seen, keep.Payload) {
		t.Errorf("NextDeadLetter did not show the offloaded payload")
	}
	if n, err := w.P.Redrive(ctx, e.queue, keep.ID); err != nil || n != 1 {
		t.Fatalf("Redrive: %d, %v", n, err)
	}
	e.waitFor("the redriven job to succeed", func() bool {
		o := e.rec.outcomes(keep.ID)
		return len(o) == 2 && o[1].Outcome == ap.OutcomeSucceeded
	})
	if got := e.rec.of(keep.ID)[1].Job.Payload; !bytes.Equal(got, keep.Payload) {
		t.Errorf("the redriven job lost its offloaded payload")
	}
	if n, err := w.P.PurgeDeadLetters(ctx, e.queue); err != nil || n != 1 {
		t.Fatalf("Purge: %d, %v", n, err)
	}
	e.storeEmpty(store)
}
