package nats

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/internal/queuetest"
)

// TestQueues lists the queues of streams of the test's own on the real
// server, and never a subject or consumer that is not a queue's.
func TestQueues(t *testing.T) {
	t.Parallel()
	url := realURL(t)
	ctx := context.Background()
	cfg := testConfig(url)
	cfg.Stream = fmt.Sprintf("APQUEUES_%06d", rand.IntN(1e6))
	b, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := gonats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		for _, s := range []string{b.cfg.Stream, b.delayName(), b.deadName(), b.cfg.Stream + "_CLAIM"} {
			_ = js.DeleteStream(context.Background(), s)
		}
	})
	queuetest.Run(t, b, queuetest.Options{DeclareLeavesNoTrace: "the streams are shared and Declare makes nothing"})

	// Messages and consumers of the work stream that are not a queue's.
	for _, subj := range []string{cfg.Stream + ".q.bad_x", cfg.Stream + ".q.a_"} {
		if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.work.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "other", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	got, err := b.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{queuetest.Jobs}; !slices.Equal(got, want) {
		t.Fatalf("Queues = %q, want %q", got, want)
	}
}

func TestUntoken(t *testing.T) {
	t.Parallel()
	for _, q := range []string{"a", "a.b", "a_b", "_._", "__", "..", "x_d", strings.Repeat("_.", 50)} {
		if got, ok := untoken(token(q)); !ok || got != q {
			t.Errorf("untoken(token(%q)) = %q, %v", q, got, ok)
		}
	}
	for _, tok := range []string{"", "a_", "a_x", "_"} {
		if got, ok := untoken(tok); ok {
			t.Errorf("untoken(%q) = %q, want not a token", tok, got)
		}
	}
}
