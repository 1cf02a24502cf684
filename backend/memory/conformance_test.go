package memory_test

import (
	"context"
	"testing"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/driver"
)

type harness struct{ broker *memory.Broker }

func (h harness) MakeBackend(context.Context) (driver.Backend, error) { return h.broker.Connect(), nil }
func (h harness) Close()                                              {}

func TestConformance(t *testing.T) {
	conformance.Run(t, func(context.Context, *testing.T) (conformance.Harness, error) {
		return harness{memory.NewBroker()}, nil
	}, conformance.Options{
		SingleProcess: "the memory broker lives inside one process",
	})
}
