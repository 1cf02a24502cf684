package otel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace/noop"

	ap "github.com/asyncplatform/asyncplatform"
	apotel "github.com/asyncplatform/asyncplatform/otel"
)

// The history gauge reports the attempts of the platform's history (every
// worker's, from the store) by queue, job type and outcome; the ready-age
// gauge how long the oldest ready job of a queue has waited, 0 with none
// ready.
func TestMetricsHistoryAndReadyAge(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	attempts := make(chan ap.Attempt, 10)
	cfg := ap.Config{
		Queues: map[string]ap.QueueConfig{"h": {}},
		Hooks:  ap.Hooks{AfterAttempt: func(_ context.Context, a ap.Attempt) { attempts <- a }},
	}
	m, err := apotel.Instrument(&cfg, apotel.Config{MeterProvider: mp, TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, cfg, map[string]ap.Handler{
		"ok": func(context.Context, *ap.Job) error { return nil },
		"flaky": func(_ context.Context, j *ap.Job) error {
			if j.TryCount == 1 {
				return errors.New("try again")
			}
			return nil
		},
		"bad": func(context.Context, *ap.Job) error { return ap.Invalid(errors.New("not JSON")) },
	})
	ctx := context.Background()
	for _, typ := range []string{"ok", "flaky", "bad"} {
		if err := p.Enqueue(ctx, &ap.Job{Type: typ, Queue: "h"}); err != nil {
			t.Fatal(err)
		}
	}
	wait(t, attempts, 4) // ok, flaky ×2, bad
	// No worker serves "waiting": its jobs stay ready.
	enqueued := time.Now()
	for range 2 {
		if err := p.Enqueue(ctx, &ap.Job{Type: "ok", Queue: "waiting"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Stop(ctx); err != nil { // writes this worker's history
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	regQ, err := m.ObserveQueues(p, "h", "waiting")
	if err != nil {
		t.Fatal(err)
	}
	defer regQ.Unregister()
	regH, err := m.ObserveHistory(p)
	if err != nil {
		t.Fatal(err)
	}
	defer regH.Unregister()

	data := collect(t, reader)
	ages := values(t, data["asyncplatform.queue.ready.oldest_age"])
	if got, ok := ages["asyncplatform.queue=h"]; !ok || got != 0 {
		t.Errorf("ready.oldest_age{h} = %v (present %v), want 0: none ready; all: %v", got, ok, ages)
	}
	waited := time.Since(enqueued).Seconds()
	if got, ok := ages["asyncplatform.queue=waiting"]; !ok || got < 0.02 || got > waited {
		t.Errorf("ready.oldest_age{waiting} = %v (present %v), want between 0.02 and %v: two jobs enqueued then, none taken; all: %v", got, ok, waited, ages)
	}
	hist := values(t, data["asyncplatform.history.attempts"])
	const q = ",asyncplatform.queue=h"
	want := points{
		"asyncplatform.job.type=ok,asyncplatform.outcome=succeeded" + q:        1,
		"asyncplatform.job.type=ok,asyncplatform.outcome=failed" + q:           0,
		"asyncplatform.job.type=flaky,asyncplatform.outcome=failed" + q:        1,
		"asyncplatform.job.type=flaky,asyncplatform.outcome=succeeded" + q:     1,
		"asyncplatform.job.type=bad,asyncplatform.outcome=dead_lettered" + q:   1,
		"asyncplatform.job.type=bad,asyncplatform.outcome=succeeded" + q:       0,
		"asyncplatform.job.type=flaky,asyncplatform.outcome=dead_lettered" + q: 0,
	}
	for k, w := range want {
		if got, ok := hist[k]; !ok || got != w {
			t.Errorf("history.attempts{%s} = %v (present %v), want %v; all: %v", k, got, ok, w, hist)
		}
	}
	if len(hist) != 9 {
		t.Errorf("history.attempts has %d series, want 9 (3 types × 3 outcomes): %v", len(hist), hist)
	}
}
