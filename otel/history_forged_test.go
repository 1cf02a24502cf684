package otel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace/noop"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	apotel "github.com/asyncplatform/asyncplatform/otel"
)

// The history gauge's queue labels are bounded as type labels are: a
// store forged to hold a minute of 150 queues yields the configured
// queue by name, the first MaxQueues others by name, and every other
// queue's attempts under OtherQueue.
func TestHistoryQueueLabelsBounded(t *testing.T) {
	t.Parallel()
	b := memory.NewBroker().Connect()
	t.Cleanup(func() { b.Close() })
	st, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	type series struct {
		Q  string `json:"q"`
		T  string `json:"t"`
		OK int64  `json:"ok"`
	}
	ss := []series{{Q: "h", T: "ok", OK: 7}}
	for i := range 150 {
		ss = append(ss, series{Q: fmt.Sprintf("forged-%03d", i), T: "ok", OK: 1})
	}
	v, err := json.Marshal(map[string]any{"s": ss})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	minute := time.Now().Unix() / 60
	if _, err := kv.Of(st, kv.History).Create(ctx, fmt.Sprintf("m/%012d", minute), v, time.Hour); err != nil {
		t.Fatal(err)
	}

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := ap.Config{Queues: map[string]ap.QueueConfig{"h": {}}}
	const maxQueues = 5
	m, err := apotel.Instrument(&cfg, apotel.Config{MeterProvider: mp, TracerProvider: noop.NewTracerProvider(), JobTypes: []string{"ok"}, MaxQueues: maxQueues})
	if err != nil {
		t.Fatal(err)
	}
	p, err := ap.New(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := m.ObserveHistory(p)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	hist := values(t, collect(t, reader)["asyncplatform.history.attempts"])
	queues := map[string]float64{}
	for k, n := range hist {
		if !strings.Contains(k, "asyncplatform.outcome=succeeded") {
			continue
		}
		for _, a := range strings.Split(k, ",") {
			if q, ok := strings.CutPrefix(a, "asyncplatform.queue="); ok {
				queues[q] += n
			}
		}
	}
	if len(queues) != maxQueues+2 {
		t.Errorf("%d queue labels, want %d (h, %d others by name, %s): %v", len(queues), maxQueues+2, maxQueues, apotel.OtherQueue, queues)
	}
	if queues["h"] != 7 {
		t.Errorf("queue h: %v attempts, want 7 (a configured queue is labeled by name): %v", queues["h"], queues)
	}
	if got, want := queues[apotel.OtherQueue], float64(150-maxQueues); got != want {
		t.Errorf("queue %s: %v attempts, want %v", apotel.OtherQueue, got, want)
	}
}
