package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// review10Store opens a store on the real Redis under a prefix of its own,
// removed after the test.
func review10Store(t *testing.T, addr ...string) (*Backend, *goredis.Client) {
	t.Helper()
	if len(addr) == 0 {
		addr = append(addr, realRedis(t))
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr[0]})
	prefix := fmt.Sprintf("review10-%d", time.Now().UnixNano())
	b, err := New(context.Background(), Config{Client: c, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := c.Keys(ctx, "*"+prefix+"*").Result()
		if len(keys) > 0 {
			c.Del(ctx, keys...)
		}
		b.Close()
		c.Close()
	})
	return b, c
}

// checkStoreKeysReview10 checks the store's keys against each other: every
// key of the data hash is in the index, in the expiry zset at its expiry
// when it has one and not when it has none; the index and the expiry zset
// hold no key the hash lacks.
func checkStoreKeysReview10(t *testing.T, b *Backend, c *goredis.Client, when string) {
	t.Helper()
	ctx := context.Background()
	k := b.storeKeys()
	data, err := c.HGetAll(ctx, k[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	idx, _ := c.ZRange(ctx, k[1], 0, -1).Result()
	exp, _ := c.ZRangeWithScores(ctx, k[2], 0, -1).Result()
	inIdx := map[string]bool{}
	for _, x := range idx {
		inIdx[x] = true
	}
	expOf := map[string]float64{}
	for _, z := range exp {
		expOf[z.Member.(string)] = z.Score
	}
	metas := map[string]bool{}
	for f, m := range data {
		key, ok := strings.CutPrefix(f, "m:")
		if !ok {
			continue
		}
		metas[key] = true
		_, es, _ := strings.Cut(m, ":")
		e, _ := strconv.ParseFloat(es, 64)
		if !inIdx[key] {
			t.Errorf("%s: %q (meta %s) is not in the index", when, key, m)
		}
		sc, inExp := expOf[key]
		switch {
		case e == 0 && inExp:
			t.Errorf("%s: %q has no expiry (meta %s) but is in the expiry zset at %v", when, key, m, sc)
		case e != 0 && (!inExp || sc != e):
			t.Errorf("%s: %q expires at %v (meta %s), expiry zset: %v %v", when, key, e, m, sc, inExp)
		}
	}
	for x := range inIdx {
		if !metas[x] {
			t.Errorf("%s: %q in the index, not in the hash", when, x)
		}
	}
	for x := range expOf {
		if !metas[x] {
			t.Errorf("%s: %q in the expiry zset, not in the hash", when, x)
		}
	}
}

// Every write on the Redis store, whichever script makes it, gives a
// revision never given before and greater than every one before it; the
// index and the expiry zset stay those of the data hash through TTL
// changes, expiries left unswept and re-creations.
func TestStoreRevisionsAndKeysReview10(t *testing.T) {
	t.Run("redis", func(t *testing.T) { revisionsAndKeysReview10(t, realRedis(t)) })
	t.Run("miniredis", func(t *testing.T) { revisionsAndKeysReview10(t, miniredis.RunT(t).Addr()) })
}

func revisionsAndKeysReview10(t *testing.T, addr string) {
	b, c := review10Store(t, addr)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(10, 10))
	seen := map[string]bool{}
	last := uint64(0)
	give := func(op, rev string) {
		t.Helper()
		n, err := strconv.ParseUint(rev, 10, 64)
		if err != nil || seen[rev] || n <= last {
			t.Fatalf("%s gave revision %q (last %d, seen before %v)", op, rev, last, seen[rev])
		}
		seen[rev], last = true, n
	}
	revOf := map[string]string{}
	keys := []string{"a", "b", "c", "d", "e", "f", "g/1", "g/2"}
	ttl := func() time.Duration {
		switch rng.IntN(3) {
		case 0:
			return 0
		case 1:
			return time.Duration(1+rng.IntN(3)) * time.Millisecond
		}
		return time.Hour
	}
	for i := range 600 {
		k := keys[rng.IntN(len(keys))]
		switch rng.IntN(6) {
		case 0:
			rev, err := b.Create(ctx, k, []byte("v"+k), ttl())
			if err == nil {
				give("Create", rev)
				revOf[k] = rev
			}
		case 1:
			_, rev, err := b.Get(ctx, k)
			if err != nil {
				continue
			}
			nrev, err := b.Update(ctx, k, []byte("u"+k), rev, ttl())
			if err == nil {
				give("Update", nrev)
				revOf[k] = nrev
			}
		case 2:
			items := []driver.BatchItem{{Key: k, Value: []byte("x"), TTL: ttl()}, {Key: keys[rng.IntN(len(keys))], Value: []byte("y"), TTL: ttl()}, {Key: keys[rng.IntN(len(keys))], TTL: ttl()}}
			rs, err := b.CreateEach(ctx, items)
			if err != nil {
				t.Fatal(err)
			}
			for j, r := range rs {
				if r.Err == nil {
					give("CreateEach", r.Rev)
					revOf[items[j].Key] = r.Rev
				}
			}
		case 3:
			var items []driver.BatchItem
			for _, kk := range []string{k, keys[rng.IntN(len(keys))]} {
				if _, rev, err := b.Get(ctx, kk); err == nil {
					items = append(items, driver.BatchItem{Key: kk, Value: []byte("w"), Rev: rev, TTL: ttl()})
				}
			}
			if len(items) == 0 {
				continue
			}
			rs, err := b.UpdateEach(ctx, items)
			if err != nil {
				t.Fatal(err)
			}
			for j, r := range rs {
				if r.Err == nil {
					give("UpdateEach", r.Rev)
					revOf[items[j].Key] = r.Rev
				}
			}
		case 4:
			msgs := []driver.ClaimMessage{{Message: driver.Message{ID: fmt.Sprint("m", i), Body: []byte("b")}}}
			if rng.IntN(2) == 0 {
				msgs = append(msgs, driver.ClaimMessage{Message: driver.Message{ID: fmt.Sprint("n", i), Body: []byte("b")}, Claim: &driver.BatchItem{Key: k, Value: []byte("claim"), TTL: time.Duration(1+rng.IntN(3)) * time.Millisecond}})
			}
			if _, err := b.EnqueueClaiming(ctx, "q", msgs); err != nil {
				t.Fatal(err)
			}
			if _, rev, err := b.Get(ctx, k); err == nil && rev != revOf[k] {
				give("EnqueueClaiming", rev)
				revOf[k] = rev
			}
		case 5:
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
		checkStoreKeysReview10(t, b, c, fmt.Sprint("op ", i))
		if t.Failed() {
			t.FailNow()
		}
	}
}

// A key that expired unswept and is created again is listed, and expires
// when its new TTL says: not before, not never.
func TestStoreRecreatedUnsweptReview10(t *testing.T) {
	b, c := review10Store(t)
	ctx := context.Background()
	// 40 keys expiring first, so that the sweeps (17 a write) leave "k".
	for i := range 40 {
		if _, err := b.Create(ctx, fmt.Sprintf("a%02d", i), nil, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Create(ctx, "k", []byte("old"), 5*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	for _, ttl := range []time.Duration{0, 300 * time.Millisecond} {
		if _, err := b.Create(ctx, "k", []byte("new"), ttl); err != nil {
			t.Fatalf("create over the expired key (ttl %v): %v", ttl, err)
		}
		checkStoreKeysReview10(t, b, c, fmt.Sprint("re-created with ttl ", ttl))
		ks, err := b.List(ctx, "", "", 100)
		if err != nil || !slices.Contains(ks, "k") {
			t.Fatalf("List after re-create (ttl %v): %v %v", ttl, ks, err)
		}
		if ttl == 0 {
			// no TTL to TTL to no TTL through Update
			_, rev, _ := b.Get(ctx, "k")
			rev, err = b.Update(ctx, "k", []byte("t"), rev, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			checkStoreKeysReview10(t, b, c, "updated to a TTL")
			rev, err = b.Update(ctx, "k", []byte("t"), rev, 0)
			if err != nil {
				t.Fatal(err)
			}
			checkStoreKeysReview10(t, b, c, "updated to no TTL")
			if err := b.Delete(ctx, "k", rev); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, _, err := b.Get(ctx, "k"); err != nil {
		t.Fatalf("k gone before its TTL: %v", err)
	}
	time.Sleep(400 * time.Millisecond)
	if _, _, err := b.Get(ctx, "k"); err == nil {
		t.Fatal("k present after its TTL")
	}
	for range 5 {
		b.Create(ctx, "z", nil, time.Millisecond)
		b.List(ctx, "", "", 10)
	}
	checkStoreKeysReview10(t, b, c, "after sweeps")
}
