package sqlite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/childproc"
)

// killEnv tells a child process of TestWriterKilled which writer to be.
const killEnv = "ASYNCPLATFORM_SQLITE_TEST_KILLED_WRITER"

// TestWriterKilled: a writer process killed with SIGKILL in the middle of
// a write transaction, holding the file's write lock, loses what it had
// not committed and nothing else, and the other processes write to the
// file at once (the kernel releases the flock and SQLite's locks with the
// process; the next connection rolls the WAL's uncommitted frames back).
//
//   - tx: a caller's transaction (WithTx) that enqueued 50 jobs and wrote
//     a store key, before its Commit;
//   - claim: the backend's own claim transaction (under the process's
//     writer lock and the flock) after its UPDATE of every ready job,
//     before its commit.
func TestWriterKilled(t *testing.T) {
	if role := os.Getenv(killEnv); role != "" {
		killedWriter(t, role)
		return
	}
	t.Parallel()
	for _, role := range []string{"tx", "claim"} {
		t.Run(role, func(t *testing.T) {
			t.Parallel()
			testWriterKilled(t, role)
		})
	}
}

const killQueue = "killed-writer"

func testWriterKilled(t *testing.T, role string) {
	ctx := context.Background()
	b, err := New(ctx, Config{Path: testPath(t, "killed-"+role)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.Declare(ctx, killQueue); err != nil {
		t.Fatal(err)
	}
	var kept []driver.Message
	for i := range 20 {
		id := fmt.Sprintf("kept-%d", i)
		kept = append(kept, driver.Message{ID: id, Body: []byte(id)})
	}
	if err := b.Enqueue(ctx, killQueue, kept); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Create(ctx, "kept/key", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}

	child, err := childproc.Start(childproc.Config{Test: t.Name(), Env: killEnv, Value: role, DieWithParent: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(child.Kill)
	if _, err := child.Expect("holding", 2*time.Minute); err != nil {
		t.Fatalf("the writer never held its transaction: %v\n%s", err, child)
	}
	child.Kill()

	// At once: a write and a read of this process, waited for generously
	// (a lock never released would block the write for ever: the flock
	// does not heed a context).
	wrote := make(chan error, 1)
	go func() {
		wrote <- b.Enqueue(ctx, killQueue, []driver.Message{{ID: "after", Body: []byte("after")}})
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("a write after the writer was killed: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a write after the writer was killed still waits two minutes later: its locks were not released")
	}

	st, err := b.Stats(ctx, killQueue)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 21 || st.InFlight != 0 || st.Scheduled != 0 {
		t.Errorf("after the kill: %+v, want the 20 jobs committed before it and the one after, ready (nothing of the killed transaction)", st)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var got []string
	for len(got) < 21 {
		ds, err := b.Receive(rctx, killQueue, 100, time.Minute)
		if err != nil {
			t.Fatalf("receive after the kill (have %q): %v", got, err)
		}
		for _, d := range ds {
			got = append(got, string(d.Body))
			if d.Deliveries != 1 {
				t.Errorf("%s: delivery %d, want 1 (the killed claim must not count)", d.Body, d.Deliveries)
			}
		}
	}
	sort.Strings(got)
	want := []string{"after"}
	for _, m := range kept {
		want = append(want, m.ID)
	}
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("received %q, want %q", got, want)
	}
	if _, _, err := b.Get(ctx, "tx/key"); !errors.Is(err, driver.ErrKeyNotFound) {
		t.Errorf("the killed transaction's store key: %v, want ErrKeyNotFound", err)
	}
	if v, _, err := b.Get(ctx, "kept/key"); err != nil || string(v) != "v" {
		t.Errorf("the key written before the kill: %q, %v", v, err)
	}
}

// killedWriter is the child: it writes in a transaction, says "holding"
// and waits to be killed (it rolls back if its stdin closes first).
func killedWriter(t *testing.T, role string) {
	ctx := context.Background()
	b, err := New(ctx, Config{Path: testPath(t, "killed-"+role)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	hold := func() error {
		fmt.Println("holding")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return errors.New("not killed")
	}
	switch role {
	case "tx":
		tx, err := b.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		tctx := WithTx(ctx, tx)
		var msgs []driver.Message
		for i := range 50 {
			id := fmt.Sprintf("tx-%d", i)
			msgs = append(msgs, driver.Message{ID: id, Body: []byte(id)})
		}
		if err := b.Enqueue(tctx, killQueue, msgs); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Create(tctx, "tx/key", []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		t.Fatal(hold())
	case "claim":
		err := b.write(ctx, func(c conn) error {
			// The claim's own statements, as Receive runs them.
			var ids []string
			rows, err := c.QueryContext(ctx, b.q.pick, killQueue, maxClaim)
			if err != nil {
				return err
			}
			for rows.Next() {
				var id, due int64
				if err := rows.Scan(&id, &due); err != nil {
					rows.Close()
					return err
				}
				ids = append(ids, fmt.Sprint(id))
			}
			rows.Close()
			res, err := c.ExecContext(ctx, b.q.claim, 7, time.Hour.Milliseconds(), "["+strings.Join(ids, ",")+"]", b.cfg.MaxBody+1)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 20 {
				return fmt.Errorf("claimed %d rows (%v), want 20", n, err)
			}
			return hold()
		})
		t.Fatal(err)
	default:
		t.Fatalf("unknown role %q", role)
	}
}
