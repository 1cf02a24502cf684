package rabbit

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestReviewListDeadOverMaxBatch: ListDead on the companion store reads a
// page's heads with one driver.GetEach, which refuses more than
// driver.MaxBatch keys; a page over 1,000 records (the driver's ListDead
// takes any limit) then fails where it used to list.
func TestReviewListDeadOverMaxBatch(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{Store: pgCompanion(t)})
	ctx := longCtx(t)
	q := queueName(t, b)
	t.Cleanup(func() { _ = b.dropStoreDead(longCtx(t), q) })
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	const n = driver.MaxBatch + 2
	base := time.Now()
	var g errgroup.Group
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			return b.writeDead(ctx, q, newSeq(base.Add(time.Duration(i))), driver.DeadMessage{ID: fmt.Sprintf("r%05d", i), Body: []byte("x")})
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	recs, next, err := b.ListDead(ctx, q, "", n-1)
	if err != nil || len(recs) != n-1 || next == "" {
		t.Fatalf("ListDead of %d: %d records, next %q, %v; want %d and a cursor", n-1, len(recs), next, err, n-1)
	}
}
