package rabbit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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

// TestRegistryUpgrade: the names in the classic registry of the older
// layout (p:queues), written before the upgrade and by an older version
// still running after it, are moved into the quorum registry by Queues,
// each listed, none lost.
func TestRegistryUpgrade(t *testing.T) {
	t.Parallel()
	var r [4]byte
	_, _ = rand.Read(r[:])
	prefix := "qu" + hex.EncodeToString(r[:])
	b := newBackend(t, Config{Prefix: prefix})
	ctx := testCtx(t)
	t.Cleanup(func() {
		_ = b.withChannel(context.Background(), func(ch *amqp.Channel) error {
			for _, q := range []string{b.registryName(), b.legacyRegistryName()} {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					return err
				}
			}
			return nil
		})
	})
	// An older version: its work queues, and its registry holding their
	// names (one twice).
	old := []string{"old-a", "old-b", "old-c"}
	oldDeclare := func(names ...string) {
		t.Helper()
		err := b.withChannel(ctx, func(ch *amqp.Channel) error {
			if _, err := ch.QueueDeclare(b.legacyRegistryName(), true, false, false, false, nil); err != nil {
				return err
			}
			for _, q := range names {
				if err := declareQueue(ch, b.workName(q), workArgs()); err != nil {
					return err
				}
				if err := ch.PublishWithContext(ctx, "", b.legacyRegistryName(), true, false, amqp.Publishing{Body: []byte(q)}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, q := range append(old, "old-d") {
			_ = b.DeleteQueue(context.Background(), q)
		}
	})
	oldDeclare(append(old, old[0])...)
	if err := b.Declare(ctx, "new-a"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.DeleteQueue(context.Background(), "new-a") })
	want := []string{"new-a", "old-a", "old-b", "old-c"}
	for i := range 2 {
		got, err := b.Queues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("listing %d: Queues = %q, want %q", i, got, want)
		}
		if n := legacySize(t, b); n != 0 {
			t.Fatalf("listing %d: the older registry holds %d messages, want 0 (moved)", i, n)
		}
		if n := registrySize(t, b); n != len(want) {
			t.Fatalf("listing %d: the registry holds %d messages, want %d", i, n, len(want))
		}
	}
	// The registry is a quorum queue, replicated on a cluster: declaring
	// it classic is refused.
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		return declareQueue(ch, b.registryName(), amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic})
	})
	if !errors.Is(err, ErrIncompatibleQueue) {
		t.Fatalf("declaring the registry classic: %v, want ErrIncompatibleQueue (it is a quorum queue)", err)
	}
	// An older version still running registers another queue.
	oldDeclare("old-d")
	want = []string{"new-a", "old-a", "old-b", "old-c", "old-d"}
	if got, err := b.Queues(ctx); err != nil || !slices.Equal(got, want) {
		t.Fatalf("after an older version's declare: Queues = %q, %v; want %q", got, err, want)
	}
	if n := legacySize(t, b); n != 0 {
		t.Fatalf("the older registry holds %d messages, want 0 (moved)", n)
	}
}

// legacySize is the number of messages in the older layout's registry.
func legacySize(t *testing.T, b *Backend) int {
	t.Helper()
	var n int
	err := b.withChannel(context.Background(), func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(b.legacyRegistryName(), true, false, false, false, nil)
		n = q.Messages
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDeclareFailsUnregistered: a Declare that cannot write its registry
// entry fails, and a later one registers the queue. Before, it logged a
// warning and returned nil, and the Backend never registered the queue
// again: on a loaded cluster a paused group's held queue at a priority
// level went unlisted that way (a Park's one-second Declare), and
// ResumeGroup, which finds such a queue by the listing, left its jobs held
// (Flow/PauseGroupSignedLevels: 1 of 2 moved back). Here the registry
// refuses every entry (a queue of at most 0 messages, reject-publish).
func TestDeclareFailsUnregistered(t *testing.T) {
	t.Parallel()
	var r [4]byte
	_, _ = rand.Read(r[:])
	prefix := "du" + hex.EncodeToString(r[:])
	b := newBackend(t, Config{Prefix: prefix})
	ctx := testCtx(t)
	dropRegistry := func() error {
		return b.withChannel(context.Background(), func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(b.registryName(), false, false, false)
			return err
		})
	}
	t.Cleanup(func() { _ = dropRegistry() })
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(b.registryName(), true, false, false, false, amqp.Table{
			amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-max-length": 0, "x-overflow": "reject-publish"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err == nil {
		t.Fatalf("Declare of %s returned nil, but its registry entry was refused: Queues will not list it", q)
	} else {
		t.Logf("Declare: %v", err)
	}
	if err := dropRegistry(); err != nil {
		t.Fatal(err)
	}
	if err := b.Declare(ctx, q); err != nil {
		t.Fatalf("Declare once the registry takes entries: %v", err)
	}
	names, err := b.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, q) {
		t.Errorf("Queues lists %v, not %s", names, q)
	}
}
