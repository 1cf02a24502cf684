package memory

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The store (driver.Store) of a Broker: a map of entries under a lock of its
// own, shared by the Broker's connections, and the keys in byte order for
// List, brought up to date by the first List after a write (so a write
// costs O(1), and a List after writes at most O(n log n); after removals
// only, O(n)). Revisions come from one counter
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
	keys    []string // sorted, distinct; may hold keys since removed from entries
	fresh   []string // keys put since keys was sorted that it may lack, unsorted, maybe twice
	stale   bool     // keys is to be sorted again from entries (fresh grew past half of it)
	removed int      // keys removed from entries since keys was sorted
	rev     uint64   // last revision given
	writes  int      // since the last sweep
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
	}
	return kv, nil
}

// remove drops key. The lock is held.
func (kv *kvState) remove(key string) {
	if _, ok := kv.entries[key]; ok {
		delete(kv.entries, key)
		kv.removed++
	}
}

// sorted returns every key in byte order, once each, and maybe some since
// removed. The keys put since the last call are sorted alone and merged
// in, so a listing while keys are created costs their number and one pass,
// not a sort of every key; the whole is sorted again from entries only
// once the keys put since outnumber half the sorted ones. The keys removed
// are dropped in one pass, keeping the order, once they outnumber half the
// sorted ones: a listing while keys are removed costs no sort. The lock is
// held.
func (kv *kvState) sorted() []string {
	if kv.stale {
		kv.keys = kv.keys[:0]
		for k := range kv.entries {
			kv.keys = append(kv.keys, k)
		}
		slices.Sort(kv.keys)
		kv.fresh, kv.stale, kv.removed = kv.fresh[:0], false, 0
		return kv.keys
	}
	if kv.removed > len(kv.keys)/2 {
		kv.keys = slices.DeleteFunc(kv.keys, func(k string) bool {
			_, ok := kv.entries[k]
			return !ok
		})
		kv.removed = 0
	}
	if len(kv.fresh) > 0 {
		slices.Sort(kv.fresh)
		kv.keys = mergeSorted(kv.keys, kv.fresh)
		kv.fresh = kv.fresh[:0]
	}
	return kv.keys
}

// mergeSorted returns the sorted keys of a and b (each sorted), each once.
func mergeSorted(a, b []string) []string {
	out := make([]string, 0, len(a)+len(b))
	add := func(k string) {
		if len(out) == 0 || out[len(out)-1] != k {
			out = append(out, k)
		}
	}
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if a[i] <= b[j] {
			add(a[i])
			i++
		} else {
			add(b[j])
			j++
		}
	}
	for ; i < len(a); i++ {
		add(a[i])
	}
	for ; j < len(b); j++ {
		add(b[j])
	}
	return out
}

// put writes key and returns its new revision. The lock is held.
func (kv *kvState) put(key string, value []byte, ttl time.Duration, now time.Time) string {
	e := kv.entries[key]
	if e == nil {
		e = &kvEntry{}
		kv.entries[key] = e
		if !kv.stale {
			if kv.fresh = append(kv.fresh, key); len(kv.fresh) > len(kv.keys)/2 {
				kv.fresh, kv.stale = kv.fresh[:0], true
			}
		}
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
	keys := kv.sorted()
	i, _ := slices.BinarySearch(keys, from)
	var out []string
	for ; i < len(keys) && len(out) < limit; i++ {
		k := keys[i]
		if !strings.HasPrefix(k, prefix) {
			break
		}
		e, ok := kv.entries[k]
		switch {
		case k == after || !ok:
		case !e.live(now):
			kv.remove(k)
		default:
			out = append(out, k)
		}
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
