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
	for i, k := range keys {
		u, ok := strings.CutPrefix(k, s.scope)
		if !ok {
			return nil, fmt.Errorf("rabbit: the companion store listed %q, outside %q", k, s.scope)
		}
		keys[i] = u
	}
	return keys, nil
}
