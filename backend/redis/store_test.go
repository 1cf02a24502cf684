package redis

import (
	"context"
	"os/exec"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
)

// storeOn opens each store on a client of its own, as a separate process
// would.
func storeOn(addr string) storetest.Maker {
	return func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		b, err := New(ctx, Config{Client: c, Prefix: "apt-store"})
		if err != nil {
			c.Close()
			return nil, err
		}
		tb.Cleanup(func() { b.Close(); c.Close() })
		return b, nil
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storeOn(realRedis(t)), storetest.Options{Restart: restartableRedis})
}

// restartableRedis runs a redis-server of the test's own with an
// append-only file synced on every write, for Durability/Restart: Redis
// keeps the store exactly as durably as its queues.
func restartableRedis(t *testing.T) (storetest.Maker, func(*testing.T)) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("no redis-server binary for a server of the test's own: %v", err)
	}
	br := privateRedis(t)
	return storeOn(br.Addr), func(t *testing.T) {
		if err := br.Restart(true); err != nil {
			t.Fatalf("restarting redis-server: %v", err)
		}
	}
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, storeOn(realRedis(b)))
}
