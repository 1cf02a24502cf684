package dirstore_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/dirstore"
)

// forger is the producer's store of a forged job: it "stores" nothing and
// hands out the reference it was given.
type forger struct{ ref string }

func (f forger) Put(context.Context, string, []byte) (string, error) { return f.ref, nil }
func (forger) Get(context.Context, string) ([]byte, error)           { return nil, ap.ErrPayloadNotFound }
func (forger) Delete(context.Context, string) error                  { return nil }

// counting counts the Get calls of the worker's store.
type counting struct {
	*dirstore.DirStore
	gets atomic.Int64
}

func (c *counting) Get(ctx context.Context, ref string) ([]byte, error) {
	c.gets.Add(1)
	return c.DirStore.Get(ctx, ref)
}

// GetJob is what the platform calls: the store is an ap.JobPayloadStore.
func (c *counting) GetJob(ctx context.Context, jobID, ref string) ([]byte, error) {
	c.gets.Add(1)
	return c.DirStore.GetJob(ctx, jobID, ref)
}

var _ ap.JobPayloadStore = (*counting)(nil)

// TestForgedJobIsPayloadMissing: a job whose reference names a directory, is too long
// for a file name, holds a NUL byte or names a file the store did not make is
// dead-lettered once as payload_missing, not requeued uncounted for ever.
func TestForgedJobIsPayloadMissing(t *testing.T) {
	dir := t.TempDir()
	store, err := dirstore.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"sub", strings.Repeat("x", 300), "a\x00b", "config.yaml"} {
		t.Run("", func(t *testing.T) {
			broker := memory.NewBroker()
			ctx := context.Background()
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			producer, err := ap.New(broker.Connect(), ap.Config{Logger: quiet, PayloadStore: forger{ref}, OffloadThreshold: 8})
			if err != nil {
				t.Fatal(err)
			}
			if err := producer.Enqueue(ctx, &ap.Job{Type: "t", Payload: []byte("more than eight bytes")}); err != nil {
				t.Fatal(err)
			}
			worker := &counting{DirStore: store}
			dead := make(chan ap.DeadLetter, 10)
			p, err := ap.New(broker.Connect(), ap.Config{
				Logger: quiet, PayloadStore: worker, RejectDelay: time.Millisecond,
				Hooks: ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl }},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Handle("t", func(context.Context, *ap.Job) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if err := p.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer p.Stop(ctx)
			select {
			case dl := <-dead:
				if dl.Reason != ap.ReasonPayloadMissing {
					t.Errorf("%.20q: dead-lettered as %s, want %s", ref, dl.Reason, ap.ReasonPayloadMissing)
				}
			case <-time.After(3 * time.Second):
				t.Fatalf("%.20q: not dead-lettered after %d fetches", ref, worker.gets.Load())
			}
			if n := worker.gets.Load(); n != 1 {
				t.Errorf("%.20q: %d fetches, want 1", ref, n)
			}
			if _, err := os.Stat(filepath.Join(dir, "config.yaml")); err != nil {
				t.Errorf("config.yaml: %v", err)
			}
		})
	}
}

// A forged job that names another job's payload (a reference the store
// really made) is dead-lettered payload_missing, and the other job's payload
// is neither read nor deleted: the platform presents the job's ID with the
// reference (ap.JobPayloadStore).
func TestForgedJobCannotTakeAnotherJobsPayload(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := dirstore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	victim, err := store.Put(ctx, "victim-job", []byte("the victim's secret payload"))
	if err != nil {
		t.Fatal(err)
	}
	broker := memory.NewBroker()
	producer, err := ap.New(broker.Connect(), ap.Config{Logger: quiet, PayloadStore: forger{victim}, OffloadThreshold: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := producer.Enqueue(ctx, &ap.Job{ID: "forged-job", Type: "t", Payload: []byte("more than eight bytes")}); err != nil {
		t.Fatal(err)
	}
	dead := make(chan ap.DeadLetter, 1)
	var ran atomic.Int32
	p, err := ap.New(broker.Connect(), ap.Config{Logger: quiet, PayloadStore: store,
		Hooks: ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl }}})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Handle("t", func(context.Context, *ap.Job) error { ran.Add(1); return nil })
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	select {
	case dl := <-dead:
		if dl.Reason != ap.ReasonPayloadMissing {
			t.Errorf("dead-lettered as %s, want payload_missing", dl.Reason)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the forged job was not dead-lettered")
	}
	if ran.Load() != 0 {
		t.Error("the forged job's handler ran with another job's payload")
	}
	if b, err := store.GetJob(ctx, "victim-job", victim); err != nil || string(b) != "the victim's secret payload" {
		t.Errorf("the victim's payload: %q, %v", b, err)
	}
}
