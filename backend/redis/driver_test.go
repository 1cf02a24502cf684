package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// testQueue names a queue after the test, plus randomness.
func testQueue(t testing.TB) string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, t.Name())
	if len(name) > 80 {
		name = name[len(name)-80:]
	}
	return name + "-" + hex.EncodeToString(r[:])
}

// eachServer runs fn against the real Redis and against miniredis.
func eachServer(t *testing.T, fn func(t *testing.T, b *Backend, queue string)) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		run(t, realRedis(t), fn)
	})
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		run(t, miniredis.RunT(t).Addr(), fn)
	})
}

func run(t *testing.T, addr string, fn func(t *testing.T, b *Backend, queue string)) {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	b, err := New(context.Background(), Config{Client: c, Prefix: "apt", DeadHold: 2 * time.Second, IdleWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	q := testQueue(t)
	t.Cleanup(func() {
		if err := b.DeleteQueue(context.Background(), q); err != nil {
			t.Error(err)
		}
		b.Close()
		c.Close()
	})
	fn(t, b, q)
}

func receiveOne(t *testing.T, b *Backend, q string, lease time.Duration) *driver.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds, err := b.Receive(ctx, q, 1, lease)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	if len(ds) != 1 {
		t.Fatalf("received %d deliveries, want 1", len(ds))
	}
	return ds[0]
}

// TestDriver checks the driver-level plumbing this package adds (framing,
// tokens, the wake-up path); the behaviour contract is conformance's.
func TestDriver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eachServer(t, func(t *testing.T, b *Backend, q string) {
		body := []byte{0, 1, 0xff, '\n', ':'}
		if err := b.Enqueue(ctx, q, []driver.Message{{ID: "a", Body: body}}); err != nil {
			t.Fatal(err)
		}
		d := receiveOne(t, b, q, 100*time.Millisecond)
		if string(d.Body) != string(body) || d.Deliveries != 1 {
			t.Fatalf("got body %q deliveries %d", d.Body, d.Deliveries)
		}
		// The lease runs out; the next delivery counts one more and the
		// old receipt is stale.
		d2 := receiveOne(t, b, q, time.Minute)
		if d2.Deliveries != 2 {
			t.Fatalf("redelivery counted %d, want 2", d2.Deliveries)
		}
		for name, err := range map[string]error{
			"ack":     b.Ack(ctx, d),
			"extend":  b.Extend(ctx, d, time.Minute),
			"dead":    b.DeadLetter(ctx, d, driver.DeadMessage{ID: "a"}),
			"requeue": b.Requeue(ctx, d, driver.Message{ID: "a.1"}),
		} {
			if !errors.Is(err, driver.ErrLeaseLost) {
				t.Errorf("%s with a stale receipt: %v, want ErrLeaseLost", name, err)
			}
		}
		if err := b.Extend(ctx, d2, time.Minute); err != nil {
			t.Fatal(err)
		}
		// Requeue resets the count and waits for NotBefore; an idle
		// Receive wakes for it without a signal.
		if err := b.Requeue(ctx, d2, driver.Message{ID: "a.1", Body: []byte("x"), NotBefore: time.Now().Add(300 * time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
		st, err := b.Stats(ctx, q)
		if err != nil || st.Scheduled != 1 || st.Ready != 0 || st.InFlight != 0 {
			t.Fatalf("stats %+v, %v", st, err)
		}
		d3 := receiveOne(t, b, q, time.Minute)
		if string(d3.Body) != "x" || d3.Deliveries != 1 {
			t.Fatalf("requeued copy: body %q deliveries %d", d3.Body, d3.Deliveries)
		}
		if err := b.DeadLetter(ctx, d3, driver.DeadMessage{ID: "id:1", Body: []byte("rec")}); err != nil {
			t.Fatal(err)
		}
		if err := b.Ack(ctx, d3); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("ack after dead letter: %v", err)
		}
		// A held record is hidden, comes back on keep, and after a
		// vanished holder's hold.
		dd, err := b.NextDead(ctx, q)
		if err != nil || dd.ID != "id:1" || string(dd.Body) != "rec" {
			t.Fatalf("next dead: %+v %v", dd, err)
		}
		if _, err := b.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
			t.Fatalf("second next dead: %v", err)
		}
		if err := b.SettleDead(ctx, dd, false); err != nil {
			t.Fatal(err)
		}
		if err := b.SettleDead(ctx, dd, true); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("settle twice: %v", err)
		}
		recs, next, err := b.ListDead(ctx, q, "", 10)
		if err != nil || len(recs) != 1 || next != "" || recs[0].ID != "id:1" {
			t.Fatalf("list: %+v %q %v", recs, next, err)
		}
		if n, err := b.DeleteDead(ctx, q, []string{"id:1"}); err != nil || n != 1 {
			t.Fatalf("delete dead: %d %v", n, err)
		}
		if n, err := b.PurgeDead(ctx, q); err != nil || n != 0 {
			t.Fatalf("purge: %d %v", n, err)
		}
	})
}

