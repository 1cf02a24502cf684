package postgres

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// pgbouncerEnv passes the test's PgBouncer URL to the child processes the
// suite starts.
const pgbouncerEnv = "ASYNCPLATFORM_POSTGRES_TEST_PGBOUNCER"

// pgbouncerURL returns the URL of a PgBouncer in transaction pool mode in
// front of the machine's PostgreSQL: the parent's, from the environment,
// in a child process; else one started by scripts/pgbouncer.sh on a free
// port and stopped when t ends. It skips (fails, with
// ASYNCPLATFORM_REQUIRE_SERVERS) when pgbouncer is not installed.
func pgbouncerURL(t *testing.T) string {
	if u := os.Getenv(pgbouncerEnv); u != "" {
		return u
	}
	if _, err := exec.LookPath("pgbouncer"); err != nil {
		if _, err := os.Stat("/usr/sbin/pgbouncer"); err != nil {
			testenv.Tool(t, "pgbouncer")
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	script, err := filepath.Abs("../../scripts/pgbouncer.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pgbouncer")
	if err != nil {
		t.Fatal(err)
	}
	// PgBouncer drops root for the postgres user, which must read the
	// files it writes there.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(script, args...)
		cmd.Env = append(os.Environ(), "PGBOUNCER_DIR="+dir)
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return strings.TrimSpace(string(out)), err
	}
	u, err := run("start", port)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("starting pgbouncer: %v", err)
	}
	os.Setenv(pgbouncerEnv, u)
	t.Cleanup(func() {
		os.Unsetenv(pgbouncerEnv)
		if _, err := run("stop", port); err != nil {
			t.Logf("stopping pgbouncer: %v", err)
		}
		os.RemoveAll(dir)
	})
	return u
}

// TestPgBouncer runs the conformance suite through a PgBouncer in
// transaction pool mode: enqueue, claims, leases, dead letters and the
// store on the pool, pgx in simple_protocol mode (PgBouncer keeps no
// prepared statement between transactions), and LISTEN on a session of
// its own straight to the server (Config.ListenURL).
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	reachable(t)
	url := pgbouncerURL(t) + "&default_query_exec_mode=simple_protocol"
	cfg := Config{URL: url, ListenURL: testURL(), Prefix: testPrefix(t, "pgb"), DeadHold: time.Second, MaxConns: testConns}
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return harness{cfg}, nil
	}, conformance.Options{Lease: time.Second})
}
