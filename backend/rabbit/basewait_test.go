package rabbit

import (
	"context"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// stalledStore is a store whose reads wait for their context: a store
// that stopped answering without closing the connection.
type stalledStore struct{ driver.Store }

func (s stalledStore) Get(ctx context.Context, key string) ([]byte, string, error) {
	<-ctx.Done()
	return nil, "", ctx.Err()
}

// A delivery's count base is looked up within a bound: a stalled store
// must not hold up the Receive (and every delivery behind it) for good;
// the base is then not counted, as for any failed lookup.
func TestBaseLookupBounded(t *testing.T) {
	t.Parallel()
	m, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	st, err := driver.StoreOf(m)
	if err != nil {
		t.Fatal(err)
	}
	b := &Backend{cfg: Config{Store: stalledStore{st}, Prefix: DefaultPrefix, PublishTimeout: 100 * time.Millisecond}, log: slog.New(slog.DiscardHandler)}
	d := amqp.Delivery{Headers: amqp.Table{baseHeader: int64(3), instanceHeader: newInstance()}}
	done := make(chan []int, 1)
	go func() { done <- b.basesEach(context.Background(), []amqp.Delivery{d}) }()
	select {
	case got := <-done:
		if got[0] != 0 {
			t.Fatalf("base %d counted from a store that never answered", got[0])
		}
	case <-time.After(time.Minute):
		t.Fatal("the base lookup still waits for a stalled store after a minute (PublishTimeout 100ms)")
	}
}
