// Package dirstore is an asyncplatform.PayloadStore that keeps each
// offloaded payload in a file of one directory: for a single machine, or a
// directory every worker mounts.
package dirstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/asyncplatform/asyncplatform"
)

// DirStore is a PayloadStore keeping each payload in a file of a directory.
// Writes go to a temporary file that is synced and renamed into place, so a
// payload is either whole or absent.
type DirStore struct {
	dir string
}

var _ asyncplatform.PayloadStore = (*DirStore)(nil)

// New returns a store in dir, creating the directory if needed.
func New(dir string) (*DirStore, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: dirstore.New: directory is empty", asyncplatform.ErrInvalidConfig)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("asyncplatform: payload store directory: %w", err)
	}
	return &DirStore{dir: dir}, nil
}

// Put implements asyncplatform.PayloadStore. The reference is the file's name.
func (s *DirStore) Put(ctx context.Context, jobID string, payload []byte) (string, error) {
	ref := safeName(jobID) + "-" + strconv.FormatUint(rand.Uint64(), 36) + ".payload"
	f, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return "", fmt.Errorf("asyncplatform: payload store: %w", err)
	}
	tmp := f.Name()
	_, werr := f.Write(payload)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("asyncplatform: payload store: writing %s: %w", ref, err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, ref)); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("asyncplatform: payload store: %w", err)
	}
	return ref, nil
}

// Get implements asyncplatform.PayloadStore.
func (s *DirStore) Get(ctx context.Context, ref string) ([]byte, error) {
	path, err := s.path(ref)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", asyncplatform.ErrPayloadNotFound, ref)
	}
	return b, err
}

// Delete implements asyncplatform.PayloadStore.
func (s *DirStore) Delete(ctx context.Context, ref string) error {
	path, err := s.path(ref)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Refs lists the references the store holds (for tests and audits).
func (s *DirStore) Refs() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var refs []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".payload") {
			refs = append(refs, e.Name())
		}
	}
	return refs, nil
}

func (s *DirStore) path(ref string) (string, error) {
	if ref == "" || ref != filepath.Base(ref) || strings.HasPrefix(ref, ".") {
		// Not one of ours: to the job it is as gone as a deleted payload.
		return "", fmt.Errorf("%w: %q is not a reference this store made", asyncplatform.ErrPayloadNotFound, ref)
	}
	return filepath.Join(s.dir, ref), nil
}

func safeName(s string) string {
	var b strings.Builder
	for _, c := range s {
		if b.Len() >= 64 {
			break
		}
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
