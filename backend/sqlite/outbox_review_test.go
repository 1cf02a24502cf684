package sqlite

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/outbox"
)

// TestOutboxQueuesNotStarvedByStuckNames: rows under names too long to
// address stay in the table for good; MaxQueues such names must not keep
// OutboxQueues from ever naming a queue whose rows can be relayed.
func TestOutboxQueuesNotStarvedByStuckNames(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "obs.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ins := `INSERT INTO ` + b.cfg.Prefix + `_outbox (queue, id, dedupe, body) VALUES (?, ?, '', 'x')`
	for i := range outbox.MaxQueues {
		long := "a" + strconv.Itoa(100000+i) + strings.Repeat("q", 500)
		if _, err := b.db.ExecContext(ctx, ins, long, "j"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.ExecContext(ctx, ins, "zz", "j-ok"); err != nil {
		t.Fatal(err)
	}
	target := newRecorder(t)
	r, err := outbox.New(outbox.Config{Source: b, Target: target, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := r.Once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := target.got("zz"); len(got) != 1 {
		t.Errorf("after 3 passes, %d rows relayed to zz, want its one row: %d stuck names hide it", len(got), outbox.MaxQueues)
	}
}
