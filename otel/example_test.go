package otel_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	apotel "github.com/asyncplatform/asyncplatform/otel"
)

// A worker exposing its metrics to Prometheus on /metrics.
func Example_prometheus() {
	ctx := context.Background()

	// The OpenTelemetry SDK with a Prometheus exporter. An application would
	// use prometheus.DefaultRegisterer and promhttp.Handler().
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		panic(err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer provider.Shutdown(ctx)

	done := make(chan struct{}, 3)
	cfg := ap.Config{
		Queues: map[string]ap.QueueConfig{"emails": {}},
		Policy: ap.Policy{RetryLimit: ap.Limit(0)},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks:  ap.Hooks{AfterAttempt: func(context.Context, ap.Attempt) { done <- struct{}{} }},
	}
	// Tracing uses the global tracer provider here; metrics go to Prometheus.
	metrics, err := apotel.Instrument(&cfg, apotel.Config{MeterProvider: provider})
	if err != nil {
		panic(err)
	}
	backend := memory.NewBroker().Connect()
	defer backend.Close()
	p, err := ap.New(backend, cfg)
	if err != nil {
		panic(err)
	}
	p.Handle("email.send", func(_ context.Context, j *ap.Job) error {
		if string(j.Payload) == "nobody" {
			return errors.New("no such mailbox")
		}
		return nil
	})
	gauges, err := metrics.ObserveQueues(p, "emails")
	if err != nil {
		panic(err)
	}
	defer gauges.Unregister()
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	for _, to := range []string{"ann", "bob", "nobody"} {
		p.Enqueue(ctx, &ap.Job{Type: "email.send", Queue: "emails", Payload: []byte(to)})
	}
	for range 3 {
		<-done
	}
	p.Stop(ctx)

	// Scrape /metrics as Prometheus would.
	srv := httptest.NewServer(promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		line := lines.Text()
		if strings.HasPrefix(line, "asyncplatform_attempts_total") || strings.HasPrefix(line, "asyncplatform_dead_letters_total") ||
			strings.HasPrefix(line, "asyncplatform_queue_dead{") || strings.HasPrefix(line, "asyncplatform_queue_depth{") {
			fmt.Println(line)
		}
	}
	// Unordered output:
	// asyncplatform_attempts_total{asyncplatform_job_type="email.send",asyncplatform_outcome="succeeded",asyncplatform_queue="emails"} 2
	// asyncplatform_attempts_total{asyncplatform_job_type="email.send",asyncplatform_outcome="dead_lettered",asyncplatform_queue="emails",asyncplatform_reason="retries_exceeded"} 1
	// asyncplatform_dead_letters_total{asyncplatform_job_type="email.send",asyncplatform_queue="emails",asyncplatform_reason="retries_exceeded"} 1
	// asyncplatform_queue_dead{asyncplatform_queue="emails"} 1
	// asyncplatform_queue_depth{asyncplatform_queue="emails",asyncplatform_state="in_flight"} 0
	// asyncplatform_queue_depth{asyncplatform_queue="emails",asyncplatform_state="ready"} 0
	// asyncplatform_queue_depth{asyncplatform_queue="emails",asyncplatform_state="scheduled"} 0
}
