package otel_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	ap "github.com/asyncplatform/asyncplatform"
	apotel "github.com/asyncplatform/asyncplatform/otel"
)

// An attempt of a suspect run alone (Attempt.Isolated) is counted in
// asyncplatform.attempts.isolated; an ordinary one is not.
func TestIsolatedAttemptsCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	m, err := apotel.NewMetrics(apotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	j := &ap.Job{Type: "t", Queue: "q", TryCount: 2, Crashes: 1}
	m.AfterAttempt(ctx, ap.Attempt{Job: j, Outcome: ap.OutcomeSucceeded, Isolated: true})
	m.AfterAttempt(ctx, ap.Attempt{Job: j, Outcome: ap.OutcomeSucceeded})
	sum, ok := collect(t, reader)["asyncplatform.attempts.isolated"].(metricdata.Sum[int64])
	if !ok || len(sum.DataPoints) != 1 || sum.DataPoints[0].Value != 1 {
		t.Errorf("asyncplatform.attempts.isolated: %+v, want one point of 1", sum)
	}
}
