package memory

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/btree"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The store (driver.Store) of a Broker: a map of entries under a lock of its
// own, shared by the Broker's connections, and the keys in byte order in a
// B-tree for List (a key created or removed costs O(log n), a List
// O(log n) and the keys it walks, however many keys the store holds).
// Revisions come from one counter
// per broker, so a revision is never given twice. Expiry is judged by this
// process's monotonic clock; expired entries are dropped when a method
// meets them, and by a sweep once the writes since the last one outnumber
// the entries.

var _ driver.Store = (*Backend)(nil)

// sweepMin is the fewest writes between two sweeps.
const sweepMin = 1024

type kvEntry struct {
	value   []byte
	rev     uint64
	expires time.Time // zero: never
}

func (e *kvEntry) live(now time.Time) bool {
	return e != nil && (e.expires.IsZero() || now.Before(e.expires))
}

// kvState is the store of one Broker. The zero value is ready to use.
type kvState struct {
	mu      sync.Mutex
	entries map[string]*kvEntry
	index   *btree.BTreeG[string] // the keys of entries, in byte order
	rev     uint64                // last revision given
	writes  int                   // since the last sweep
}

func (b *Backend) kv() (*kvState, error) {
	select {
	case <-b.done:
		return nil, driver.ErrClosed
	default:
	}
	kv := &b.broker.kv
	kv.mu.Lock()
	if kv.entries == nil {
		kv.entries = make(map[string]*kvEntry)
		kv.index = btree.NewOrderedG[string](32)
	}
	return kv, nil
}

// remove drops key. The lock is held.
func (kv *kvState) remove(key string) {
	if _, ok := kv.entries[key]; ok {
		delete(kv.entries, key)
		kv.index.Delete(key)
	}
}

// put writes key and returns its new revision. The lock is held.
func (kv *kvState) put(key string, value []byte, ttl time.Duration, now time.Time) string {
	e := kv.entries[key]
	if e == nil {
		e = &kvEntry{}
		kv.entries[key] = e
		kv.index.ReplaceOrInsert(key)
	}
	kv.rev++
	e.value, e.rev, e.expires = slices.Clone(value), kv.rev, time.Time{}
	if e.value == nil {
		e.value = []byte{}
	}
	if ttl > 0 {
		e.expires = now.Add(ttl)
	}
	if kv.writes++; kv.writes >= max(sweepMin, len(kv.entries)) {
		kv.writes = 0
		for k, e := range kv.entries {
			if !e.live(now) {
				kv.remove(k)
			}
		}
	}
	return strconv.FormatUint(e.rev, 10)
}

// at returns the live entry of key at revision rev, or nil. The lock is
// held.
func (kv *kvState) at(key, rev string, now time.Time) *kvEntry {
	e := kv.entries[key]
	if !e.live(now) || strconv.FormatUint(e.rev, 10) != rev {
		return nil
	}
	return e
}

// Get implements driver.Store.
func (b *Backend) Get(ctx context.Context, key string) ([]byte, string, error) {
	kv, err := b.kv()
	if err != nil {
		return nil, "", err
	}
	defer kv.mu.Unlock()
	e := kv.entries[key]
	if !e.live(time.Now()) {
		return nil, "", driver.ErrKeyNotFound
	}
	return slices.Clone(e.value), strconv.FormatUint(e.rev, 10), nil
}

// Create implements driver.Store.
func (b *Backend) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	kv, err := b.kv()
	if err != nil {
		return "", err
	}
	defer kv.mu.Unlock()
	now := time.Now()
	if kv.entries[key].live(now) {
		return "", driver.ErrKeyExists
	}
	return kv.put(key, value, ttl, now), nil
}

// Update implements driver.Store.
func (b *Backend) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	kv, err := b.kv()
	if err != nil {
		return "", err
	}
	defer kv.mu.Unlock()
	now := time.Now()
	if kv.at(key, rev, now) == nil {
		return "", driver.ErrRevision
	}
	return kv.put(key, value, ttl, now), nil
}

// Delete implements driver.Store.
func (b *Backend) Delete(ctx context.Context, key, rev string) error {
	kv, err := b.kv()
	if err != nil {
		return err
	}
	defer kv.mu.Unlock()
	if rev != "" && kv.at(key, rev, time.Now()) == nil {
		return driver.ErrRevision
	}
	kv.remove(key)
	return nil
}

var _ driver.StoreValueDeleter = (*Backend)(nil)

