package sqlite

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/conformance/faults"
	"github.com/asyncplatform/asyncplatform/driver"
)

// pathEnv passes a test's database file to the child processes the suites
// start, which must open the parent's file.
const pathEnv = "ASYNCPLATFORM_SQLITE_TEST_PATH_"

// testPath returns the database file of the test named role in this run:
// the parent's, from the environment, in a child process; else a new one
// in the test's temporary directory.
func testPath(t testing.TB, role string) string {
	env := pathEnv + strings.ToUpper(role)
	if p := os.Getenv(env); p != "" {
		return p
	}
	p := filepath.Join(t.TempDir(), role+".db")
	os.Setenv(env, p)
	t.Cleanup(func() { os.Unsetenv(env) })
	return p
}

// harness opens each backend with connections of its own, as a separate
// worker process would.
type harness struct{ cfg Config }

func (h harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	return New(ctx, h.cfg)
}

func (h harness) Close() {}

// The suite's lease is two seconds: the database engine runs inside the
// test process (under -race, instrumented with it: several times slower
// than a server of its own), on two cores shared with other suites, and
// each case's writes wait for its file's one writer. With a second, a
// renewal queued behind the writes of a whole parallel run could come
// late (Delivery/ExactlyOnceWithoutFaults saw 3 duplicates of 300, never
// when run alone).

// Each case has a database file of its own, named from the case (a child
// process the case starts finds the same file): the cases run in parallel,
// and on one file they would all queue for its one writer, as no
// application's workers do.
func TestConformance(t *testing.T) {
	t.Parallel()
	dir := filepath.Dir(testPath(t, "conf"))
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
		return harness{Config{Path: filepath.Join(dir, name+".db"), DeadHold: time.Second}}, nil
	}, conformance.Options{Lease: 2 * time.Second})
}

// openAddr opens a backend on a URL as asyncplatform.Open would, with the
// fault suite's short holds.
func openAddr(ctx context.Context, addr string) (*Backend, error) {
	u, err := parseAddr(addr)
	if err != nil {
		return nil, err
	}
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	cfg.DeadHold, cfg.IdleWait, cfg.Logger = 2*time.Second, 200*time.Millisecond, faults.Logger()
	return New(ctx, cfg)
}

// TestFaults runs the fault suite (conformance/faults) with worker
// processes on one database file. There is no broker to restart or
// connection to cut: those scenarios skip.
func TestFaults(t *testing.T) {
	t.Parallel()
	addr := "sqlite://" + testPath(t, "faults")
	faults.Run(t, faults.Target{
		Name:  "sqlite",
		Lease: 500 * time.Millisecond,
		Addr:  addr,
		Open: func(ctx context.Context, addr string) (driver.Backend, error) {
			return openAddr(ctx, addr)
		},
		Garbage: func(ctx context.Context, addr, queue string, raw []byte) error {
			b, err := openAddr(ctx, addr)
			if err != nil {
				return err
			}
			defer b.Close()
			// A foreign producer's row, in the layout of SchemaVersion 1.
			_, err = b.db.ExecContext(ctx, `INSERT INTO `+b.cfg.Prefix+`_jobs (queue, body, run_at) VALUES (?, ?, 0)`, queue, raw)
			return err
		},
	})
}

// parseAddr parses a fault-suite address.
func parseAddr(addr string) (*url.URL, error) { return url.Parse(addr) }
