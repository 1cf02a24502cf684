package rabbit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// RabbitMQ has no key-value state of its own. The platform's shared state
// lives in a companion store given in Config.Store, which Backend.Store
// returns (driver.StoreProvider) with its keys under Config.Prefix+"/".

var _ driver.StoreProvider = (*Backend)(nil)

// Store returns the companion store of Config.Store, its keys kept under
// Config.Prefix. Without one it returns an error matching driver.ErrNoStore
// that names the choices: a feature that needs shared state fails with it
// when it starts.
func (b *Backend) Store() (driver.Store, error) {
	if b.cfg.Store == nil {
		return nil, fmt.Errorf("%w: RabbitMQ keeps no shared state; set rabbit.Config.Store to a companion store: "+
			"pgstore.New for PostgreSQL, or a Redis or NATS backend (redis.New, nats.New), or any driver.Store", driver.ErrNoStore)
	}
	return scopedStore{d: b.cfg.Store, scope: b.cfg.Prefix + "/"}, nil
}

// scopedStore puts a scope before every key of the store it wraps.
type scopedStore struct {
	d     driver.Store
	scope string
}

func (s scopedStore) Get(ctx context.Context, key string) ([]byte, string, error) {
	return s.d.Get(ctx, s.scope+key)
}

func (s scopedStore) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	return s.d.Create(ctx, s.scope+key, value, ttl)
}

func (s scopedStore) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	return s.d.Update(ctx, s.scope+key, value, rev, ttl)
}

func (s scopedStore) Delete(ctx context.Context, key, rev string) error {
	return s.d.Delete(ctx, s.scope+key, rev)
}

func (s scopedStore) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if after != "" {
		after = s.scope + after
	}
	keys, err := s.d.List(ctx, s.scope+prefix, after, limit)
	if err != nil {
		return nil, err
	}
	if err := s.unscoped(keys); err != nil {
		return nil, err
	}
	return keys, nil
}

// The optional interfaces of the driver are forwarded, keys scoped, to the
// companion store: through the driver's helpers, so a companion without one
// gets the helper's fallback (one call a key) and one with it its single
// round trip (pgstore: one statement, one commit).
var (
	_ driver.StoreBatcher           = scopedStore{}
	_ driver.StoreCounter           = scopedStore{}
	_ driver.StoreBatchUpdater      = scopedStore{}
	_ driver.StoreValueDeleter      = scopedStore{}
	_ driver.StoreBatchValueDeleter = scopedStore{}
)

// scoped returns keys with the scope before each.
func (s scopedStore) scoped(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = s.scope + k
	}
	return out
}

// scopedItems returns a copy of items with the scope before each key.
func (s scopedStore) scopedItems(items []driver.BatchItem) []driver.BatchItem {
	out := make([]driver.BatchItem, len(items))
	for i, it := range items {
		it.Key = s.scope + it.Key
		out[i] = it
	}
	return out
}

// unscoped strips the scope from keys the companion listed, in place.
func (s scopedStore) unscoped(keys []string) error {
	for i, k := range keys {
		u, ok := strings.CutPrefix(k, s.scope)
		if !ok {
			return fmt.Errorf("rabbit: the companion store listed %q, outside %q", k, s.scope)
		}
		keys[i] = u
	}
	return nil
}

func (s scopedStore) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	return driver.GetEach(ctx, s.d, s.scoped(keys))
}

func (s scopedStore) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	return driver.CreateEach(ctx, s.d, s.scopedItems(items))
}

func (s scopedStore) DeleteEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	return driver.DeleteEach(ctx, s.d, s.scopedItems(items))
}

func (s scopedStore) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	return driver.UpdateEach(ctx, s.d, s.scopedItems(items))
}

func (s scopedStore) DeleteValue(ctx context.Context, key, rev string, value []byte) error {
	return driver.DeleteValue(ctx, s.d, s.scope+key, rev, value)
}

func (s scopedStore) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	return driver.DeleteValueEach(ctx, s.d, s.scopedItems(items))
}

func (s scopedStore) ListEach(ctx context.Context, prefixes []string, limit int) ([][]string, error) {
	lists, err := driver.ListEach(ctx, s.d, s.scoped(prefixes), limit)
	if err != nil {
		return nil, err
	}
	for _, keys := range lists {
		if err := s.unscoped(keys); err != nil {
			return nil, err
		}
	}
	return lists, nil
}

func (s scopedStore) Count(ctx context.Context, prefix string) (int64, error) {
	return driver.CountKeys(ctx, s.d, s.scope+prefix)
}
