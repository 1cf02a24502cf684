package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/internal/queuetest"
)

// TestQueues lists the queues of a prefix of the test's own on the real
// Redis: declared ones from the registry set, others from their keys, and
// never a key of another prefix or one that is not a queue's.
func TestQueues(t *testing.T) {
	t.Parallel()
	c := goredis.NewClient(&goredis.Options{Addr: realRedis(t)})
	defer c.Close()
	var r [4]byte
	_, _ = rand.Read(r[:])
	prefix := "qt" + hex.EncodeToString(r[:])
	b, err := New(context.Background(), Config{Client: c, Prefix: prefix, DeadHold: 300 * time.Millisecond, IdleWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	queuetest.Run(t, b, queuetest.Options{})

	// Keys Queues must not take for queues: another prefix that starts
	// like this one, a key of ours that no queue has, a name that is not a
	// queue name; and one it must: a queue written before the registry
	// (keys, no member).
	ctx := context.Background()
	foreign := []string{
		"{" + prefix + ":other:q}:seq",
		"{" + prefix + ":q}:bogus",
		"{" + prefix + ":bad/name\x1b[31m}:seq",
		"{" + prefix + "}:store:x",
		"{" + prefix + "x:q}:seq",
	}
	old := "{" + prefix + ":written.before}:seq"
	t.Cleanup(func() { c.Del(context.Background(), append(foreign, old)...) })
	for _, k := range append(foreign, old) {
		if err := c.Set(ctx, k, "1", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{queuetest.Jobs, "written.before"}; !slices.Equal(got, want) {
		t.Fatalf("Queues = %q, want %q", got, want)
	}
	if err := b.DeleteQueue(ctx, queuetest.Jobs); err != nil {
		t.Fatal(err)
	}
}
