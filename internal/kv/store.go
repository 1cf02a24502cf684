package kv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The page sizes of Store.List.
const (
	DefaultListLimit = 100  // when the limit asked is zero or negative
	MaxListLimit     = 1000 // the largest page
)

// Store is a driver.Store seen through one namespace, with every key, value,
// TTL and revision checked before the backend is called. The platform's
// engines keep their state in one each (Of); asyncplatform.Store wraps one
// for users. The zero Store refuses every call.
type Store struct {
	d  driver.Store
	ns string // the namespace and '/'
}

// New returns the Store of namespace over d. The caller checks the name.
func New(d driver.Store, namespace string) *Store {
	return &Store{d: d, ns: namespace + "/"}
}

// Of returns the Store of one of the platform's namespaces over d.
func Of(d driver.Store, ns Namespace) *Store { return New(d, string(ns)) }

// Error is the error of every Store operation, the platform's engines'
// included; users know it as asyncplatform.StoreError.
type Error struct {
	// Op is the operation: "get", "create", "update", "delete" or "list".
	Op string
	// Key is the key (or prefix) as the caller gave it.
	Key string
	// Err is the cause: a driver sentinel (driver.ErrKeyNotFound, ...) or
	// the backend's own error.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("asyncplatform: store %s %q: %v", e.Op, e.Key, e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

func opErr(op, key string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Op: op, Key: key, Err: err}
}

// ErrNil is the cause of every error of the zero Store.
var ErrNil = errors.New("the Store was not made by NewStore or Platform.Store")

func (s *Store) zero() bool { return s == nil || s.d == nil }

// Get returns the value of key and its revision; driver.ErrKeyNotFound when
// it is absent or expired.
func (s *Store) Get(ctx context.Context, key string) (value []byte, rev string, err error) {
	if s.zero() {
		return nil, "", opErr("get", key, ErrNil)
	}
	if err := driver.CheckKey(key); err != nil {
		return nil, "", opErr("get", key, err)
	}
	v, rev, err := s.d.Get(ctx, s.ns+key)
	if err != nil {
		return nil, "", opErr("get", key, err)
	}
	return v, rev, nil
}

// Create writes key only when it is absent or expired; driver.ErrKeyExists
// otherwise.
func (s *Store) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (rev string, err error) {
	if s.zero() {
		return "", opErr("create", key, ErrNil)
	}
	ttl, err = checkWrite(key, value, ttl)
	if err != nil {
		return "", opErr("create", key, err)
	}
	rev, err = s.d.Create(ctx, s.ns+key, value, ttl)
	return rev, opErr("create", key, err)
}

// Item returns the driver's item that creates key with value for ttl, as
// Create would (checked, in the store's namespace), for a caller that
// creates it through the driver itself (driver.ClaimingEnqueuer).
func (s *Store) Item(key string, value []byte, ttl time.Duration) (driver.BatchItem, error) {
	if s.zero() {
		return driver.BatchItem{}, opErr("create", key, ErrNil)
	}
	ttl, err := checkWrite(key, value, ttl)
	if err != nil {
		return driver.BatchItem{}, opErr("create", key, err)
	}
	return driver.BatchItem{Key: s.ns + key, Value: value, TTL: ttl}, nil
}

// Update writes key only when it is present at revision rev;
// driver.ErrRevision otherwise.
func (s *Store) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (newRev string, err error) {
	if s.zero() {
		return "", opErr("update", key, ErrNil)
	}
	ttl, err = checkWrite(key, value, ttl)
	if err != nil {
		return "", opErr("update", key, err)
	}
	if !plausibleRev(rev) {
		return "", opErr("update", key, driver.ErrRevision)
	}
	newRev, err = s.d.Update(ctx, s.ns+key, value, rev, ttl)
	return newRev, opErr("update", key, err)
}

// Delete removes key: whatever is there when rev is empty (an absent key is
// no error), else only at revision rev (driver.ErrRevision otherwise).
func (s *Store) Delete(ctx context.Context, key, rev string) error {
	if s.zero() {
		return opErr("delete", key, ErrNil)
	}
	if err := driver.CheckKey(key); err != nil {
		return opErr("delete", key, err)
	}
	if rev != "" && !plausibleRev(rev) {
		return opErr("delete", key, driver.ErrRevision)
	}
	return opErr("delete", key, s.d.Delete(ctx, s.ns+key, rev))
}

