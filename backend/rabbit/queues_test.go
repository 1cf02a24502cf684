package rabbit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/internal/queuetest"
)

// TestQueues lists the queues of a prefix of the test's own on the real
// broker, from the registry, which a listing compacts.
func TestQueues(t *testing.T) {
	t.Parallel()
	var r [4]byte
	_, _ = rand.Read(r[:])
	prefix := "qt" + hex.EncodeToString(r[:])
	b := newBackend(t, Config{Prefix: prefix})
	t.Cleanup(func() {
		_ = b.withChannel(context.Background(), func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(b.registryName(), false, false, false)
			return err
		})
	})
	queuetest.Run(t, b, queuetest.Options{})
	ctx := testCtx(t)

	// Declares by other Backends (other processes) add duplicates, and
	// garbage may be written to the registry: a listing keeps one message
	// per live queue.
	for range 3 {
		other := newBackend(t, Config{Prefix: prefix})
		if err := other.Declare(ctx, queuetest.Jobs); err != nil {
			t.Fatal(err)
		}
		other.Close()
	}
	err := b.publish(ctx, outMsg{key: b.registryName(), pub: amqp.Publishing{MessageId: "garbage", Body: []byte("bad/name\x1b")}})
	if err != nil {
		t.Fatal(err)
	}
	if n := registrySize(t, b); n != 5 {
		t.Fatalf("registry holds %d messages, want 5 (one, three more declares and the garbage)", n)
	}
	got, err := b.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{queuetest.Jobs}; !slices.Equal(got, want) {
		t.Fatalf("Queues = %q, want %q", got, want)
	}
	if n := registrySize(t, b); n != 1 {
		t.Fatalf("after a listing the registry holds %d messages, want 1", n)
	}

	// Listings of several processes at once take turns and all see every
	// queue.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		lister := b
		if i%2 == 1 {
			lister = newBackend(t, Config{Prefix: prefix})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				got, err := lister.Queues(ctx)
				if err == nil && !slices.Equal(got, []string{queuetest.Jobs}) {
					err = fmt.Errorf("Queues = %q during concurrent listings", got)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := b.DeleteQueue(ctx, queuetest.Jobs); err != nil {
		t.Fatal(err)
	}
}

// Declares compact the registry once it has grown to registryCompactAt
// messages, so that it stays small where nobody lists queues.
func TestRegistryCompacts(t *testing.T) {
	t.Parallel()
	var r [4]byte
	_, _ = rand.Read(r[:])
	prefix := "qc" + hex.EncodeToString(r[:])
	b := newBackend(t, Config{Prefix: prefix})
	t.Cleanup(func() {
		_ = b.withChannel(context.Background(), func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(b.registryName(), false, false, false)
			return err
		})
	})
	ctx := testCtx(t)
	q := queueName(t, b)
	old := registryCompactAt.Swap(5)
	t.Cleanup(func() { registryCompactAt.Store(old) })
	for i := range 12 {
		// Another Backend each time: a producer process's first Declare.
		other := newBackend(t, Config{Prefix: prefix})
		if err := other.Declare(ctx, q); err != nil {
			t.Fatal(err)
		}
		other.Close()
		if n := registrySize(t, b); n >= 5 {
			t.Fatalf("after %d declares the registry holds %d messages: a declare at 5 compacts it", i+1, n)
		}
	}
	got, err := b.Queues(ctx)
	if err != nil || !slices.Equal(got, []string{q}) {
		t.Fatalf("Queues = %q, %v", got, err)
	}
}

// registrySize is the number of ready messages in the registry.
func registrySize(t *testing.T, b *Backend) int {
	t.Helper()
	var n int
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := b.withChannel(context.Background(), func(ch *amqp.Channel) error {
			q, err := ch.QueueDeclarePassive(b.registryName(), true, false, false, false, nil)
			n = q.Messages
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond) // a requeue may still be on its way
	}
}
