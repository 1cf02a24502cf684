package dirstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform"
)

func newStore(t *testing.T, dir string) *DirStore {
	t.Helper()
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDirStore(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, t.TempDir())
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

// TestForgedReferences: a reference may name only a payload the store made; a
// forged one reads and deletes nothing, and is "not found" (the job is
// dead-lettered as payload_missing).
func TestForgedReferences(t *testing.T) {
	ctx := context.Background()
	dir, outside := t.TempDir(), t.TempDir()
	s := newStore(t, dir)
	mine, err := s.Put(ctx, "job-a", []byte("job a's payload"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		filepath.Join(dir, "config.yaml"):                                                           "password: hunter2",
		filepath.Join(dir, "job-b-1x2y3z.payload"):                                                  "a file named like a payload of the old form",
		filepath.Join(outside, "secret.txt"):                                                        "outside the store",
		filepath.Join(dir, "job-c."+strings.Repeat("0", 32)+"."+strings.Repeat("0", 32)+".payload"): "right shape, wrong tag",
	}
	for path, text := range files {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(dir, "link.payload")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.payload"), 0o700); err != nil {
		t.Fatal(err)
	}
	forged := []string{
		"config.yaml", "job-b-1x2y3z.payload", "link.payload", "sub.payload", "sub.payload/",
		"job-c." + strings.Repeat("0", 32) + "." + strings.Repeat("0", 32) + ".payload",
		filepath.Join(outside, "secret.txt"), "../" + filepath.Base(outside) + "/secret.txt",
		KeyFile, strings.Repeat("x", 300) + ".payload", strings.Repeat("x", 300), "a\x00b.payload", mine + "\x00",
		strings.ToUpper(mine), ".", "..", "/",
	}
	for _, ref := range forged {
		if b, err := s.Get(ctx, ref); !errors.Is(err, asyncplatform.ErrPayloadNotFound) {
			t.Errorf("Get(%.60q) = %q, %v; want an error wrapping ErrPayloadNotFound", ref, b, err)
		}
		if err := s.Delete(ctx, ref); !errors.Is(err, asyncplatform.ErrPayloadNotFound) {
			t.Errorf("Delete(%.60q) = %v; want an error wrapping ErrPayloadNotFound", ref, err)
		}
	}
	for path, text := range files {
		if b, err := os.ReadFile(path); err != nil || string(b) != text {
			t.Errorf("%s was changed or removed: %q, %v", path, b, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "link.payload")); err != nil {
		t.Errorf("the link was removed: %v", err)
	}
	if refs, _ := s.Refs(); len(refs) != 1 || refs[0] != mine {
		t.Errorf("Refs = %q, want only %q", refs, mine)
	}

	// Tied to its job: another job cannot name it.
	if _, err := s.GetJob(ctx, "job-b", mine); !errors.Is(err, asyncplatform.ErrPayloadNotFound) {
		t.Errorf("GetJob by another job: %v", err)
	}
	if err := s.DeleteJob(ctx, "job-b", mine); !errors.Is(err, asyncplatform.ErrPayloadNotFound) {
		t.Errorf("DeleteJob by another job: %v", err)
	}
	if b, err := s.GetJob(ctx, "job-a", mine); err != nil || string(b) != "job a's payload" {
		t.Errorf("GetJob by its job: %q, %v", b, err)
	}

	// A store of another directory (another key) made no reference of this
	// one, even one naming a file that is there.
	other := newStore(t, t.TempDir())
	theirs, err := other.Put(ctx, "job-a", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, theirs), []byte("planted"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, theirs); !errors.Is(err, asyncplatform.ErrPayloadNotFound) {
		t.Errorf("Get of another store's reference: %v", err)
	}
	if err := s.DeleteJob(ctx, "job-a", mine); err != nil {
		t.Errorf("DeleteJob by its job: %v", err)
	}
}

// A reference the store made, whose file was replaced by a link, a
// directory or a FIFO, is refused; nothing is followed or removed.
func TestOnlyRegularFiles(t *testing.T) {
	ctx := context.Background()
	dir, outside := t.TempDir(), t.TempDir()
	s := newStore(t, dir)
	target := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(target, []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"symlink", "dir", "fifo"} {
		ref, err := s.Put(ctx, kind, []byte("payload"))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, ref)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		switch kind {
		case "symlink":
			err = os.Symlink(target, path)
		case "dir":
			err = os.Mkdir(path, 0o700)
		case "fifo":
			err = mkfifo(path)
		}
		if err != nil {
			t.Skipf("%s: %v", kind, err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if b, err := s.Get(ctx, ref); !errors.Is(err, asyncplatform.ErrPayloadNotFound) {
				t.Errorf("%s: Get = %q, %v; want ErrPayloadNotFound", kind, b, err)
			}
			if err := s.Delete(ctx, ref); !errors.Is(err, asyncplatform.ErrPayloadNotFound) {
				t.Errorf("%s: Delete = %v; want ErrPayloadNotFound", kind, err)
			}
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: Get or Delete hangs", kind)
		}
		if _, err := os.Lstat(path); err != nil {
			t.Errorf("%s: removed: %v", kind, err)
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "outside" {
		t.Errorf("the link's target: %q, %v", b, err)
	}
}

// The key is made once per directory, kept private, and shared by every
// store opened there, also when they open at once.
func TestKey(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	stores := make([]*DirStore, 8)
	var wg sync.WaitGroup
	for i := range stores {
		wg.Go(func() {
			s, err := New(dir)
			if err != nil {
				t.Error(err)
				return
			}
			stores[i] = s
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ref, err := stores[0].Put(ctx, "j", []byte("shared"))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range append(stores, newStore(t, dir)) {
		if b, err := s.Get(ctx, ref); err != nil || string(b) != "shared" {
			t.Errorf("store %d: %q, %v", i, b, err)
		}
	}
	fi, err := os.Lstat(filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("the key file's mode is %v, want 0600", perm)
	}
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(dir); err == nil {
		t.Error("New with a damaged key file: no error")
	}
}

// TestDurability: temporary files left by a killed write go when a store
// opens (once older than StaleTempAge), and the directory is synced after a
// payload is renamed into place.
func TestDurability(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := newStore(t, dir)
	old := filepath.Join(dir, ".tmp-123456")
	young := filepath.Join(dir, ".tmp-654321")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte("half a payload"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-StaleTempAge - time.Minute)
	if err := os.Chtimes(old, long, long); err != nil {
		t.Fatal(err)
	}
	newStore(t, dir)
	if _, err := os.Lstat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a stale temporary file stays: %v", err)
	}
	if _, err := os.Lstat(young); err != nil {
		t.Errorf("a young temporary file (maybe a write in progress) was removed: %v", err)
	}

	synced := 0
	orig := syncDir
	syncDir = func(d string) error {
		if d == dir {
			synced++
		}
		return orig(d)
	}
	defer func() { syncDir = orig }()
	if _, err := s.Put(ctx, "j", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if synced == 0 {
		t.Error("Put did not sync the directory after the rename")
	}
}
