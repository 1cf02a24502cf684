package flow_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/backend/redis"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/flow"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// The tests run against three stores: fake (a KV of the tests' own, on a
// clock the test moves: exact and instant), memory (the memory backend's
// store) and redis (the machine's Redis, through backend/redis). The real
// stores are reached through nsKV, which checks what the root package's
// Store checks (the tests cannot import it: it will import this package).

// fakeKV is an in-memory KV on a clock of its own. It keeps the contract of
// driver.Store: revisions never reused, TTLs that end exactly on time.
type fakeKV struct {
	mu   sync.Mutex
	now  time.Time
	rev  uint64
	data map[string]fakeEntry
}

type fakeEntry struct {
	value   []byte
	rev     string
	expires time.Time // zero: never
}

func newFakeKV() *fakeKV {
	return &fakeKV{now: time.Unix(1_700_000_000, 0), data: map[string]fakeEntry{}}
}

// Advance moves the fake's clock.
func (f *fakeKV) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// Now returns the fake's clock.
func (f *fakeKV) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeKV) live(key string) (fakeEntry, bool) {
	e, ok := f.data[key]
	if ok && !e.expires.IsZero() && !f.now.Before(e.expires) {
		delete(f.data, key)
		return fakeEntry{}, false
	}
	return e, ok
}

func (f *fakeKV) put(key string, value []byte, ttl time.Duration) string {
	if err := driver.CheckKey(key); err != nil {
		panic(err)
	}
	if err := driver.CheckTTL(ttl); err != nil || ttl%time.Millisecond != 0 {
		panic("fakeKV: bad TTL " + ttl.String())
	}
	f.rev++
	e := fakeEntry{value: append([]byte(nil), value...), rev: strconv.FormatUint(f.rev, 10)}
	if ttl > 0 {
		e.expires = f.now.Add(ttl)
	}
	f.data[key] = e
	return e.rev
}

func (f *fakeKV) Get(_ context.Context, key string) ([]byte, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.live(key)
	if !ok {
		return nil, "", driver.ErrKeyNotFound
	}
	return append([]byte(nil), e.value...), e.rev, nil
}

func (f *fakeKV) Create(_ context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live(key); ok {
		return "", driver.ErrKeyExists
	}
	return f.put(key, value, ttl), nil
}

func (f *fakeKV) Update(_ context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.live(key); !ok || e.rev != rev {
		return "", driver.ErrRevision
	}
	return f.put(key, value, ttl), nil
}

func (f *fakeKV) Delete(_ context.Context, key, rev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.live(key)
	if rev != "" && (!ok || e.rev != rev) {
		return driver.ErrRevision
	}
	delete(f.data, key)
	return nil
}

// nsKV is a driver.Store as the root package's Store presents it: keys in
// a namespace, every key, value and TTL checked before the store is called.
type nsKV struct {
	d  driver.Store
	ns string // namespace + "/"
}

func checkWrite(key string, value []byte, ttl time.Duration) error {
	if err := driver.CheckKey(key); err != nil {
		return err
	}
	if err := driver.CheckValue(value); err != nil {
		return err
	}
	if err := driver.CheckTTL(ttl); err != nil {
		return err
	}
	if ttl%time.Millisecond != 0 {
		return fmt.Errorf("TTL %v is not whole milliseconds", ttl)
	}
	return nil
}

func (s nsKV) Get(ctx context.Context, key string) ([]byte, string, error) {
	if err := driver.CheckKey(key); err != nil {
		return nil, "", err
	}
	return s.d.Get(ctx, s.ns+key)
}

func (s nsKV) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	if err := checkWrite(key, value, ttl); err != nil {
		return "", err
	}
	return s.d.Create(ctx, s.ns+key, value, ttl)
}

func (s nsKV) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	if err := checkWrite(key, value, ttl); err != nil {
		return "", err
	}
	if rev == "" {
		return "", driver.ErrRevision
	}
	return s.d.Update(ctx, s.ns+key, value, rev, ttl)
}

func (s nsKV) Delete(ctx context.Context, key, rev string) error {
	if err := driver.CheckKey(key); err != nil {
		return err
	}
	return s.d.Delete(ctx, s.ns+key, rev)
}