// TestExtendDead: a hold renewed with ExtendDead outlasts DeadHold; one not
// renewed runs out, and ExtendDead and SettleDead then say so.
func TestExtendDead(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, b *Backend, q string) {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		if got := b.Capabilities().DeadHold; got != b.cfg.DeadHold {
			t.Fatalf("Capabilities().DeadHold = %v, want Config.DeadHold %v", got, b.cfg.DeadHold)
		}
		if err := b.Enqueue(ctx, q, []driver.Message{{ID: "a", Body: []byte("a")}}); err != nil {
			t.Fatal(err)
		}
		if err := b.DeadLetter(ctx, receiveOne(t, b, q, time.Minute), driver.DeadMessage{ID: "rec"}); err != nil {
			t.Fatal(err)
		}
		dd, err := b.NextDead(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for end := time.Now().Add(3 * b.cfg.DeadHold); time.Now().Before(end); {
			time.Sleep(b.cfg.DeadHold / 3)
			if err := b.ExtendDead(ctx, dd); err != nil {
				t.Fatalf("ExtendDead of a live hold: %v", err)
			}
		}
		if other, err := b.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
			t.Fatalf("NextDead of a record held past three DeadHolds by renewals: %v, %v; want ErrNoDeadLetters", other, err)
		}
		time.Sleep(b.cfg.DeadHold + 100*time.Millisecond)
		if err := b.ExtendDead(ctx, dd); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("ExtendDead after the hold ran out: %v, want ErrLeaseLost", err)
		}
		if err := b.SettleDead(ctx, dd, true); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("SettleDead after the hold ran out: %v, want ErrLeaseLost", err)
		}
		if again, err := b.NextDead(ctx, q); err != nil || again.ID != "rec" {
			t.Fatalf("NextDead after the hold ran out: %v, %v; want the record back", again, err)
		}
	})
}

// TestWake checks that an idle Receive is woken by an Enqueue from another
// Backend rather than by its IdleWait.
func TestWake(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, b *Backend, q string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got := make(chan error, 4)
		for range 4 {
			go func() {
				ds, err := b.Receive(ctx, q, 1, time.Minute)
				if err == nil && len(ds) != 1 {
					err = errors.New("empty receive")
				}
				got <- err
			}()
		}
		time.Sleep(50 * time.Millisecond)
		var msgs []driver.Message
		for range 4 {
			msgs = append(msgs, driver.Message{Body: []byte("m")})
		}
		if err := b.Enqueue(ctx, q, msgs); err != nil {
			t.Fatal(err)
		}
		for range 4 {
			if err := <-got; err != nil {
				t.Fatal(err)
			}
		}
	})
}

// redisAddr is the shared Redis the tests use.
func redisAddr() string { return testenv.Getenv("ASYNCPLATFORM_REDIS_ADDR", "127.0.0.1:6379") }

// realRedis returns the address of the machine's Redis, or ends the test.
func realRedis(t testing.TB) string {
	t.Helper()
	addr := redisAddr()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Unreachable(t, "Redis at "+addr, err)
	}
	return addr
}
