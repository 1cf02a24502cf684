package postgres

import (
	"context"
	"crypto/rand"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/conformance/faults"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
	"github.com/asyncplatform/asyncplatform/pgstore/pgtest"
)

// prefixEnv passes a test's table prefix to the child processes the
// suites start, which must find the parent's tables.
const prefixEnv = "ASYNCPLATFORM_POSTGRES_TEST_PREFIX_"

// testURL is the machine's PostgreSQL, trust auth, database test.
func testURL() string {
	return testenv.Getenv(URLEnv, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// testPrefix returns the table prefix of the test named role in this run:
// the parent's, from the environment, in a child process; else a new one,
// whose tables are dropped when t ends.
func testPrefix(t testing.TB, role string) string {
	env := prefixEnv + strings.ToUpper(role)
	if p := os.Getenv(env); p != "" {
		return p
	}
	p := "apt_" + role + "_" + strings.ToLower(rand.Text()[:10])
	os.Setenv(env, p)
	t.Cleanup(func() {
		os.Unsetenv(env)
		dropTables(t, testURL(), p)
	})
	return p
}

// dropTables removes every table and sequence of prefix.
func dropTables(t testing.TB, dsn, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Logf("dropping the tables of %s: %v", prefix, err)
		return
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, `DROP TABLE IF EXISTS `+prefix+`_jobs, `+prefix+`_dead, `+prefix+`_queues, `+prefix+`_migrations, `+prefix+`_store, `+prefix+`_outbox, `+prefix+`_outbox_aside;
		DROP SEQUENCE IF EXISTS `+prefix+`_token, `+prefix+`_store_rev`)
	if err != nil {
		t.Logf("dropping the tables of %s: %v", prefix, err)
	}
}

// reachable skips the test (fails it, with ASYNCPLATFORM_REQUIRE_SERVERS)
// when PostgreSQL does not answer.
func reachable(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, testURL())
	if err != nil {
		testenv.Unreachable(tb, "PostgreSQL at "+testURL(), err)
		return
	}
	c.Close(ctx)
}

// testConns bounds each test backend's pool: the suites open dozens of
// backends at once, and the machine's PostgreSQL (max_connections 100) is
// shared with other test runs.
const testConns = 6

// harness opens each backend on a pool of its own, as a separate worker
// process would.
type harness struct{ cfg Config }

func (h harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	return New(ctx, h.cfg)
}

func (h harness) Close() {}

// The suite's lease is a second: the machine's two cores are shared with
// other brokers' suites, and a shorter lease, renewed every third of it,
// can lapse under that load.

func TestConformance(t *testing.T) {
	t.Parallel()
	reachable(t)
	cfg := Config{URL: testURL(), Prefix: testPrefix(t, "conf"), DeadHold: time.Second, MaxConns: testConns} // IdleWait at its default (1s): wake-ups, not the safety net, must meet Delivery/WakesOnEnqueue
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return harness{cfg}, nil
	}, conformance.Options{Lease: time.Second})
}

// withPrefix returns dsn with the prefix parameter set.
func withPrefix(dsn, prefix string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("prefix", prefix)
	u.RawQuery = q.Encode()
	return u.String()
}

// openAddr opens a backend on a URL as asyncplatform.Open would.
func openAddr(ctx context.Context, addr string) (*Backend, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return nil, err
	}
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	cfg.DeadHold, cfg.IdleWait, cfg.Logger = 2*time.Second, 200*time.Millisecond, faults.Logger()
	if !strings.Contains(addr, "pool_max_conns") {
		cfg.MaxConns = 2 * testConns
	}
	return New(ctx, cfg)
}

// TestFaults runs the fault suite (conformance/faults) on the machine's
// PostgreSQL, and BrokerRestart and BrokerKill on a PostgreSQL of its own
// (pgtest).
func TestFaults(t *testing.T) {
	t.Parallel()
	reachable(t)
	prefix := testPrefix(t, "faults")
	faults.Run(t, faults.Target{
		Name:  "postgres",
		Lease: 500 * time.Millisecond,
		Addr:  withPrefix(testURL(), prefix),
		Open: func(ctx context.Context, addr string) (driver.Backend, error) {
			return openAddr(ctx, addr)
		},
		HostPort: func(addr string) string {
			u, err := url.Parse(addr)
			if err != nil {
				panic(err)
			}
			return u.Host
		},
		Via: func(addr, hostport string) string {
			u, err := url.Parse(addr)
			if err != nil {
				panic(err)
			}
			u.Host = hostport
			return u.String()
		},
		Private: faults.SharedPrivate(t, func(t, owner *testing.T) *faults.Broker {
			srv := pgtest.Start(owner)
			return &faults.Broker{Addr: withPrefix(srv.URL, prefix), Restart: srv.Restart}
		}),
		Garbage: func(ctx context.Context, addr, queue string, raw []byte) error {
			b, err := openAddr(ctx, addr)
			if err != nil {
				return err
			}
			defer b.Close()
			// A foreign producer's row, in the layout of migrations/0001.
			_, err = b.pool.Exec(ctx, `INSERT INTO `+b.cfg.Prefix+`_jobs (queue, body, run_at) VALUES ($1, $2, now())`, queue, raw)
			return err
		},
	})
}
