package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/pgstore/pgtest"
)

// TestRestart checks that a row committed before a restart is there after
// it, both after a fast shutdown and after a SIGKILL of every server
// process, and that an unlogged table (not crash-safe) is emptied by the
// kill: the kill is a real crash, recovered from the write-ahead log.
func TestRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	count := func(table string) int {
		t.Helper()
		conn, err := pgx.Connect(ctx, srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	exec("CREATE TABLE logged (n int); CREATE UNLOGGED TABLE unlogged (n int)")
	exec("INSERT INTO logged VALUES (1); INSERT INTO unlogged VALUES (1)")
	if err := srv.Restart(false); err != nil {
		t.Fatal(err)
	}
	if l, u := count("logged"), count("unlogged"); l != 1 || u != 1 {
		t.Fatalf("after a fast shutdown: %d logged and %d unlogged rows, want 1 and 1", l, u)
	}
	exec("INSERT INTO logged VALUES (2)")
	if err := srv.Restart(true); err != nil {
		t.Fatal(err)
	}
	if l, u := count("logged"), count("unlogged"); l != 2 || u != 0 {
		t.Fatalf("after a SIGKILL: %d logged and %d unlogged rows, want 2 and 0 (an unlogged table is emptied by crash recovery)", l, u)
	}
}
