package asyncplatform_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	_ "github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// BenchmarkJobsPageRedis: a page of 100 scheduled jobs of 100,000 status
// records on the machine's Redis, at the 1,000th page's cursor (all match:
// a page reads 100 records) and with a filter that matches 1 in 100 (a
// page reads MaxJobsScan records and may be short).
func BenchmarkJobsPageRedis(b *testing.B) {
	ctx := context.Background()
	prefix := "jobs42bench" + strings.ToLower(rand.Text()[:6])
	url := testenv.Getenv("ASYNCPLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0") + "?prefix=" + prefix
	be, err := ap.Open(ctx, url)
	if err != nil {
		testenv.Unreachable(b, "Redis", err)
		return
	}
	defer be.Close()
	s, err := driver.StoreOf(be)
	if err != nil {
		b.Fatal(err)
	}
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	var keys []string
	for i := 0; i < n; i += driver.MaxBatch {
		items := make([]driver.BatchItem, 0, driver.MaxBatch)
		for j := i; j < i+driver.MaxBatch; j++ {
			q := "bench"
			if j%100 == 0 {
				q = "rare"
			}
			v, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("job-%07d", j), "queue": q, "type": "t", "state": "scheduled", "updated_at": time.Now()})
			k := kv.Status.Prefix() + fmt.Sprintf("job/job-%07d", j)
			items = append(items, driver.BatchItem{Key: k, Value: v, TTL: time.Hour})
			keys = append(keys, k)
		}
		if _, err := driver.CreateEach(ctx, s, items); err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		for i := 0; i < len(keys); i += driver.MaxBatch {
			items := make([]driver.BatchItem, 0, driver.MaxBatch)
			for _, k := range keys[i:min(i+driver.MaxBatch, len(keys))] {
				items = append(items, driver.BatchItem{Key: k})
			}
			_, _ = driver.DeleteEach(ctx, s, items)
		}
	}()
	p, err := ap.New(be, ap.Config{})
	if err != nil {
		b.Fatal(err)
	}
	cursor := fmt.Sprintf("job-%07d", n-1100-1) // the 1,000th page of 100 (of 100,000)
	b.Run("Page1000", func(b *testing.B) {
		for b.Loop() {
			pg, err := p.Jobs(ctx, ap.JobsQuery{Queue: "bench", State: ap.StateScheduled, Limit: 100, Cursor: cursor})
			if err != nil || len(pg.Jobs) != 100 {
				b.Fatalf("%d jobs, %v", len(pg.Jobs), err)
			}
		}
	})
	b.Run("RareQueue", func(b *testing.B) {
		for b.Loop() {
			pg, err := p.Jobs(ctx, ap.JobsQuery{Queue: "rare", Limit: 100, Cursor: cursor})
			if err != nil || len(pg.Jobs) != 11 {
				b.Fatalf("%d jobs, scanned %d, next %q, %v", len(pg.Jobs), pg.Scanned, pg.Next, err)
			}
		}
	})
	b.Run("Counts", func(b *testing.B) {
		for b.Loop() {
			if _, err := p.JobCounts(ctx, ""); err != nil {
				b.Fatal(err)
			}
		}
	})
}
