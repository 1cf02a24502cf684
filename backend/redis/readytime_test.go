package redis

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Every field a copy puts in the jobs hash, its ready time ("r:"+id)
// included, goes with the copy: after an ack, a requeue and its ack, and a
// dead letter, the hash is empty.
func TestReadyTimeLeavesNothing(t *testing.T) {
	eachServer(t, func(t *testing.T, b *Backend, q string) {
		ctx := context.Background()
		if err := b.Enqueue(ctx, q, []driver.Message{{ID: "a", Body: []byte("a")}, {ID: "r", Body: []byte("r")}, {ID: "d", Body: []byte("d")}}); err != nil {
			t.Fatal(err)
		}
		for _, body := range []string{"a", "r", "d"} {
			d := receiveOne(t, b, q, time.Minute)
			var err error
			switch string(d.Body) {
			case "a":
				err = b.Ack(ctx, d)
			case "r":
				err = b.Requeue(ctx, d, driver.Message{ID: "r.1", Body: []byte("r again")})
			case "d":
				err = b.DeadLetter(ctx, d, driver.DeadMessage{ID: "d", Body: []byte("rec")})
			}
			if err != nil {
				t.Fatalf("settling %s: %v", body, err)
			}
		}
		if err := b.Ack(ctx, receiveOne(t, b, q, time.Minute)); err != nil {
			t.Fatal(err)
		}
		fields, err := b.rdb.HKeys(ctx, b.keys(q)[keyJobs]).Result()
		if err != nil || len(fields) != 0 {
			t.Errorf("jobs hash after every copy settled: %q, %v; want empty", fields, err)
		}
	})
}
