//go:build !unix

package pgtest

import (
	"errors"
	"testing"

	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// Server is a PostgreSQL server of a test's own; on this system there is
// none.
type Server struct {
	// URL connects to the database postgres as the superuser postgres.
	URL string
}

// Start skips the test (fails it when ASYNCPLATFORM_REQUIRE_SERVERS is
// set): a server of the test's own runs on Unix only.
func Start(t testing.TB) *Server {
	t.Helper()
	testenv.Unreachable(t, "a PostgreSQL of the test's own", errors.New("pgtest runs servers on Unix only"))
	return &Server{}
}

// Restart fails: there is no server.
func (s *Server) Restart(kill bool) error { return errors.New("pgtest: no server on this system") }
