package rabbit

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// preemptingStore writes a forged base under each base key just before
// the backend creates it, for the first n such keys: another writer to the
// store got there first.
type preemptingStore struct {
	driver.Store
	mu sync.Mutex
	n  int
}

func (s *preemptingStore) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	s.mu.Lock()
	forge := strings.Contains(key, ":base/") && s.n > 0
	if forge {
		s.n--
	}
	s.mu.Unlock()
	if forge {
		if _, err := s.Store.Create(ctx, key, []byte("999"), ttl); err != nil {
			return "", err
		}
	}
	return s.Store.Create(ctx, key, value, ttl)
}

// A handed-back copy whose base key another writer took first is not
// handed out with its base uncounted: it gets a fresh instance whose key
// holds its base, so the delivery counts every try; a store that takes
// every instance's key fails the hand-back (the originals keep theirs).
func TestBindBasePreempted(t *testing.T) {
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
	copies := func() []outMsg {
		msgs := make([]outMsg, 3)
		for i := range msgs {
			msgs[i] = outMsg{key: "w", pub: amqp.Publishing{MessageId: "m", Headers: withInstance(amqp.Table{baseHeader: int64(i + 2)})}}
		}
		return msgs
	}
	ps := &preemptingStore{Store: st, n: 2}
	b := &Backend{cfg: Config{Store: ps, Prefix: DefaultPrefix, PublishTimeout: time.Minute}, log: slog.New(slog.DiscardHandler)}
	msgs := copies()
	if err := b.bindBases(context.Background(), msgs); err != nil {
		t.Fatalf("bindBases with two keys taken: %v", err)
	}
	ds := make([]amqp.Delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = amqp.Delivery{MessageId: m.pub.MessageId, Headers: m.pub.Headers}
	}
	for i, got := range b.basesEach(context.Background(), ds) {
		if want := i + 2; got != want {
			t.Errorf("copy %d counts base %d, want %d: its key was taken and its base lost", i, got, want)
		}
	}

	b.cfg.Store = &preemptingStore{Store: st, n: 1 << 20}
	if err := b.bindBases(context.Background(), copies()); !errors.Is(err, errBaseKeyTaken) {
		t.Errorf("bindBases with every key taken: %v, want errBaseKeyTaken", err)
	}
}
