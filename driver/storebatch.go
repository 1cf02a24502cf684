package driver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// StoreBatcher is an optional interface of a Store: Get, Create and Delete
// of many keys, and List of many prefixes, in one round trip, and one
// commit where the store has commits (PostgreSQL). Callers reach it
// through GetEach, CreateEach, DeleteEach and ListEach, which fall back to
// one call per key on a Store without it.
//
// Each item behaves as its single call would, on its own: the batch is not
// a transaction across items (a reader may see some of its writes before
// the others), and each item's result is the one its single call would
// have given at some moment during the batch. Keys (prefixes) of one batch
// are distinct and at most MaxBatch; the helpers check both, so a
// StoreBatcher may assume them.
//
// A batch that returns an error (the broker's, wrapped with %w; ErrClosed)
// may have applied any subset of its items; its results are then nil.
type StoreBatcher interface {
	// GetEach is Get of each key: Value and Rev, or Err ErrKeyNotFound.
	GetEach(ctx context.Context, keys []string) ([]BatchResult, error)

	// CreateEach is Create of each item's Key, Value and TTL: Rev, or Err
	// ErrKeyExists.
	CreateEach(ctx context.Context, items []BatchItem) ([]BatchResult, error)

	// DeleteEach is Delete of each item's Key at its Rev (empty: whatever
	// is there): Err nil, or ErrRevision for an item with a Rev.
	DeleteEach(ctx context.Context, items []BatchItem) ([]BatchResult, error)

	// ListEach is List of each prefix from its first key, up to limit
	// keys each: keys[i] are those of prefixes[i], in byte order.
	ListEach(ctx context.Context, prefixes []string, limit int) (keys [][]string, err error)
}

// StoreCounter is an optional interface of a Store: Count returns how many
// present keys start with prefix (empty: every key), as a List of them all
// would, without sending them. Callers reach it through CountKeys, which
// falls back to listing the keys on a Store without it.
type StoreCounter interface {
	Count(ctx context.Context, prefix string) (int64, error)
}

// StoreBatchUpdater is an optional interface of a Store: Update of many
// keys in one round trip (one commit where the store has commits). Callers
// reach it through UpdateEach, which falls back to one Update a key on a
// Store without it. Each item behaves as its single Update would, on its
// own, as the items of a StoreBatcher's calls do; keys are distinct, at
// most MaxBatch, and every Rev is non-empty (the helper checks all three).
// A batch that returns an error may have applied any subset of its items.
type StoreBatchUpdater interface {
	// UpdateEach is Update of each item's Key to its Value and TTL when the
	// key is at its Rev: the new Rev, or Err ErrRevision.
	UpdateEach(ctx context.Context, items []BatchItem) ([]BatchResult, error)
}

// BatchItem is one key of a batch call.
type BatchItem struct {
	Key   string
	Value []byte        // CreateEach, UpdateEach; DeleteValueEach: the value to find
	TTL   time.Duration // CreateEach, UpdateEach: zero, none
	Rev   string        // DeleteEach, DeleteValueEach: empty, whatever is there; UpdateEach: required
}

// BatchResult is the result of one item of a batch call, in the order of
// the call's items.
type BatchResult struct {
	Value []byte // GetEach: the caller's to keep
	Rev   string // GetEach, CreateEach, UpdateEach
	Err   error  // nil, or the item's sentinel: ErrKeyNotFound, ErrKeyExists, ErrRevision
}

// MaxBatch is the most items of one batch call.
const MaxBatch = 1000

// eachWorkers bounds the single calls the helpers' fallback makes at once.
const eachWorkers = 32

// GetEach gets each key through s's StoreBatcher, or with one Get a key
// (eachWorkers at once) on a Store without it. A result's Err is nil or
// ErrKeyNotFound; any other error of a key fails the call.
func GetEach(ctx context.Context, s Store, keys []string) ([]BatchResult, error) {
	if err := checkBatch(len(keys), func(i int) string { return keys[i] }); err != nil {
		return nil, err
	}
	if b, ok := s.(StoreBatcher); ok {
		rs, err := b.GetEach(ctx, keys)
		return checkResults(rs, err, len(keys), ErrKeyNotFound)
	}
	return each(ctx, len(keys), ErrKeyNotFound, func(ctx context.Context, i int) (BatchResult, error) {
		v, rev, err := s.Get(ctx, keys[i])
		return BatchResult{Value: v, Rev: rev}, err
	})
}

