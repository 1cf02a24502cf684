package main

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/sqlite"
)

// TestRelayWarnsWithoutVerbose: a row the relay moves aside is reported on
// stderr without -v; a relay that drops its warnings reads as an empty
// outbox to the operator.
func TestRelayWarnsWithoutVerbose(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "outbox.db")
	b, err := sqlite.New(ctx, sqlite.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	// A row no target accepts: a queue name the platform refuses.
	if _, err := db.Exec(`INSERT INTO asyncplatform_outbox (queue, id, dedupe, body) VALUES ('no such queue!', 'job-1', '', x'00')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var out, errOut strings.Builder
	run(rctx, []string{"relay", "--from", "sqlite://" + path, "--to", memURL(t)}, strings.NewReader(""), &out, &errOut)
	if !strings.Contains(errOut.String(), "moved aside") {
		t.Fatalf("stderr does not report the row moved aside:\n%s\nstdout:\n%s", errOut.String(), out.String())
	}
	if !strings.Contains(out.String(), "1 moved aside") {
		t.Errorf("stdout = %q; want the count of rows moved aside", out.String())
	}
}
