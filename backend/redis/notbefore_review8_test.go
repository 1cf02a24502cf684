package redis

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// A NotBefore a nanosecond past a whole millisecond, given to
// Enqueue, EnqueueClaiming and Requeue, is scheduled no earlier than
// itself (the sched score rounded up, not down).
func TestNotBeforeStoredNotEarlyReview8(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	run(t, realRedis(t), func(t *testing.T, b *Backend, q string) {
		nb := time.UnixMilli(time.Now().Add(time.Hour).UnixMilli()).Add(time.Nanosecond)
		sched := b.keys(q)[1]
		check := func(what string) {
			t.Helper()
			zs, err := b.rdb.ZRangeWithScores(ctx, sched, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(zs) == 0 {
				t.Fatalf("%s: nothing scheduled", what)
			}
			for _, z := range zs {
				if at := time.UnixMilli(int64(math.Round(z.Score))); at.Before(nb) {
					t.Errorf("%s: scheduled at %d, before the NotBefore %d", what, at.UnixNano(), nb.UnixNano())
				}
			}
			if err := b.rdb.Del(ctx, sched).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Enqueue(ctx, q, []driver.Message{{ID: "a", Body: []byte("a"), NotBefore: nb}}); err != nil {
			t.Fatal(err)
		}
		check("Enqueue")
		if b.ClaimsWithEnqueue() {
			if _, err := b.EnqueueClaiming(ctx, q, []driver.ClaimMessage{{Message: driver.Message{ID: "c", Body: []byte("c"), NotBefore: nb}}}); err != nil {
				t.Fatal(err)
			}
			check("EnqueueClaiming")
		}
		if err := b.Enqueue(ctx, q, []driver.Message{{ID: "b", Body: []byte("b")}}); err != nil {
			t.Fatal(err)
		}
		d := receiveOne(t, b, q, time.Minute)
		if err := b.Requeue(ctx, d, driver.Message{ID: "b", Body: []byte("b"), NotBefore: nb}); err != nil {
			t.Fatal(err)
		}
		check("Requeue")
	})
}
