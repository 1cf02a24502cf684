package rabbit

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// harness opens backends on the machine's broker, each through a loopback
// proxy of its own so that Disconnect can cut its connection as the network
// would. Every backend sees the same queues; a test closes one to play a
// dead worker.
type harness struct {
	url *url.URL
	log *slog.Logger

	mu      sync.Mutex
	proxies map[driver.Backend]*proxy
}

var _ conformance.Disconnecter = (*harness)(nil)

func (h *harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	px, err := newProxy(h.url.Host)
	if err != nil {
		return nil, err
	}
	b, err := New(ctx, Config{
		URL:          px.rewrite(h.url),
		Logger:       h.log,
		ReconnectMin: 10 * time.Millisecond,
		ReconnectMax: 200 * time.Millisecond,
	})
	if err != nil {
		px.close()
		return nil, err
	}
	h.mu.Lock()
	h.proxies[b] = px
	h.mu.Unlock()
	return b, nil
}

// Disconnect cuts the backend's connection; it reconnects by itself.
func (h *harness) Disconnect(ctx context.Context, b driver.Backend) error {
	h.mu.Lock()
	px := h.proxies[b]
	h.mu.Unlock()
	if px == nil {
		return errors.New("rabbit harness: Disconnect of a backend this harness did not make")
	}
	px.cut()
	return nil
}

// Close closes the proxies; the suite has closed the backends by then.
func (h *harness) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, px := range h.proxies {
		px.close()
	}
	h.proxies = nil
}

func TestConformance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	probe, err := New(ctx, Config{URL: testURL()})
	cancel()
	if err != nil {
		testenv.Unreachable(t, "RabbitMQ at "+redact(testURL()), err)
	}
	probe.Close()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return &harness{
			url:     u,
			log:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
			proxies: map[driver.Backend]*proxy{},
		}, nil
	}, conformance.Options{})
}
