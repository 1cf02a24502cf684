package conformance_test

import (
	"context"
	"testing"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/driver"
)

// harness opens connections to one broker. A backend for a networked broker
// keeps the broker's address here and dials it in MakeBackend; the memory
// backend's "server" is a Broker value that its connections share.
type harness struct{ broker *memory.Broker }

// MakeBackend opens a new, independent connection, as another worker
// process would.
func (h harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	return memory.New(ctx, memory.Config{Broker: h.broker})
}

// Close releases what the harness holds; the suite has closed every
// backend it made by then.
func (h harness) Close() {}

// testConformance is, in a backend's own conformance_test.go, the test
// function TestConformance(t *testing.T).
func testConformance(t *testing.T) {
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return harness{broker: memory.NewBroker()}, nil // a fresh broker for every case
	}, conformance.Options{
		SingleProcess: "the memory broker lives inside one process",
	})
}

// This file is a backend's conformance test, complete: a Harness and the
// test function that runs the suite with it. Run needs the *testing.T of a
// running test, so the example only compiles it; `go test -run
// TestConformance ./backend/memory` runs the same suite.
func ExampleRun() {
	_ = testConformance
}
