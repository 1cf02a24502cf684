package memory_test

import (
	"context"
	"testing"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
)

// storeOn opens connections to one broker: its store is shared by them.
func storeOn(br *memory.Broker) storetest.Maker {
	return func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		b, err := memory.New(ctx, memory.Config{Broker: br})
		if err != nil {
			return nil, err
		}
		tb.Cleanup(func() { b.Close() })
		return b, nil
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storeOn(memory.NewBroker()), storetest.Options{
		SingleProcess: "the memory broker lives inside one process",
		NoRestart: "the memory store has no server to restart: it lives in a memory.Broker inside " +
			"the process and ends with it, by contract (a new process starts empty); nothing " +
			"outlives a restart to check",
	})
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, storeOn(memory.NewBroker()))
}
