// Package dirstore is an asyncplatform.PayloadStore that keeps each
// offloaded payload in a file of one directory: for a single machine, or a
// directory every worker mounts.
//
// # References
//
// A reference is the name of the payload's file, made by Put:
//
//	<job>.<random>.<tag>.payload
//
// where <job> is the job's ID with every byte other than [A-Za-z0-9_-]
// replaced by "_" and cut to 64 bytes, <random> is 128 random bits and <tag>
// is an HMAC-SHA256 (cut to 128 bits) of the two under the store's secret
// key, all in lower-case hex. Get and Delete refuse, as not found (an error
// wrapping asyncplatform.ErrPayloadNotFound, so the job is dead-lettered as
// payload_missing rather than retried), any reference that is not of this
// form or whose tag is not the key's: whoever can write to the broker cannot
// make a worker read or delete any file of the directory the store did not
// make, nor guess the name of one it did. GetJob and DeleteJob also check
// that the reference was made for the given job.
//
// The key is made on the first New in the directory and kept in the file
// .dirstore-key (mode 0600, hex); every worker sharing the directory uses
// it, so they must all be able to read it. Deleting it makes every stored
// reference invalid.
//
// # Files
//
// Only regular files are read or deleted: a symbolic link, a directory or a
// device under a reference's name is refused as not found (never followed,
// never removed). A payload is written to a temporary file (.tmp-*) that is
// synced and renamed into place, and the directory is synced after the
// rename, so a payload is either whole and durable or absent. Temporary files
// left by a process killed mid-write are removed by the next New in the
// directory once they are older than StaleTempAge (younger ones may be
// another process's write in progress).
package dirstore

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform"
)

// StaleTempAge is how old a temporary file (.tmp-*) of the directory must be
// for New to remove it as left behind by a process that died mid-write.
const StaleTempAge = time.Hour

// KeyFile is the name of the file, in the store's directory, holding the
// store's secret key.
const KeyFile = ".dirstore-key"

const (
	keyLen    = 32 // bytes of the secret key
	randLen   = 16 // bytes of a reference's random part
	tagLen    = 16 // bytes of a reference's tag
	maxJobLen = 64 // bytes of the job-ID part of a reference
	refSuffix = ".payload"
	tmpPrefix = ".tmp-"
)

// DirStore is a PayloadStore keeping each payload in a file of a directory.
type DirStore struct {
	dir string
	key []byte
}

var _ asyncplatform.PayloadStore = (*DirStore)(nil)

// New returns a store in dir, creating the directory (mode 0750) and the
// secret key if needed, and removing temporary files older than
// StaleTempAge.
func New(dir string) (*DirStore, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: dirstore.New: directory is empty", asyncplatform.ErrInvalidConfig)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("asyncplatform: payload store directory: %w", err)
	}
	key, err := loadKey(dir)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: payload store key: %w", err)
	}
	s := &DirStore{dir: dir, key: key}
	s.removeStale(time.Now().Add(-StaleTempAge))
	return s, nil
}

// Put implements asyncplatform.PayloadStore.
func (s *DirStore) Put(ctx context.Context, jobID string, payload []byte) (string, error) {
	var rnd [randLen]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", fmt.Errorf("asyncplatform: payload store: %w", err)
	}
	job, r := jobPart(jobID), hex.EncodeToString(rnd[:])
	ref := job + "." + r + "." + s.tag(job, r) + refSuffix
	f, err := os.CreateTemp(s.dir, tmpPrefix+"*")
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
	path := filepath.Join(s.dir, ref)
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("asyncplatform: payload store: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		_ = os.Remove(path)
		return "", fmt.Errorf("asyncplatform: payload store: syncing the directory after writing %s: %w", ref, err)
	}
	return ref, nil
}

// Get implements asyncplatform.PayloadStore. A reference the store did not
// make, or naming anything but a regular file, is not found.
func (s *DirStore) Get(ctx context.Context, ref string) ([]byte, error) {
	if _, err := s.check(ref); err != nil {
		return nil, err
	}
	return s.read(ref)
}