// DeleteValue removes key only when it is at revision rev (any, when rev
// is empty) and holds exactly value (driver.DeleteValue: one round trip on
// a store that has it); driver.ErrRevision otherwise.
func (s *Store) DeleteValue(ctx context.Context, key, rev string, value []byte) error {
	if s.zero() {
		return opErr("delete", key, ErrNil)
	}
	if err := driver.CheckKey(key); err != nil {
		return opErr("delete", key, err)
	}
	if rev != "" && !plausibleRev(rev) {
		return opErr("delete", key, driver.ErrRevision)
	}
	return opErr("delete", key, driver.DeleteValue(ctx, s.d, s.ns+key, rev, value))
}

// GetEach is Get of each key (driver.GetEach: one round trip on a store
// that batches, at most driver.MaxBatch distinct keys): a result's Err is
// nil or driver.ErrKeyNotFound.
func (s *Store) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	if s.zero() {
		return nil, opErr("get", firstKey(keys), ErrNil)
	}
	full := make([]string, len(keys))
	for i, k := range keys {
		if err := driver.CheckKey(k); err != nil {
			return nil, opErr("get", k, err)
		}
		full[i] = s.ns + k
	}
	rs, err := driver.GetEach(ctx, s.d, full)
	return rs, opErr("get", firstKey(keys), err)
}

// CreateEach is Create of each item's Key, Value and TTL (driver.CreateEach:
// one round trip on a store that batches, at most driver.MaxBatch distinct
// keys): a result's Err is nil or driver.ErrKeyExists. Its error may
// follow any subset of the items' writes.
func (s *Store) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if s.zero() {
		return nil, opErr("create", "", ErrNil)
	}
	full := make([]driver.BatchItem, len(items))
	for i, it := range items {
		ttl, err := checkWrite(it.Key, it.Value, it.TTL)
		if err != nil {
			return nil, opErr("create", it.Key, err)
		}
		full[i] = driver.BatchItem{Key: s.ns + it.Key, Value: it.Value, TTL: ttl}
	}
	rs, err := driver.CreateEach(ctx, s.d, full)
	if err != nil {
		key := ""
		if len(items) > 0 {
			key = items[0].Key
		}
		return nil, opErr("create", key, err)
	}
	return rs, nil
}

// UpdateEach is Update of each item's Key to its Value and TTL at its Rev
// (driver.UpdateEach: one round trip on a store that batches, at most
// driver.MaxBatch distinct keys): a result's Rev is the new revision, or
// its Err driver.ErrRevision (an item whose Rev the store cannot have
// given gets it without being sent). Its error may follow any subset of
// the items' writes.
func (s *Store) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if s.zero() {
		return nil, opErr("update", "", ErrNil)
	}
	out := make([]driver.BatchResult, len(items))
	full := make([]driver.BatchItem, 0, len(items))
	sent := make([]int, 0, len(items)) // full[j] is items[sent[j]]
	for i, it := range items {
		ttl, err := checkWrite(it.Key, it.Value, it.TTL)
		if err != nil {
			return nil, opErr("update", it.Key, err)
		}
		if !plausibleRev(it.Rev) {
			out[i].Err = driver.ErrRevision
			continue
		}
		full = append(full, driver.BatchItem{Key: s.ns + it.Key, Value: it.Value, TTL: ttl, Rev: it.Rev})
		sent = append(sent, i)
	}
	if len(full) == 0 {
		return out, nil
	}
	rs, err := driver.UpdateEach(ctx, s.d, full)
	if err != nil {
		return nil, opErr("update", items[sent[0]].Key, err)
	}
	for j, r := range rs {
		out[sent[j]] = r
	}
	return out, nil
}

