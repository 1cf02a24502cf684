package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// seedDead appends n records named prefix0, prefix1, ... to the queue's dead
// list, in pipelined batches.
func seedDead(t *testing.T, c goredis.UniversalClient, b *Backend, q, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := 0; i < n; i += 1000 {
		vals := make([]any, 0, 1000)
		for j := i; j < n && j < i+1000; j++ {
			ids[j] = prefix + strconv.Itoa(j)
			vals = append(vals, encodeDead(driver.DeadMessage{ID: ids[j], Body: []byte("body of " + ids[j])}))
		}
		if err := c.RPush(context.Background(), b.keys(q)[keyDead], vals...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// commandCalls returns the server's call count of each command (INFO
// commandstats).
func commandCalls(t *testing.T, c *goredis.Client) map[string]int {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		calls[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return calls
}

// TestDeleteDeadBounded deletes 10,000 dead records on a Redis of the test's
// own, whose command counts are the test's alone: the delete takes one
// script call per window, each with at most one LRANGE and one LREM, so no
// call's work grows with the list. A held record of a deleted ID stays, and
// so does every record not asked for, in order.
func TestDeleteDeadBounded(t *testing.T) {
	t.Parallel()
	addr, _ := ownRedis(t)
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	b, err := New(context.Background(), Config{Client: c, DeadHold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	q := testQueue(t)

	held := seedDead(t, c, b, q, "held-", 1)
	d, err := b.NextDead(ctx, q)
	if err != nil || d.ID != held[0] {
		t.Fatalf("NextDead = %v, %v; want %s", d, err, held[0])
	}
	const n = 10000
	gone := seedDead(t, c, b, q, "gone-", n)
	kept := seedDead(t, c, b, q, "kept-", 100)

	before := commandCalls(t, c)
	got, err := b.DeleteDead(ctx, q, append(gone, held...))
	if err != nil || got != n {
		t.Fatalf("DeleteDead = %d, %v; want %d", got, err, n)
	}
	after := commandCalls(t, c)
	delta := func(cmd string) int { return after[cmd] - before[cmd] }
	scripts := delta("evalsha") + delta("eval")
	if minCalls := n / deleteWindow; scripts < minCalls {
		t.Errorf("DeleteDead of %d records ran %d scripts, want at least %d (one per window of %d)", n, scripts, minCalls, deleteWindow)
	}
	for _, cmd := range []string{"lrange", "lrem"} {
		if delta(cmd) > scripts {
			t.Errorf("DeleteDead ran %d %s in %d scripts, want at most one a script", delta(cmd), cmd, scripts)
		}
	}

	recs, _, err := b.ListDead(ctx, q, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(kept) {
		t.Fatalf("%d records left, want the %d kept ones", len(recs), len(kept))
	}
	for i, r := range recs {
		if r.ID != kept[i] {
			t.Fatalf("record %d is %q, want %q", i, r.ID, kept[i])
		}
	}
	if err := b.SettleDead(ctx, d, false); err != nil {
		t.Fatalf("the held record's SettleDead: %v", err)
	}
}

// TestDeleteDeadConcurrent runs a windowed DeleteDead while a second one
// removes other records and a NextDead caller keeps popping and returning
// the head: removals behind a window and moves at the head skip no record.
func TestDeleteDeadConcurrent(t *testing.T) {
	eachServer(t, func(t *testing.T, b *Backend, q string) {
		b.window = 7
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := b.rdb
		head := seedDead(t, c, b, q, "head-", 20)
		var a, other []string
		for i := range 400 {
			id := seedDead(t, c, b, q, fmt.Sprintf("x%d-", i), 1)[0]
			if i%2 == 0 {
				a = append(a, id)
			} else {
				other = append(other, id)
			}
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := b.NextDead(ctx, q)
				if err != nil {
					t.Error(err)
					return
				}
				if err := b.SettleDead(ctx, d, false); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		var nOther int
		var errOther error
		wg.Add(1)
		go func() {
			defer wg.Done()
			// From the tail, so its removals fall behind the first call's windows.
			for i := len(other) - 1; i >= 0; i-- {
				n, err := b.DeleteDead(ctx, q, other[i:i+1])
				if err != nil {
					errOther = err
					return
				}
				nOther += n
			}
		}()
		n, err := b.DeleteDead(ctx, q, a)
		close(stop)
		wg.Wait()
		if err != nil || n != len(a) {
			t.Fatalf("DeleteDead = %d, %v; want %d", n, err, len(a))
		}
		if errOther != nil || nOther != len(other) {
			t.Fatalf("the other DeleteDead calls removed %d, %v; want %d", nOther, errOther, len(other))
		}
		recs, _, err := b.ListDead(ctx, q, "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != len(head) {
			t.Fatalf("%d records left, want the %d at the head: %v", len(recs), len(head), recs)
		}
	})
}
