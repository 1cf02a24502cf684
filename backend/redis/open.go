package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

func init() {
	driver.Register("redis", openURL)
	driver.Register("rediss", openURL)
}

// openURL opens a Backend for asyncplatform.Open from a redis:// or
// rediss:// URL (see the package documentation, URLs). The client it makes
// is closed with the Backend.
func openURL(ctx context.Context, u *url.URL) (driver.Backend, error) {
	q := u.Query()
	prefix := q.Get("prefix")
	q.Del("prefix")
	ru := *u
	ru.RawQuery = q.Encode()
	opts, err := goredis.ParseURL(ru.String())
	if err != nil {
		// go-redis's errors may quote the URL: name it redacted instead.
		return nil, fmt.Errorf("redis: %s is not a Redis URL", u.Redacted())
	}
	rdb := goredis.NewClient(opts)
	b, err := New(ctx, Config{Client: rdb, Prefix: prefix})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &urlBackend{Backend: b, rdb: rdb}, nil
}

// urlBackend is a Backend that owns its client.
type urlBackend struct {
	*Backend
	rdb  *goredis.Client
	once sync.Once
	err  error
}

// Close closes the Backend, then its client. It is idempotent.
func (b *urlBackend) Close() error {
	b.once.Do(func() { b.err = errors.Join(b.Backend.Close(), b.rdb.Close()) })
	return b.err
}