// GetJob is Get for a reference that must have been made for the job with
// the given ID (by Put with that ID): any other is not found. Comparison is
// on the job-ID part of the reference, so two IDs that differ only in bytes
// outside [A-Za-z0-9_-] or past the 64th byte are the same job to it.
func (s *DirStore) GetJob(ctx context.Context, jobID, ref string) ([]byte, error) {
	if err := s.checkJob(jobID, ref); err != nil {
		return nil, err
	}
	return s.read(ref)
}

// Delete implements asyncplatform.PayloadStore. Deleting a payload that is
// gone is not an error; a reference the store did not make, or naming
// anything but a regular file, is refused with an error wrapping
// asyncplatform.ErrPayloadNotFound and nothing is removed.
func (s *DirStore) Delete(ctx context.Context, ref string) error {
	if _, err := s.check(ref); err != nil {
		return err
	}
	return s.remove(ref)
}

// DeleteJob is Delete for a reference that must have been made for the job
// with the given ID, as GetJob checks it.
func (s *DirStore) DeleteJob(ctx context.Context, jobID, ref string) error {
	if err := s.checkJob(jobID, ref); err != nil {
		return err
	}
	return s.remove(ref)
}

// Refs lists the references the store holds (for tests and audits): the
// names of the directory's files that are references it made.
func (s *DirStore) Refs() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var refs []string
	for _, e := range entries {
		if _, err := s.check(e.Name()); err == nil && e.Type().IsRegular() {
			refs = append(refs, e.Name())
		}
	}
	return refs, nil
}

// notFound is the error for a reference that is not, or no longer, a
// payload of the store.
func notFound(ref, why string) error {
	if len(ref) > 80 {
		ref = ref[:80] + "…"
	}
	return fmt.Errorf("%w: %q %s", asyncplatform.ErrPayloadNotFound, ref, why)
}

// check reports whether ref is a reference this store made, and returns its
// job-ID part.
func (s *DirStore) check(ref string) (job string, err error) {
	bad := notFound(ref, "is not a reference this store made")
	name, ok := strings.CutSuffix(ref, refSuffix)
	if !ok || len(name) > maxJobLen+1+2*randLen+1+2*tagLen {
		return "", bad
	}
	parts := strings.Split(name, ".")
	if len(parts) != 3 {
		return "", bad
	}
	job, r, tag := parts[0], parts[1], parts[2]
	if job == "" || len(job) > maxJobLen || jobPart(job) != job || !isHex(r, randLen) || !isHex(tag, tagLen) {
		return "", bad
	}
	if !hmac.Equal([]byte(tag), []byte(s.tag(job, r))) {
		return "", bad
	}
	return job, nil
}

func (s *DirStore) checkJob(jobID, ref string) error {
	job, err := s.check(ref)
	if err != nil {
		return err
	}
	if job != jobPart(jobID) {
		return notFound(ref, "was not made for this job")
	}
	return nil
}

// tag is the HMAC of a reference's job-ID and random parts, in hex.
func (s *DirStore) tag(job, r string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("asyncplatform/dirstore ref v1\x00" + job + "\x00" + r))
	return hex.EncodeToString(m.Sum(nil)[:tagLen])
}

// read returns the content of the regular file named ref, which check
// accepted.
func (s *DirStore) read(ref string) ([]byte, error) {
	path := filepath.Join(s.dir, ref)
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, notFound(ref, "is gone")
	}
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: payload store: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, notFound(ref, "is not a regular file")
	}
	f, err := os.OpenFile(path, os.O_RDONLY|openFlags, 0)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, notFound(ref, "is gone")
	case isLoop(err):
		return nil, notFound(ref, "is not a regular file")
	case err != nil:
		return nil, fmt.Errorf("asyncplatform: payload store: %w", err)
	}
	defer f.Close()
	ofi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: payload store: %w", err)
	}
	if !ofi.Mode().IsRegular() || !os.SameFile(fi, ofi) {
		return nil, notFound(ref, "is not a regular file")
	}
	buf := bytes.NewBuffer(make([]byte, 0, ofi.Size()+bytes.MinRead))
	if _, err := buf.ReadFrom(f); err != nil {
		return nil, fmt.Errorf("asyncplatform: payload store: reading %s: %w", ref, err)
	}
	return buf.Bytes(), nil
}

