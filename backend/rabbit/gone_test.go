package rabbit

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestReplacedAckLost: a Requeue, DeadLetter or release whose ack is lost
// (the connection cut once the successor is stored) does not bring the
// replaced message back beside it: the gone mark in the companion store
// drops it. Without the marks the original came back counted
// (Deliveries 2) each time, and the job ran on in two lines of copies (the
// wrong tries of RandomFaults).
func TestReplacedAckLost(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	st := pgCompanion(t)
	for _, how := range []string{"Requeue", "DeadLetter", "Release"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			px := startProxy(t, u.Host)
			b := newBackend(t, Config{URL: px.url(t, testURL()), Store: st,
				ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
			ctx := longCtx(t)
			q := queueName(t, b)
			if err := b.Enqueue(ctx, q, []driver.Message{{ID: "orig", Body: []byte("orig")}}); err != nil {
				t.Fatal(err)
			}
			cut := px.cut
			var ds []*driver.Delivery
			if how != "Release" {
				if ds, err = b.Receive(ctx, q, 1, time.Minute); err != nil {
					t.Fatal(err)
				}
				b.beforeAck.Store(&cut)
			}
			switch how {
			case "Release":
				// A Receive whose ctx has ended starts the consumer and
				// releases it: the message it buffered is handed back as
				// a copy (the same body, Deliveries 1).
				b.beforeAck.Store(&cut)
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				_, err = b.Receive(cctx, q, 1, time.Minute)
			case "Requeue":
				err = b.Requeue(ctx, ds[0], driver.Message{ID: "copy", Body: []byte("copy")})
			case "DeadLetter":
				err = b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: "orig", Body: []byte("record")})
			}
			b.beforeAck.Store(nil)
			t.Logf("%s with its ack cut: %v", how, err)

			b2 := newBackend(t, Config{Store: st})
			copyBody := map[string]string{"Requeue": "copy", "Release": "orig"}[how] // "": no copy
			want := copyBody != ""
			seen := map[string]int{}
			for {
				// The first wait is long when a copy is due; then a few
				// seconds of quiet end it (the original, if it came back,
				// is ready at once: the cut returned it).
				wait := 5 * time.Second
				if want && seen[copyBody] == 0 {
					wait = time.Minute
				}
				rctx, cancel := context.WithTimeout(ctx, wait)
				got, _ := b2.Receive(rctx, q, 10, time.Minute)
				cancel()
				if len(got) == 0 {
					break
				}
				for _, d := range got {
					seen[string(d.Body)]++
					if string(d.Body) == "orig" && (how != "Release" || d.Deliveries > 1) {
						t.Errorf("the replaced message came back (Deliveries %d)", d.Deliveries)
					}
					if err := b2.Ack(ctx, d); err != nil {
						t.Fatal(err)
					}
				}
			}
			if want && seen[copyBody] != 1 {
				t.Errorf("the copy was delivered %d times, want 1", seen[copyBody])
			}
		})
	}
}

// TestInstanceOf: an instance is read only in the form this backend
// writes; anything else off the broker is none.
func TestInstanceOf(t *testing.T) {
	t.Parallel()
	good := newInstance()
	for _, c := range []struct {
		h    amqp.Table
		want string
	}{
		{amqp.Table{instanceHeader: good}, good},
		{nil, ""},
		{amqp.Table{instanceHeader: 42}, ""},
		{amqp.Table{instanceHeader: "short"}, ""},
		{amqp.Table{instanceHeader: "zz" + good[2:]}, ""},
		{amqp.Table{instanceHeader: "../" + good[3:]}, ""},
	} {
		if got := instanceOf(c.h); got != c.want {
			t.Errorf("instanceOf(%v) = %q, want %q", c.h, got, c.want)
		}
	}
}

// TestReplacingPendingWaits: a lookup that finds a going mark waits for
// the writer's outcome: gone drops the delivery, the going mark deleted
// hands it out. A first delivery is never looked up.
func TestReplacingPendingWaits(t *testing.T) {
	t.Parallel()
	st := pgCompanion(t)
	b := newBackend(t, Config{Store: st})
	ctx := testCtx(t)
	redelivered := func(inst string) amqp.Delivery {
		return amqp.Delivery{Headers: amqp.Table{instanceHeader: inst, "x-delivery-count": int64(1)}}
	}
	for _, stored := range []bool{true, false} {
		inst, other := newInstance(), newInstance()
		settle := b.replacing(ctx, inst)
		res := make(chan []bool)
		go func() { res <- b.replacedEach(ctx, []amqp.Delivery{redelivered(inst), redelivered(other)}) }()
		time.Sleep(3 * gonePoll) // the lookup finds the mark going (either way it must wait)
		settle(stored)
		if got := <-res; got[0] != stored || got[1] {
			t.Errorf("a going mark settled with stored=%v, beside an unmarked delivery: replaced = %v", stored, got)
		}
	}
	inst := newInstance()
	b.replacing(ctx, inst)(true)
	if got := b.replacedEach(ctx, []amqp.Delivery{{Headers: amqp.Table{instanceHeader: inst}}}); got[0] {
		t.Error("a first delivery was dropped")
	}
}

