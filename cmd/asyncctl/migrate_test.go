package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/backend/postgres"
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
	v := postgres.SchemaVersion()
	if out := mustCtl(t, exitOK, "", "migrate", "--url", url); !strings.Contains(out, fmt.Sprintf("from version 0 to %d", v)) {
		t.Errorf("first migrate: %s; want from version 0 to %d", out, v)
	}
	if out := mustCtl(t, exitOK, "", "migrate", "--url", url); !strings.Contains(out, fmt.Sprintf("version %d: up to date", v)) {
		t.Errorf("second migrate: %s; want version %d: up to date", out, v)
	}
	if out, want := mustCtl(t, exitOK, "", "migrate", "--url", url, "--json"), fmt.Sprintf(`{"schema":true,"before":%d,"after":%d}`, v, v); strings.TrimSpace(out) != want {
		t.Errorf("migrate --json: %s; want %s", out, want)
	}
	if out := mustCtl(t, exitOK, "", "migrate", "--url", "memory://x"); !strings.Contains(out, "nothing to migrate") {
		t.Errorf("migrate on memory: %s", out)
	}
}
