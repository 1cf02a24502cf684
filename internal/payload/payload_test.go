package payload

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// mapStore is a PayloadStore in a map; jobs makes it a JobStore that
// checks which job a reference was made for.
type mapStore struct {
	mu      sync.Mutex
	m       map[string][]byte
	owner   map[string]string
	deleted []string
	failDel error
}

func newMapStore() *mapStore { return &mapStore{m: map[string][]byte{}, owner: map[string]string{}} }

func (s *mapStore) Put(_ context.Context, jobID string, p []byte) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref := "ref-" + jobID
	s.m[ref], s.owner[ref] = bytes.Clone(p), jobID
	return ref, nil
}

func (s *mapStore) Get(_ context.Context, ref string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[ref]
	if !ok {
		return nil, ErrNotFound
	}
	return b, nil
}

func (s *mapStore) Delete(_ context.Context, ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failDel != nil {
		return s.failDel
	}
	delete(s.m, ref)
	s.deleted = append(s.deleted, ref)
	return nil
}

type jobStore struct{ *mapStore }

func (s jobStore) GetJob(ctx context.Context, jobID, ref string) ([]byte, error) {
	if s.owner[ref] != jobID {
		return nil, ErrNotFound
	}
	return s.Get(ctx, ref)
}

func (s jobStore) DeleteJob(ctx context.Context, jobID, ref string) error {
	if s.owner[ref] != jobID {
		return nil
	}
	return s.Delete(ctx, ref)
}

func TestNilWithoutStore(t *testing.T) {
	var none Store
	p := New(none, slog.Default())
	if p != nil {
		t.Fatal("New(nil) is not nil: every job would be offloaded to nothing")
	}
	p.Drop(context.Background(), "j", "r") // a nil Payloads drops nothing, without a panic
	p.DropAll(context.Background(), []Key{{"j", "r"}})
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	for name, s := range map[string]Store{"plain": newMapStore(), "job": jobStore{newMapStore()}} {
		t.Run(name, func(t *testing.T) {
			p := New(s, slog.New(slog.NewTextHandler(io.Discard, nil)))
			ref, err := p.Put(ctx, "j1", []byte("big"))
			if err != nil {
				t.Fatal(err)
			}
			if b, err := p.Get(ctx, "j1", ref); err != nil || string(b) != "big" {
				t.Fatalf("Get = %q, %v", b, err)
			}
			p.DropAll(ctx, []Key{{Job: "j1", Ref: ref}, {Job: "j1", Ref: ""}})
			if _, err := p.Get(ctx, "j1", ref); !errors.Is(err, p.Gone()) {
				t.Fatalf("after Drop: %v, want the gone error", err)
			}
		})
	}
}

// A JobStore's references answer only the job they were made for: a forged
// job naming another job's reference gets nothing, and deletes nothing.
func TestJobStoreChecksTheJob(t *testing.T) {
	ctx := context.Background()
	ms := newMapStore()
	p := New(jobStore{ms}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ref, _ := p.Put(ctx, "owner", []byte("secret"))
	if _, err := p.Get(ctx, "forger", ref); !errors.Is(err, ErrNotFound) {
		t.Errorf("another job's reference: %v, want ErrNotFound", err)
	}
	p.Drop(ctx, "forger", ref)
	if b, err := p.Get(ctx, "owner", ref); err != nil || string(b) != "secret" {
		t.Errorf("after a forged Drop: %q, %v; want the payload kept", b, err)
	}
}

// A failed delete is logged (the payload leaks), never silent.
func TestDropFailureLogged(t *testing.T) {
	ms := newMapStore()
	ms.failDel = errors.New("store down")
	var logs strings.Builder
	p := New(ms, slog.New(slog.NewTextHandler(&logs, nil)))
	p.Drop(context.Background(), "j", "ref-j")
	if !strings.Contains(logs.String(), "store down") {
		t.Errorf("a failed delete was not logged: %q", logs.String())
	}
}