// countingKV counts the calls (store round trips) made through it.
type countingKV struct {
	flow.KV
	calls atomic.Int64
}

func (c *countingKV) Get(ctx context.Context, key string) ([]byte, string, error) {
	c.calls.Add(1)
	return c.KV.Get(ctx, key)
}

func (c *countingKV) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	c.calls.Add(1)
	return c.KV.Create(ctx, key, value, ttl)
}

func (c *countingKV) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	c.calls.Add(1)
	return c.KV.Update(ctx, key, value, rev, ttl)
}

func (c *countingKV) Delete(ctx context.Context, key, rev string) error {
	c.calls.Add(1)
	return c.KV.Delete(ctx, key, rev)
}

// cluster is one shared store as several processes see it: Connect opens a
// client of its own each time, in one namespace.
type cluster struct {
	name string
	// Connect opens a new, independent client of the store.
	Connect func(tb testing.TB) flow.KV
	// Sleep lets d pass on the store's clock (the fake's moves at once).
	Sleep func(d time.Duration)
	// Now is the clock the store's TTLs run on, as Take's now.
	Now func() time.Time
	// fake is the fake store, nil for the real ones.
	fake *fakeKV
}

// clusterKinds are the stores every test runs on.
var clusterKinds = []string{"fake", "memory", "redis"}

// newCluster returns a cluster of the named kind in a namespace of the
// test's own; keys lists the keys the test writes, deleted at its end.
func newCluster(tb testing.TB, kind string, keys ...string) *cluster {
	tb.Helper()
	c := &cluster{name: kind, Sleep: time.Sleep, Now: time.Now}
	var open func(tb testing.TB) driver.Store
	switch kind {
	case "fake":
		f := newFakeKV()
		c.fake = f
		c.Connect = func(testing.TB) flow.KV { return f }
		c.Sleep = f.Advance
		c.Now = f.Now
		return c
	case "memory":
		br := memory.NewBroker()
		open = func(tb testing.TB) driver.Store {
			b, err := memory.New(context.Background(), memory.Config{Broker: br})
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { b.Close() })
			d, err := driver.StoreOf(b)
			if err != nil {
				tb.Fatal(err)
			}
			return d
		}
	case "redis":
		addr := realRedis(tb)
		open = func(tb testing.TB) driver.Store {
			rc := goredis.NewClient(&goredis.Options{Addr: addr})
			b, err := redis.New(context.Background(), redis.Config{Client: rc, Prefix: "apt-flow"})
			if err != nil {
				rc.Close()
				tb.Fatal(err)
			}
			tb.Cleanup(func() { b.Close(); rc.Close() })
			d, err := driver.StoreOf(b)
			if err != nil {
				tb.Fatal(err)
			}
			return d
		}
	default:
		tb.Fatalf("no cluster kind %q", kind)
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	ns := "flow-" + hex.EncodeToString(r[:])
	c.Connect = func(tb testing.TB) flow.KV { return nsKV{d: open(tb), ns: ns + "/"} }
	cleaner := c.Connect(tb) // opened first, so closed after the clean-up below
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, k := range keys {
			if err := cleaner.Delete(ctx, k, ""); err != nil {
				tb.Logf("cleaning up %s: %v", k, err)
			}
		}
	})
	return c
}

// slotKeys lists the keys of a semaphore of n slots under prefix.
func slotKeys(prefix string, n int) []string {
	var keys []string
	for i := range n + 1 { // one more, for a broken semaphore's extra slot
		keys = append(keys, prefix+"/"+strconv.Itoa(i))
	}
	return keys
}

func redisAddr() string { return testenv.Getenv("ASYNCPLATFORM_REDIS_ADDR", "127.0.0.1:6379") }

// realRedis returns the address of the machine's Redis, or ends the test.
func realRedis(tb testing.TB) string {
	tb.Helper()
	addr := redisAddr()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Unreachable(tb, "Redis at "+addr, err)
	}
	return addr
}

// forEachKind runs f as a parallel subtest per store kind.
func forEachKind(t *testing.T, f func(t *testing.T, kind string)) {
	for _, kind := range clusterKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f(t, kind)
		})
	}
}

func isErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want one matching %v", what, err, want)
	}
}

func must(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
