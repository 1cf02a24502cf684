package azure

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/driver"
)

type harness struct{ cs string }

func (h harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	return New(Config{ConnectionString: h.cs, ClientOptions: clientOptions(), DeadLease: 2 * time.Second})
}

func (harness) Close() {}

func TestConformance(t *testing.T) {
	cs := needAzurite(t)
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return harness{cs: cs}, nil
	}, conformance.Options{
		Lease: 2 * time.Second,
		Wait:  40 * time.Second,
		// Seen in this suite and in conformance/faults: two concurrent
		// dequeues on Azurite 3.37 can return the same message with the same
		// DequeueCount, which no client can prevent.
		DuplicatesWithoutFaults: "Azurite can hand one message to two concurrent dequeues (same DequeueCount)",
	})
}
