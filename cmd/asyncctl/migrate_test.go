package main

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// TestMigrate: migrate brings a PostgreSQL backend's new tables from
// version 0 to the package's, then finds them up to date; on a backend
// without a schema it changes nothing.
func TestMigrate(t *testing.T) {
	t.Parallel()
	base := testenv.Getenv("ASYNCPLATFORM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, base)
	if err != nil {
		testenv.Unreachable(t, "PostgreSQL", err)
		return
	}
	defer c.Close(context.Background())
	prefix := "asyncctl_mig_" + strings.ToLower(rand.Text()[:8])
	t.Cleanup(func() {
		_, _ = c.Exec(context.Background(), `DROP TABLE IF EXISTS `+prefix+`_jobs, `+prefix+`_dead, `+prefix+`_queues, `+prefix+`_migrations; DROP SEQUENCE IF EXISTS `+prefix+`_token`)
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	url := base + sep + "prefix=" + prefix
	if out := mustCtl(t, exitOK, "", "migrate", "--url", url); !strings.Contains(out, "from version 0 to 1") {
		t.Errorf("first migrate: %s", out)
	}
	if out := mustCtl(t, exitOK, "", "migrate", "--url", url); !strings.Contains(out, "version 1: up to date") {
		t.Errorf("second migrate: %s", out)
	}
	if out := mustCtl(t, exitOK, "", "migrate", "--url", url, "--json"); strings.TrimSpace(out) != `{"schema":true,"before":1,"after":1}` {
		t.Errorf("migrate --json: %s", out)
	}
	if out := mustCtl(t, exitOK, "", "migrate", "--url", "memory://x"); !strings.Contains(out, "nothing to migrate") {
		t.Errorf("migrate on memory: %s", out)
	}
}
