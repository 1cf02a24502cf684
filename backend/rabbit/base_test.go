package rabbit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// baseLog is a slog.Handler that keeps the *BaseError of every record.
type baseLog struct {
	mu   sync.Mutex
	errs []*BaseError
}

func (h *baseLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *baseLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *baseLog) WithGroup(string) slog.Handler            { return h }
func (h *baseLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok {
			var be *BaseError
			if errors.As(err, &be) {
				h.mu.Lock()
				h.errs = append(h.errs, be)
				h.mu.Unlock()
			}
		}
		return true
	})
	return nil
}

func (h *baseLog) refused() []*BaseError {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*BaseError(nil), h.errs...)
}

// publishRaw publishes headers and body straight to q's work queue, as
// any writer to the broker can.
func publishRaw(t *testing.T, b *Backend, q, id string, headers amqp.Table) {
	t.Helper()
	ch := amqpChannel(t, testURL())
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", b.workName(q), true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, MessageId: id, Headers: headers, Body: []byte(id)})
	if err != nil {
		t.Fatal(err)
	}
	if !dc.Wait() {
		t.Fatal("not confirmed")
	}
}

// TestForgedBaseNotCounted: a message written straight to the work queue
// with a count base (x-asyncplatform-base) is handed out counting that
// base only when a hand-back of this backend bound it (with a store) or
// it is within maxBase (without one); otherwise Deliveries is 1 and the
// refusal is logged as a *BaseError naming the message.
func TestForgedBaseNotCounted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		store bool
		base  int64
		want  int
	}{
		{"StoreForged", true, 1000, 1},
		{"StoreForgedSmall", true, 3, 1},
		{"NoStoreLarge", false, 1000, 1},
		{"NoStoreWithinBound", false, maxBase, maxBase + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			log := &baseLog{}
			cfg := Config{Logger: slog.New(log)}
			if c.store {
				cfg.Store = pgCompanion(t)
			}
			b := newBackend(t, cfg)
			ctx := testCtx(t)
			q := queueName(t, b)
			if err := b.Declare(ctx, q); err != nil {
				t.Fatal(err)
			}
			publishRaw(t, b, q, "forged", amqp.Table{baseHeader: c.base, instanceHeader: newInstance()})
			ds, err := b.Receive(ctx, q, 1, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if ds[0].Deliveries != c.want {
				t.Errorf("a message with base %d written by another writer: Deliveries %d, want %d", c.base, ds[0].Deliveries, c.want)
			}
			refused := log.refused()
			if c.want == 1 && (len(refused) != 1 || refused[0].ID != "forged" || refused[0].Base != c.base) {
				t.Errorf("refusals logged %+v, want one *BaseError naming message forged and base %d", refused, c.base)
			}
			if c.want > 1 && len(refused) > 0 {
				t.Errorf("refusals logged %+v, want none", refused)
			}
		})
	}
}

// TestHandBackBaseKept: a message that went back to the queue counted
// (its channel closed), then sat in a consumer's buffer and was handed
// back, keeps its count: with a store, its copy's base is bound and
// counted.
func TestHandBackBaseKept(t *testing.T) {
	t.Parallel()
	log := &baseLog{}
	st := pgCompanion(t)
	b := newBackend(t, Config{Prefetch: 2, Store: st, Logger: slog.New(log)})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "a", Body: []byte("a")}, {ID: "b", Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	// Take both and drop them with a closed channel: each comes back with
	// one delivery counted.
	conn, err := amqp.Dial(testURL())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < 2; {
		if _, ok, err := ch.Get(b.workName(q), false); err != nil {
			t.Fatal(err)
		} else if ok {
			n++
		}
	}
	conn.Close()
	// One handed out, the other buffered, then handed back by a release.
	held, err := b.Receive(ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	b.Receive(cctx, q, 2, time.Minute)
	b2 := newBackend(t, Config{Store: st, Logger: slog.New(log)})
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	ds, err := b2.Receive(rctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("%s:%d", ds[0].Body, ds[0].Deliveries)
	want := fmt.Sprintf("%s:2", ds[0].Body)
	if string(ds[0].Body) == string(held[0].Body) || got != want {
		t.Errorf("the handed-back copy came out as %s (held: %s), want the other message with Deliveries 2 (its counted return kept)", got, held[0].Body)
	}
	if r := log.refused(); len(r) > 0 {
		t.Errorf("the base of a hand-back was refused: %v", r[0])
	}
}