// CreateEach creates each item through s's StoreBatcher, or with one Create
// an item (eachWorkers at once) on a Store without it. A result's Err is
// nil or ErrKeyExists; any other error of an item fails the call.
func CreateEach(ctx context.Context, s Store, items []BatchItem) ([]BatchResult, error) {
	if err := checkBatch(len(items), func(i int) string { return items[i].Key }); err != nil {
		return nil, err
	}
	if b, ok := s.(StoreBatcher); ok {
		rs, err := b.CreateEach(ctx, items)
		return checkResults(rs, err, len(items), ErrKeyExists)
	}
	return each(ctx, len(items), ErrKeyExists, func(ctx context.Context, i int) (BatchResult, error) {
		rev, err := s.Create(ctx, items[i].Key, items[i].Value, items[i].TTL)
		return BatchResult{Rev: rev}, err
	})
}

// DeleteEach deletes each item through s's StoreBatcher, or with one Delete
// an item (eachWorkers at once) on a Store without it. A result's Err is
// nil or ErrRevision; any other error of an item fails the call.
func DeleteEach(ctx context.Context, s Store, items []BatchItem) ([]BatchResult, error) {
	if err := checkBatch(len(items), func(i int) string { return items[i].Key }); err != nil {
		return nil, err
	}
	if b, ok := s.(StoreBatcher); ok {
		rs, err := b.DeleteEach(ctx, items)
		return checkResults(rs, err, len(items), ErrRevision)
	}
	return each(ctx, len(items), ErrRevision, func(ctx context.Context, i int) (BatchResult, error) {
		return BatchResult{}, s.Delete(ctx, items[i].Key, items[i].Rev)
	})
}

// UpdateEach updates each item at its Rev through s's StoreBatchUpdater, or
// with one Update an item (eachWorkers at once) on a Store without it. A
// result's Err is nil or ErrRevision; any other error of an item fails the
// call. An item without a Rev is refused before the store is called.
func UpdateEach(ctx context.Context, s Store, items []BatchItem) ([]BatchResult, error) {
	if err := checkBatch(len(items), func(i int) string { return items[i].Key }); err != nil {
		return nil, err
	}
	for i, it := range items {
		if it.Rev == "" {
			return nil, fmt.Errorf("store batch update item %d (%q): no revision", i, it.Key)
		}
	}
	if b, ok := s.(StoreBatchUpdater); ok {
		rs, err := b.UpdateEach(ctx, items)
		return checkResults(rs, err, len(items), ErrRevision)
	}
	return each(ctx, len(items), ErrRevision, func(ctx context.Context, i int) (BatchResult, error) {
		rev, err := s.Update(ctx, items[i].Key, items[i].Value, items[i].Rev, items[i].TTL)
		return BatchResult{Rev: rev}, err
	})
}