// BenchmarkRequeue measures one Receive and one Requeue of a job that goes
// straight back to its queue: without a Store (no gone marks, as every
// Requeue was before them) and with the PostgreSQL companion store (a
// pending write before the copy, a done write after the ack).
func BenchmarkRequeue(b *testing.B) {
	for _, store := range []bool{false, true} {
		b.Run(map[bool]string{false: "nostore", true: "store"}[store], func(b *testing.B) {
			cfg := Config{}
			if store {
				cfg.Store = pgCompanion(b)
			}
			be := newBackend(b, cfg)
			ctx := longCtx(b)
			q := queueName(b, be)
			if err := be.Enqueue(ctx, q, []driver.Message{{ID: "j", Body: []byte("j")}}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				ds, err := be.Receive(ctx, q, 1, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				if err := be.Requeue(ctx, ds[0], driver.Message{ID: fmt.Sprint("j-", i), Body: []byte("j")}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReleaseRedelivered measures one release of a consumer whose
// window of 20 holds messages that came back counted (their first consumer
// closed without settling them), as a suspect's isolation after a crash
// releases them: without a Store (no gone marks) and with the PostgreSQL
// companion store (a lookup of each, and a mark per hand-back).
func BenchmarkReleaseRedelivered(b *testing.B) {
	const n = 20
	for _, store := range []bool{false, true} {
		b.Run(map[bool]string{false: "nostore", true: "store"}[store], func(b *testing.B) {
			cfg := Config{Prefetch: n}
			if store {
				cfg.Store = pgCompanion(b)
			}
			be := newBackend(b, cfg)
			ctx := longCtx(b)
			q := queueName(b, be)
			var msgs []driver.Message
			for i := range n {
				msgs = append(msgs, driver.Message{ID: fmt.Sprint(i), Body: []byte(fmt.Sprint(i))})
			}
			if err := be.Enqueue(ctx, q, msgs); err != nil {
				b.Fatal(err)
			}
			var took time.Duration
			for range b.N {
				b.StopTimer()
				// A first consumer takes the window and dies: every message
				// comes back counted, to be looked up.
				first := newBackend(b, Config{Prefetch: n})
				got := 0
				for got < n {
					ds, err := first.Receive(ctx, q, n, time.Minute)
					if err != nil {
						b.Fatal(err)
					}
					got += len(ds)
				}
				first.Close()
				// The next fills its window, then is released.
				ds, err := be.Receive(ctx, q, 1, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				if err := be.Requeue(ctx, ds[0], driver.Message{ID: "0", Body: ds[0].Body}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				if err := be.Release(context.Background(), q); err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
			}
			b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "ms/release")
		})
	}
}

// TestGoingMarkLeftByCrash: a writer that dies between its going mark and
// the successor's write (here the Backend closed with the delivery held,
// its going mark written and never settled) leaves the message live: its
// redelivery is handed out, counted, once the lookup's wait for the
// writer (goneWait) is over; a going mark alone never drops a message.
func TestGoingMarkLeftByCrash(t *testing.T) {
	t.Parallel()
	st := pgCompanion(t)
	ctx := longCtx(t)
	b2 := newBackend(t, Config{Store: st})
	q := queueName(t, b2)
	b := newBackend(t, Config{Store: st})
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "live", Body: []byte("live")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	r := ds[0].Handle.(*receipt)
	if r.inst == "" {
		t.Fatal("the delivery carries no instance")
	}
	b.replacing(ctx, r.inst) // the going mark; the writer dies before its successor
	if err := b.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	got, err := b2.Receive(rctx, q, 1, time.Minute)
	if err != nil {
		t.Fatalf("the message whose replacement died after its going mark: %v; want it handed out", err)
	}
	if string(got[0].Body) != "live" || got[0].Deliveries != 2 {
		t.Errorf("got %q (Deliveries %d); want live, Deliveries 2", got[0].Body, got[0].Deliveries)
	}
	if err := b2.Ack(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
}
