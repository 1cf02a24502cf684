package dirstore

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/asyncplatform/asyncplatform"
)

func TestDirStore(t *testing.T) {
	ctx := context.Background()
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ref, err := s.Put(ctx, "job/../1", []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := s.Get(ctx, ref); err != nil || !bytes.Equal(b, []byte("hello")) {
		t.Fatalf("Get: %q, %v", b, err)
	}
	if refs, _ := s.Refs(); len(refs) != 1 || refs[0] != ref {
		t.Errorf("Refs: %v", refs)
	}
	if err := s.Delete(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, ref); err != nil {
		t.Errorf("deleting twice: %v", err)
	}
	if _, err := s.Get(ctx, ref); !errors.Is(err, asyncplatform.ErrPayloadNotFound) {
		t.Errorf("Get after Delete: %v", err)
	}
	for _, bad := range []string{"", "../x.payload", "a/b", ".tmp-1"} {
		if _, err := s.Get(ctx, bad); !errors.Is(err, asyncplatform.ErrPayloadNotFound) {
			t.Errorf("Get(%q): %v, want asyncplatform.ErrPayloadNotFound (not a reference it made)", bad, err)
		}
	}
	if _, err := New(""); !errors.Is(err, asyncplatform.ErrInvalidConfig) {
		t.Errorf("empty dir: %v", err)
	}
}
