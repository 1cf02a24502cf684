package redis

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/conformance/faults"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

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
	c goredis.UniversalClient
}

func (b clientClosing) Close() error {
	err := b.Backend.Close()
	b.c.Close()
	return err
}

func (h *harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	c := goredis.NewClient(&goredis.Options{Addr: h.addr})
	b, err := New(ctx, Config{Client: c, Prefix: h.prefix, DeadHold: time.Second, IdleWait: 500 * time.Millisecond})
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
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		addr := realRedis(t)
		conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
			return &harness{addr: addr, prefix: "apt"}, nil
		}, conformance.Options{Lease: time.Second})
	})
	t.Run("miniredis", func(t *testing.T) {
		testenv.Long(t, "the suite again on miniredis, in this process under -race; the default run has it on Redis")
		// miniredis answers TIME with the wall clock unless SetTime is
		// called, and this backend keeps time only through TIME (no key
		// TTLs), so its clock needs no driving.
		//
		// Each case gets a miniredis of its own (one server serialises
		// every command of every parallel case), except the cases that
		// re-run this test in a child process (conformance.RunsChild),
		// which must reach the
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
			if !conformance.RunsChild(t.Name()) {
				addr = miniredis.RunT(t).Addr()
			}
			return &harness{addr: addr, prefix: "apt"}, nil
		}, conformance.Options{Lease: 2 * time.Second})
	})
}

// faultsPrefix is the key prefix of the fault suite's queues.
const faultsPrefix = "faults"

// TestFaults runs the fault suite (conformance/faults) on the machine's
// Redis, and BrokerRestart and BrokerKill on a redis-server of its own.
func TestFaults(t *testing.T) {
	t.Parallel()
	addr := realRedis(t)
	faults.Run(t, faults.Target{
		Name:  "redis",
		Lease: 500 * time.Millisecond,
		Addr:  addr,
		Open: func(ctx context.Context, addr string) (driver.Backend, error) {
			c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
			b, err := New(ctx, Config{Client: c, Prefix: faultsPrefix, DeadHold: 2 * time.Second, IdleWait: 200 * time.Millisecond, Logger: faults.Logger()})
			if err != nil {
				c.Close()
				return nil, err
			}
			return clientClosing{b, c}, nil
		},
		HostPort: func(addr string) string { return addr },
		Via:      func(_, hostport string) string { return hostport },
		Private:  privateRedis,
		Garbage: func(ctx context.Context, addr, queue string, raw []byte) error {
			c := goredis.NewClient(&goredis.Options{Addr: addr})
			defer c.Close()
			// The layout of scripts.go: the body is the field <id> of the
			// jobs hash, and the id goes on the ready list.
			k := "{" + faultsPrefix + ":" + queue + "}:"
			id := "garbage-" + rand.Text()
			_, err := c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
				p.HSet(ctx, k+"jobs", id, raw)
				p.LPush(ctx, k+"ready", id)
				return nil
			})
			return err
		},
	})
}

// privateRedis runs a redis-server of the test's own with an append-only
// file synced on every write; Restart kills it with SIGKILL.
func privateRedis(t *testing.T) *faults.Broker {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skipf("no redis-server binary for a broker of the test's own: %v", err)
	}
	dir, port := t.TempDir(), faults.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	s := faults.StartServer(t, faults.ServerConfig{Bin: bin, Dir: dir, HostPort: addr,
		Args: []string{"--bind", "127.0.0.1", "--port", fmt.Sprint(port), "--dir", dir,
			"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--maxmemory-policy", "noeviction"}})
	return &faults.Broker{Addr: addr, Restart: s.Restart}
}