// ListEach lists up to limit keys under each prefix, from the first,
// through s's StoreBatcher, or with one List a prefix (eachWorkers at
// once) on a Store without it.
func ListEach(ctx context.Context, s Store, prefixes []string, limit int) ([][]string, error) {
	if err := checkBatch(len(prefixes), func(i int) string { return prefixes[i] }); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("store batch list limit %d: want at least 1", limit)
	}
	if b, ok := s.(StoreBatcher); ok {
		keys, err := b.ListEach(ctx, prefixes, limit)
		if err == nil && len(keys) != len(prefixes) {
			err = fmt.Errorf("store batch of %d prefixes answered %d lists", len(prefixes), len(keys))
		}
		if err != nil {
			return nil, err
		}
		return keys, nil
	}
	out := make([][]string, len(prefixes))
	_, err := each(ctx, len(prefixes), errNever, func(ctx context.Context, i int) (BatchResult, error) {
		keys, err := s.List(ctx, prefixes[i], "", limit)
		out[i] = keys
		return BatchResult{}, err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// errNever is the sentinel of a call that has none.
var errNever = errors.New("never returned")

// CountKeys counts the present keys under prefix through s's StoreCounter,
// or by listing them, MaxBatch*10 a call, on a Store without it.
func CountKeys(ctx context.Context, s Store, prefix string) (int64, error) {
	if c, ok := s.(StoreCounter); ok {
		return c.Count(ctx, prefix)
	}
	const page = 10 * MaxBatch
	var n int64
	for after := ""; ; {
		keys, err := s.List(ctx, prefix, after, page)
		if err != nil {
			return n, err
		}
		n += int64(len(keys))
		if len(keys) < page {
			return n, nil
		}
		after = keys[len(keys)-1]
	}
}

// checkBatch refuses a batch over MaxBatch items or with a key twice.
func checkBatch(n int, key func(int) string) error {
	if n > MaxBatch {
		return fmt.Errorf("store batch of %d items, the limit is %d", n, MaxBatch)
	}
	seen := make(map[string]bool, n)
	for i := range n {
		if seen[key(i)] {
			return fmt.Errorf("store batch has the key %q twice", key(i))
		}
		seen[key(i)] = true
	}
	return nil
}

// checkResults holds a StoreBatcher's answer to the contract: one result
// an item, each Err nil or the call's sentinel.
func checkResults(rs []BatchResult, err error, n int, sentinel error) ([]BatchResult, error) {
	if err != nil {
		return nil, err
	}
	if len(rs) != n {
		return nil, fmt.Errorf("store batch of %d items answered %d results", n, len(rs))
	}
	for i, r := range rs {
		if r.Err != nil && !errors.Is(r.Err, sentinel) {
			return nil, fmt.Errorf("store batch item %d: %w", i, r.Err)
		}
	}
	return rs, nil
}

// each runs one call an item, eachWorkers at once, and stops at the first
// error other than sentinel.
func each(ctx context.Context, n int, sentinel error, call func(context.Context, int) (BatchResult, error)) ([]BatchResult, error) {
	out := make([]BatchResult, n)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, eachWorkers)
	var wg sync.WaitGroup
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			r, err := call(ctx, i)
			switch {
			case err == nil:
			case errors.Is(err, sentinel):
				r = BatchResult{Err: sentinel}
			default:
				cancel(err)
			}
			out[i] = r
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// StoreValueDeleter is an optional interface of a Store: DeleteValue
// removes key only when it is present at revision rev (any revision, when
// rev is empty) and holds exactly value, in one round trip; ErrRevision
// otherwise (nothing removed).
// Callers reach it through DeleteValue, which falls back to a Get and a
// Delete at the revision on a Store without it.
type StoreValueDeleter interface {
	DeleteValue(ctx context.Context, key, rev string, value []byte) error
}

// DeleteValue removes key when it is at revision rev (any, when rev is
// empty) and holds exactly value, through s's StoreValueDeleter, or with a
// Get and a Delete at the revision read on a Store without it: nil when
// removed, ErrRevision when the key is absent, at another revision or
// holds another value.
func DeleteValue(ctx context.Context, s Store, key, rev string, value []byte) error {
	if d, ok := s.(StoreValueDeleter); ok {
		return d.DeleteValue(ctx, key, rev, value)
	}
	v, cur, err := s.Get(ctx, key)
	switch {
	case errors.Is(err, ErrKeyNotFound):
		return ErrRevision
	case err != nil:
		return err
	case (rev != "" && cur != rev) || !bytes.Equal(v, value):
		return ErrRevision
	}
	return s.Delete(ctx, key, cur)
}

// StoreBatchValueDeleter is an optional interface of a Store: DeleteValue
// of many keys in one round trip (one commit where the store has
// commits). Callers reach it through DeleteValueEach, which falls back to
// one DeleteValue a key on a Store without it. Each item behaves as its
// single DeleteValue would, on its own, as the items of a StoreBatcher's
// calls do; keys are distinct and at most MaxBatch (the helper checks
// both). A batch that returns an error may have applied any subset of its
// items.
type StoreBatchValueDeleter interface {
	// DeleteValueEach is DeleteValue of each item's Key at its Rev (empty:
	// any revision) when the key holds exactly its Value: Err nil when
	// removed, ErrRevision otherwise (absent, at another revision, another
	// value; nothing removed).
	DeleteValueEach(ctx context.Context, items []BatchItem) ([]BatchResult, error)
}

// DeleteValueEach removes each item's key when it is at the item's Rev
// (any, when empty) and holds exactly its Value, through s's
// StoreBatchValueDeleter, or with one DeleteValue an item (eachWorkers at
// once) on a Store without it. A result's Err is nil or ErrRevision; any
// other error of an item fails the call.
func DeleteValueEach(ctx context.Context, s Store, items []BatchItem) ([]BatchResult, error) {
	if err := checkBatch(len(items), func(i int) string { return items[i].Key }); err != nil {
		return nil, err
	}
	if b, ok := s.(StoreBatchValueDeleter); ok {
		rs, err := b.DeleteValueEach(ctx, items)
		return checkResults(rs, err, len(items), ErrRevision)
	}
	return each(ctx, len(items), ErrRevision, func(ctx context.Context, i int) (BatchResult, error) {
		return BatchResult{}, DeleteValue(ctx, s, items[i].Key, items[i].Rev, items[i].Value)
	})
}
