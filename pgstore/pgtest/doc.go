// Package pgtest runs a PostgreSQL server of a test's own: a cluster made
// by initdb in a temporary directory, served on a free loopback port (its
// unix socket in that directory too), trust authentication, removed when
// the test ends. A test that restarts or kills its server, such as the
// store suite's Durability/Restart, uses one of these and never the
// machine's shared PostgreSQL.
//
//	srv := pgtest.Start(t)
//	st, err := pgstore.New(ctx, pgstore.Config{URL: srv.URL})
//	err = srv.Restart(true) // SIGKILL every server process, start again
//
// PostgreSQL refuses to run as root. Run as root, as the tests are on CI
// machines, the server runs as the unprivileged user ASYNCPLATFORM_PG_USER
// names (default "postgres", the Debian package's), and its directory is
// given to that user. The programs initdb and postgres are looked up in
// ASYNCPLATFORM_PG_BIN, then on PATH, then in the newest
// /usr/lib/postgresql/*/bin; without them the test is skipped (a failure
// when ASYNCPLATFORM_REQUIRE_SERVERS is set).
package pgtest

import "time"

// Environment variables that tune where the server comes from.
const (
	// BinEnv names a directory holding initdb and postgres.
	BinEnv = "ASYNCPLATFORM_PG_BIN"
	// UserEnv names the user the server runs as when the test runs as
	// root.
	UserEnv = "ASYNCPLATFORM_PG_USER"
)

// Boot bounds how long initdb, a start or a stop may take.
const Boot = 2 * time.Minute
