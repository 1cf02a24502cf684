package redis

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// redisAddr is the shared Redis the tests use.
func redisAddr() string { return testenv.Getenv("ASYNCPLATFORM_REDIS_ADDR", "127.0.0.1:6379") }

// realRedis returns the address of the machine's Redis, or ends the test.
func realRedis(t testing.TB) string {
	t.Helper()
	addr := redisAddr()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Unreachable(t, "Redis at "+addr, err)
	}
	return addr
}

// harness opens each backend on a client of its own, as a separate worker
// process would, and closes the client when the backend closes.
type harness struct {
	addr   string
	prefix string
	mu     sync.Mutex
	opened []*goredis.Client
}

// clientClosing closes its client after the Backend.
type clientClosing struct {
	*Backend
	c *goredis.Client
}

func (b clientClosing) Close() error {
	err := b.Backend.Close()
	b.c.Close()
	return err
}

func (h *harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	c := goredis.NewClient(&goredis.Options{Addr: h.addr})
	b, err := New(Config{Client: c, Prefix: h.prefix, DeadHold: time.Second, IdleWait: 500 * time.Millisecond})
	if err != nil {
		c.Close()
		return nil, err
	}
	h.mu.Lock()
	h.opened = append(h.opened, c)
	h.mu.Unlock()
	return clientClosing{b, c}, nil
}

func (h *harness) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.opened {
		c.Close()
	}
	h.opened = nil
}

// miniredisEnv passes the parent's miniredis address to a child process.
const miniredisEnv = "ASYNCPLATFORM_REDIS_TEST_MINIREDIS"

// The suite's lease is a second on Redis and two on miniredis: the machine's
// two cores are shared with other brokers' suites, a 500ms lease extended
// every third of it was seen to lapse under that load, and miniredis (under
// -race) takes milliseconds per script, as it builds a Lua state per call.

func TestConformance(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		addr := realRedis(t)
		conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
			return &harness{addr: addr, prefix: "apt"}, nil
		}, conformance.Options{Lease: time.Second})
	})
	t.Run("miniredis", func(t *testing.T) {
		// miniredis answers TIME with the wall clock unless SetTime is
		// called, and this backend keeps time only through TIME (no key
		// TTLs), so its clock needs no driving.
		//
		// Each case gets a miniredis of its own (one server serialises
		// every command of every parallel case), except ProcessKill: it
		// re-runs this test in a child process, which must reach the
		// parent's miniredis, so that one is shared and its address goes
		// down in the environment.
		shared := os.Getenv(miniredisEnv)
		if shared == "" {
			shared = miniredis.RunT(t).Addr()
			os.Setenv(miniredisEnv, shared)
			t.Cleanup(func() { os.Unsetenv(miniredisEnv) })
		}
		conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
			addr := shared
			if !strings.HasSuffix(t.Name(), "/ProcessKill") {
				addr = miniredis.RunT(t).Addr()
			}
			return &harness{addr: addr, prefix: "apt"}, nil
		}, conformance.Options{Lease: 2 * time.Second})
	})
}