// DeleteValue implements driver.StoreValueDeleter.
func (b *Backend) DeleteValue(ctx context.Context, key, rev string, value []byte) error {
	kv, err := b.kv()
	if err != nil {
		return err
	}
	defer kv.mu.Unlock()
	e := kv.entries[key]
	if rev != "" {
		e = kv.at(key, rev, time.Now())
	} else if !e.live(time.Now()) {
		e = nil
	}
	if e == nil || !bytes.Equal(e.value, value) {
		return driver.ErrRevision
	}
	kv.remove(key)
	return nil
}

// List implements driver.Store.
func (b *Backend) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	kv, err := b.kv()
	if err != nil {
		return nil, err
	}
	defer kv.mu.Unlock()
	now := time.Now()
	from := prefix
	if after > from {
		from = after
	}
	var out, expired []string
	kv.index.AscendGreaterOrEqual(from, func(k string) bool {
		if len(out) >= limit || !strings.HasPrefix(k, prefix) {
			return false
		}
		switch e := kv.entries[k]; {
		case k == after:
		case !e.live(now):
			expired = append(expired, k)
		default:
			out = append(out, k)
		}
		return true
	})
	for _, k := range expired {
		kv.remove(k)
	}
	return out, nil
}

var _ driver.StoreBatcher = (*Backend)(nil)

// GetEach implements driver.StoreBatcher: under one hold of the store's lock.
func (b *Backend) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	kv, err := b.kv()
	if err != nil {
		return nil, err
	}
	defer kv.mu.Unlock()
	now := time.Now()
	out := make([]driver.BatchResult, len(keys))
	for i, k := range keys {
		e := kv.entries[k]
		if !e.live(now) {
			out[i].Err = driver.ErrKeyNotFound
			continue
		}
		out[i] = driver.BatchResult{Value: slices.Clone(e.value), Rev: strconv.FormatUint(e.rev, 10)}
	}
	return out, nil
}

// CreateEach implements driver.StoreBatcher: under one hold of the store's
// lock.
func (b *Backend) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	kv, err := b.kv()
	if err != nil {
		return nil, err
	}
	defer kv.mu.Unlock()
	now := time.Now()
	out := make([]driver.BatchResult, len(items))
	for i, it := range items {
		if kv.entries[it.Key].live(now) {
			out[i].Err = driver.ErrKeyExists
			continue
		}
		out[i].Rev = kv.put(it.Key, it.Value, it.TTL, now)
	}
	return out, nil
}

// DeleteEach implements driver.StoreBatcher: under one hold of the store's
// lock.
func (b *Backend) DeleteEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	kv, err := b.kv()
	if err != nil {
		return nil, err
	}
	defer kv.mu.Unlock()
	now := time.Now()
	out := make([]driver.BatchResult, len(items))
	for i, it := range items {
		if it.Rev != "" && kv.at(it.Key, it.Rev, now) == nil {
			out[i].Err = driver.ErrRevision
			continue
		}
		kv.remove(it.Key)
	}
	return out, nil
}

var _ driver.StoreBatchUpdater = (*Backend)(nil)

// UpdateEach implements driver.StoreBatchUpdater: under one hold of the
// store's lock.
func (b *Backend) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	kv, err := b.kv()
	if err != nil {
		return nil, err
	}
	defer kv.mu.Unlock()
	now := time.Now()
	out := make([]driver.BatchResult, len(items))
	for i, it := range items {
		if kv.at(it.Key, it.Rev, now) == nil {
			out[i].Err = driver.ErrRevision
			continue
		}
		out[i].Rev = kv.put(it.Key, it.Value, it.TTL, now)
	}
	return out, nil
}

var _ driver.StoreBatchValueDeleter = (*Backend)(nil)

// DeleteValueEach implements driver.StoreBatchValueDeleter: under one hold
// of the store's lock.
func (b *Backend) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	kv, err := b.kv()
	if err != nil {
		return nil, err
	}
	defer kv.mu.Unlock()
	now := time.Now()
	out := make([]driver.BatchResult, len(items))
	for i, it := range items {
		e := kv.entries[it.Key]
		if it.Rev != "" {
			e = kv.at(it.Key, it.Rev, now)
		} else if !e.live(now) {
			e = nil
		}
		if e == nil || !bytes.Equal(e.value, it.Value) {
			out[i].Err = driver.ErrRevision
			continue
		}
		kv.remove(it.Key)
	}
	return out, nil
}

// ListEach implements driver.StoreBatcher: one List a prefix.
func (b *Backend) ListEach(ctx context.Context, prefixes []string, limit int) ([][]string, error) {
	out := make([][]string, len(prefixes))
	for i, p := range prefixes {
		keys, err := b.List(ctx, p, "", limit)
		if err != nil {
			return nil, err
		}
		out[i] = keys
	}
	return out, nil
}
