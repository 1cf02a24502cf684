package otel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"

	ap "github.com/asyncplatform/asyncplatform"
	apotel "github.com/asyncplatform/asyncplatform/otel"
)

// typeLabels returns the distinct job type labels of a metric.
func typeLabels(t *testing.T, data metricdata.Aggregation) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for k := range values(t, data) {
		for _, kv := range strings.Split(strings.TrimPrefix(k, "sum:"), ",") {
			if v, ok := strings.CutPrefix(kv, "asyncplatform.job.type="); ok {
				out[v] = true
			}
		}
	}
	return out
}

// TestJobTypeLabelsBounded: a flood of forged job types makes no more than
// MaxJobTypes series (then "other"); registered types keep their name.
func TestJobTypeLabelsBounded(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	attempts := make(chan ap.Attempt, 10)
	dead := make(chan ap.DeadLetter, 2000)
	cfg := ap.Config{
		UnhandledRetries: ap.Limit(0),
		Hooks: ap.Hooks{
			AfterAttempt: func(_ context.Context, a ap.Attempt) { attempts <- a },
			OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl },
		},
	}
	if _, err := apotel.Instrument(&cfg, apotel.Config{MeterProvider: mp, TracerProvider: noop.NewTracerProvider(), MaxJobTypes: 10}); err != nil {
		t.Fatal(err)
	}
	p := start(t, cfg, map[string]ap.Handler{
		"registered": func(context.Context, *ap.Job) error { return ap.Invalid(errors.New("no")) },
	})
	ctx := context.Background()
	const forged = 200
	for i := range forged {
		if err := p.Enqueue(ctx, &ap.Job{Type: fmt.Sprintf("forged-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	wait(t, dead, forged)
	if err := p.Enqueue(ctx, &ap.Job{Type: "registered"}); err != nil {
		t.Fatal(err)
	}
	wait(t, attempts, 1)
	wait(t, dead, 1)

	data := collect(t, reader)
	got := typeLabels(t, data["asyncplatform.dead_letters"])
	if !got["registered"] || !got[apotel.OtherJobType] || len(got) != 10+2 {
		t.Errorf("dead_letters job type labels: %d (%v); want 10 forged ones, %q and %q", len(got), got, apotel.OtherJobType, "registered")
	}
	if got := typeLabels(t, data["asyncplatform.attempts"]); len(got) != 1 || !got["registered"] {
		t.Errorf("attempts job type labels: %v", got)
	}
	var total float64
	for _, v := range values(t, data["asyncplatform.dead_letters"]) {
		total += v
	}
	if total != forged+1 {
		t.Errorf("%v dead letters counted, want %d", total, forged+1)
	}
}

// Declared types are labeled by name; with a negative MaxJobTypes no other
// type is, nor one that is no fit label (too long, a control character).
func TestJobTypeLabelsDeclared(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	m, err := apotel.NewMetrics(apotel.Config{MeterProvider: mp, JobTypes: []string{"email.send"}, MaxJobTypes: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, typ := range []string{"email.send", "forged", strings.Repeat("x", 101)} {
		m.OnDeadLetter(ctx, ap.DeadLetter{Queue: "q", Reason: ap.ReasonUnhandled, Job: ap.Job{Type: typ}})
	}
	got := typeLabels(t, collect(t, reader)["asyncplatform.dead_letters"])
	if len(got) != 2 || !got["email.send"] || !got[apotel.OtherJobType] {
		t.Errorf("labels %v, want email.send and other", got)
	}

	reader = sdkmetric.NewManualReader()
	m, err = apotel.NewMetrics(apotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"fine", strings.Repeat("x", 101), "esc\x1b[2J", "\xff"} {
		m.OnDeadLetter(ctx, ap.DeadLetter{Queue: "q", Reason: ap.ReasonUnhandled, Job: ap.Job{Type: typ}})
	}
	got = typeLabels(t, collect(t, reader)["asyncplatform.dead_letters"])
	if len(got) != 2 || !got["fine"] || !got[apotel.OtherJobType] {
		t.Errorf("labels %v, want fine and other", got)
	}
}
