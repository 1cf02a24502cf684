package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	gonats "github.com/nats-io/nats.go"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// testStream keeps the tests' streams apart from a real deployment's.
const testStream = "ASYNCPLATFORM_TEST"

// realURL returns the machine's NATS server, or skips (fails under CI).
func realURL(t testing.TB) string {
	t.Helper()
	url := testenv.Getenv(URLEnv, DefaultURL)
	nc, err := gonats.Connect(url, gonats.Timeout(2*time.Second))
	if err != nil {
		testenv.Unreachable(t, "NATS at "+url, err)
	}
	nc.Close()
	return url
}

// startServer runs an in-process nats-server with JetStream and file storage
// in dir, on port (0: a random one), until the test ends or Shutdown.
func startServer(t testing.TB, dir string, port int) *natsserver.Server {
	t.Helper()
	if port == 0 {
		port = -1
	}
	s, err := natsserver.NewServer(&natsserver.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	})
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server: not ready in 10s")
	}
	t.Cleanup(s.Shutdown)
	return s
}

func testConfig(url string) Config {
	cfg := Config{URL: url, Stream: testStream, DeadHold: 2 * time.Second, PollWait: 2 * time.Second}
	if os.Getenv("NATS_TEST_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

// queueName derives a unique queue name from the test's name.
func queueName(t testing.TB) string {
	n := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '_'
	}, t.Name())
	if len(n) > 80 {
		n = n[len(n)-80:]
	}
	return fmt.Sprintf("%s.%06d", n, rand.IntN(1e6))
}

// newBackend opens a backend on url and removes queue when the test ends.
func newBackend(t testing.TB, url, queue string) *Backend {
	t.Helper()
	ctx := context.Background()
	b, err := New(ctx, testConfig(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.DeleteQueue(ctx, queue)
		_ = b.Close()
	})
	return b
}

// TestStaleReceipt checks the backend's own lease bookkeeping, which stands in
// for a check the server does not do: after a redelivery, the first
// delivery's ack, extension and requeue fail with ErrLeaseLost and leave the
// second delivery held.
func TestStaleReceipt(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"server":    func(t *testing.T) string { return realURL(t) },
		"inprocess": func(t *testing.T) string { return startServer(t, t.TempDir(), 0).ClientURL() },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			q := queueName(t)
			b := newBackend(t, url(t), q)
			if err := b.Enqueue(ctx, q, []driver.Message{{ID: q, Body: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
			lease := 300 * time.Millisecond
			first, err := b.Receive(ctx, q, 1, lease)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(lease) // the lease runs out
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			second, err := b.Receive(rctx, q, 1, lease)
			if err != nil {
				t.Fatal(err)
			}
			if got := second[0].Deliveries; got != 2 {
				t.Fatalf("second delivery counts %d, want 2", got)
			}
			if err := b.Ack(ctx, first[0]); !errors.Is(err, driver.ErrLeaseLost) {
				t.Fatalf("stale Ack: %v, want ErrLeaseLost", err)
			}
			if err := b.Extend(ctx, first[0], lease); !errors.Is(err, driver.ErrLeaseLost) {
				t.Fatalf("stale Extend: %v, want ErrLeaseLost", err)
			}
			if err := b.Requeue(ctx, first[0], driver.Message{ID: "a.1", Body: []byte("y")}); !errors.Is(err, driver.ErrLeaseLost) {
				t.Fatalf("stale Requeue: %v, want ErrLeaseLost", err)
			}
			if err := b.Ack(ctx, second[0]); err != nil {
				t.Fatalf("Ack of the live delivery: %v", err)
			}
		})
	}
}

// TestRawAckIsNotChecked records the broker fact the receipt bookkeeping
// exists for: the server acks whatever delivery of the sequence is current,
// so a stale ack subject acks the newer delivery.
func TestRawAckIsNotChecked(t *testing.T) {
	url := realURL(t)
	ctx := context.Background()
	q := queueName(t)
	b := newBackend(t, url, q)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: q, Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	lease := 200 * time.Millisecond
	first, err := b.Receive(ctx, q, 1, lease)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease)
	if _, err := b.Receive(ctx, q, 1, lease); err != nil {
		t.Fatal(err)
	}
	if _, err := b.nc.Request(first[0].Handle.(*receipt).reply, ackAck, 2*time.Second); err != nil {
		t.Fatalf("raw stale double ack: %v", err)
	}
	st, err := b.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after a stale raw ack: %+v (server %s)", st, b.nc.ConnectedServerVersion())
	if st.InFlight != 0 || st.Ready != 0 {
		t.Logf("the server refused the stale ack")
	}
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
