package redis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestBrowseBoundsForgedID: a forged element of the ready list or of a
// sorted set (anyone with the Redis can write one) is returned by Browse
// with an ID of at most driver.MaxBrowseID bytes: a page's size is
// bounded whatever the broker holds.
func TestBrowseBoundsForgedID(t *testing.T) {
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: realRedis(t)})
	t.Cleanup(func() { c.Close() })
	be, err := New(ctx, Config{Client: c, Prefix: "apreviewA"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	queue := fmt.Sprintf("forged-%d", time.Now().UnixNano())
	t.Cleanup(func() { _ = be.DeleteQueue(context.Background(), queue) })
	k := be.keys(queue)
	huge := strings.Repeat("x", 4<<20)
	if err := c.LPush(ctx, k[0], huge).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ZAdd(ctx, k[1], goredis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: huge}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, st := range []driver.BrowseState{driver.BrowseReady, driver.BrowseScheduled} {
		pg, err := be.Browse(ctx, queue, st, "", 10)
		if err != nil {
			t.Fatalf("%s: %v", st, err)
		}
		if len(pg.Items) != 1 {
			t.Fatalf("%s: %d items, want the forged one", st, len(pg.Items))
		}
		if n := len(pg.Items[0].ID); n > driver.MaxBrowseID {
			t.Errorf("%s: a forged element came back with an ID of %d bytes, want at most %d", st, n, driver.MaxBrowseID)
		}
	}
}