// remove deletes the regular file named ref, which check accepted.
func (s *DirStore) remove(ref string) error {
	path := filepath.Join(s.dir, ref)
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("asyncplatform: payload store: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return notFound(ref, "is not a regular file; not removed")
	}
	// Were it swapped for a link or a directory since, Remove would take
	// the link itself, or fail on a directory that is not empty: it never
	// reaches through a link.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("asyncplatform: payload store: %w", err)
	}
	return nil
}

// removeStale removes the temporary files last modified before cutoff.
// Failures are ignored: a file left is tried again at the next New.
func (s *DirStore) removeStale(cutoff time.Time) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tmpPrefix) {
			continue
		}
		fi, err := e.Info() // Lstat: a link is judged, and removed, itself
		if err != nil || fi.IsDir() || !fi.ModTime().Before(cutoff) {
			continue
		}
		_ = os.Remove(filepath.Join(s.dir, e.Name()))
	}
}

// loadKey reads the directory's key, making it first if there is none. Two
// processes opening a new directory at once agree on one key: it is written
// to a temporary file and linked into place, which fails if the other was
// first.
func loadKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, KeyFile)
	for range 100 {
		key, err := readKey(path)
		if err == nil {
			return key, nil
		}
		if errors.Is(err, errShortKey) { // being written by another process (no hard links there)
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		if err := makeKey(dir, path); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%s stays incomplete", path)
}

var errShortKey = errors.New("the key file is incomplete")

func readKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|openFlags, 0)
	if err != nil {
		if isLoop(err) {
			return nil, fmt.Errorf("%s is a symbolic link", path)
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 4*keyLen))
	if err != nil {
		return nil, err
	}
	text := strings.TrimSpace(string(b))
	if len(text) < 2*keyLen && strings.Trim(text, "0123456789abcdef") == "" {
		return nil, errShortKey
	}
	key, err := hex.DecodeString(text)
	if err != nil || len(key) != keyLen {
		return nil, fmt.Errorf("%s does not hold a key (%d hex digits)", path, 2*keyLen)
	}
	return key, nil
}

// makeKey writes a new key to path unless it exists (os.ErrExist).
func makeKey(dir, path string) error {
	key := make([]byte, keyLen)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	text := []byte(hex.EncodeToString(key) + "\n")
	f, err := os.CreateTemp(dir, tmpPrefix+"key-*") // mode 0600
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, werr := f.Write(text)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return err
	}
	err = os.Link(tmp, path)
	if err != nil && !errors.Is(err, os.ErrExist) {
		// No hard links on this file system: create it exclusively and
		// write it in place; a reader seeing it short waits (errShortKey).
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, werr := f.Write(text)
		serr := f.Sync()
		cerr := f.Close()
		err = errors.Join(werr, serr, cerr)
	}
	if err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir makes the directory's entries durable (a rename, a link). A
// variable so that tests can see it called.
var syncDir = func(dir string) error {
	if runtime.GOOS == "windows" { // directories cannot be opened for syncing there
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	serr := d.Sync()
	return errors.Join(serr, d.Close())
}

func isHex(s string, n int) bool {
	if len(s) != 2*n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// jobPart is the job-ID part of a reference: the ID's bytes with every one
// outside [A-Za-z0-9_-] replaced by "_", cut to maxJobLen; "_" for an empty
// ID.
func jobPart(id string) string {
	if id == "" {
		return "_"
	}
	b := []byte(id[:min(len(id), maxJobLen)])
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}
