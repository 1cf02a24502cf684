package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// BenchmarkBrowseDeepPage reads the 1,000th page of 100 of 100,000
// scheduled copies (10,000 and the 100th page with -short) with Browse,
// on the machine's Redis: issue 42 asks for under 50 ms.
//
//	go test -run '^$' -bench BrowseDeepPage -benchtime 200x ./backend/redis/
func BenchmarkBrowseDeepPage(b *testing.B) {
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: realRedis(b)})
	b.Cleanup(func() { c.Close() })
	be, err := New(ctx, Config{Client: c, Prefix: "apbrowse42"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	queue := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	b.Cleanup(func() { _ = be.DeleteQueue(context.Background(), queue) })
	total := 100_000
	if testing.Short() {
		total = 10_000
	}
	body := make([]byte, 200)
	due := time.Now().Add(time.Hour)
	for i := 0; i < total; i += 1000 {
		msgs := make([]driver.Message, 1000)
		for j := range msgs {
			msgs[j] = driver.Message{ID: fmt.Sprintf("m%d", i+j), Body: body, NotBefore: due.Add(time.Duration(i+j) * time.Millisecond)}
		}
		if err := be.Enqueue(ctx, queue, msgs); err != nil {
			b.Fatal(err)
		}
	}
	cursor := driver.OffsetCursor(int64(total - 100))
	b.ResetTimer()
	for b.Loop() {
		pg, err := be.Browse(ctx, queue, driver.BrowseScheduled, cursor, 100)
		if err != nil {
			b.Fatal(err)
		}
		if len(pg.Items) != 100 || pg.Next != "" {
			b.Fatalf("the last page: %d items, next %q", len(pg.Items), pg.Next)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/page")
}
