package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/conformance/faults"
	"github.com/asyncplatform/asyncplatform/driver"
)

type harness struct{ broker *memory.Broker }

func (h harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	// Holds that lapse unless renewed, so the suite sees the platform renew
	// them (DeadLetter/HeldForSlowCallback).
	return memory.New(ctx, memory.Config{Broker: h.broker, DeadHold: time.Second})
}
func (h harness) Close() {}

func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, func(context.Context, *testing.T) (conformance.Harness, error) {
		return harness{memory.NewBroker()}, nil
	}, conformance.Options{
		SingleProcess: "the memory broker lives inside one process",
	})
}

// TestFaults runs the fault suite on one broker in this process: workers
// are goroutines, a crash is a closed connection.
func TestFaults(t *testing.T) {
	t.Parallel()
	broker := memory.NewBroker()
	faults.Run(t, faults.Target{
		Name:      "memory",
		Lease:     500 * time.Millisecond,
		InProcess: "the memory broker lives in the test process: workers are goroutines, a crash is a closed connection",
		Open: func(ctx context.Context, _ string) (driver.Backend, error) {
			return memory.New(ctx, memory.Config{Broker: broker})
		},
		Garbage: func(ctx context.Context, _, queue string, raw []byte) error {
			b := broker.Connect() // the driver is the memory broker's own client
			defer b.Close()
			return b.Enqueue(ctx, queue, []driver.Message{{ID: "garbage", Body: raw}})
		},
	})
}