// DeleteValueEach removes each item's Key when it is at its Rev (any,
// when empty) and holds exactly its Value (driver.DeleteValueEach: one
// round trip on a store that batches, at most driver.MaxBatch distinct
// keys): a result's Err is nil or driver.ErrRevision (an item whose Rev
// the store cannot have given gets it without being sent). Its error may
// follow any subset of the items' deletes.
func (s *Store) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if s.zero() {
		return nil, opErr("delete", "", ErrNil)
	}
	out := make([]driver.BatchResult, len(items))
	full := make([]driver.BatchItem, 0, len(items))
	sent := make([]int, 0, len(items)) // full[j] is items[sent[j]]
	for i, it := range items {
		if err := driver.CheckKey(it.Key); err != nil {
			return nil, opErr("delete", it.Key, err)
		}
		if it.Rev != "" && !plausibleRev(it.Rev) {
			out[i].Err = driver.ErrRevision
			continue
		}
		full = append(full, driver.BatchItem{Key: s.ns + it.Key, Value: it.Value, Rev: it.Rev})
		sent = append(sent, i)
	}
	if len(full) == 0 {
		return out, nil
	}
	rs, err := driver.DeleteValueEach(ctx, s.d, full)
	if err != nil {
		return nil, opErr("delete", items[sent[0]].Key, err)
	}
	for j, r := range rs {
		out[sent[j]] = r
	}
	return out, nil
}

// firstKey names a batch in its error: its first key.
func firstKey(keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// List returns the keys that start with prefix, in byte order, limit at a
// time (DefaultListLimit when zero or less, at most MaxListLimit), after
// cursor; next is the cursor of the next page, empty on the last.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) (keys []string, next string, err error) {
	if s.zero() {
		return nil, "", opErr("list", prefix, ErrNil)
	}
	if err := driver.CheckKeyPrefix(prefix); err != nil {
		return nil, "", opErr("list", prefix, err)
	}
	if cursor != "" {
		if err := driver.CheckKey(cursor); err != nil {
			return nil, "", opErr("list", prefix, fmt.Errorf("cursor: %w", err))
		}
	}
	if limit <= 0 {
		limit = DefaultListLimit
	}
	limit = min(limit, MaxListLimit)
	after := ""
	if cursor != "" {
		after = s.ns + cursor
	}
	// One more than asked, to know whether a next page exists.
	got, err := s.d.List(ctx, s.ns+prefix, after, limit+1)
	if err != nil {
		return nil, "", opErr("list", prefix, err)
	}
	keys = make([]string, 0, min(len(got), limit))
	for _, k := range got {
		if len(keys) == limit {
			next = keys[limit-1]
			break
		}
		user, ok := strings.CutPrefix(k, s.ns)
		if !ok {
			return nil, "", opErr("list", prefix, fmt.Errorf("the backend listed %q, outside the namespace", k))
		}
		keys = append(keys, user)
	}
	return keys, next, nil
}

// ListAll calls fn with every key under prefix, a page at a time, until fn
// returns false or an error, or the keys run out.
func (s *Store) ListAll(ctx context.Context, prefix string, fn func(key string) (bool, error)) error {
	cursor := ""
	for {
		keys, next, err := s.List(ctx, prefix, cursor, MaxListLimit)
		if err != nil {
			return err
		}
		for _, k := range keys {
			more, err := fn(k)
			if err != nil || !more {
				return err
			}
		}
		if next == "" {
			return nil
		}
		cursor = next
	}
}

func checkWrite(key string, value []byte, ttl time.Duration) (time.Duration, error) {
	if err := driver.CheckKey(key); err != nil {
		return 0, err
	}
	if err := driver.CheckValue(value); err != nil {
		return 0, err
	}
	if err := driver.CheckTTL(ttl); err != nil {
		return 0, err
	}
	if r := ttl % time.Millisecond; r != 0 { // rounded up to whole milliseconds
		ttl += time.Millisecond - r
	}
	return ttl, nil
}

// plausibleRev reports whether rev could be a revision a store returned; one
// that cannot is nobody's revision.
func plausibleRev(rev string) bool {
	return rev != "" && len(rev) <= driver.MaxRevisionLen
}

// Segment returns s as one key segment: s itself when it is one (at most 200
// bytes, in the key grammar, no '/', not starting "sha-"), else "sha-" and
// the hex of the first 20 bytes of its SHA-256. Distinct strings give
// distinct segments: a hashed one cannot be taken for one kept as it is.
func Segment(s string) string {
	if s != "" && len(s) <= 200 && !strings.Contains(s, "/") && driver.CheckKey(s) == nil && !strings.HasPrefix(s, "sha-") {
		return s
	}
	h := sha256.Sum256([]byte(s))
	return "sha-" + hex.EncodeToString(h[:20])
}
