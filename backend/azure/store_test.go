package azure

import (
	"context"
	"testing"

	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
)

// storeConfig points the store tests' backends at their own container.
func storeConfig(tb testing.TB) Config {
	return testConfig(tb, Config{Prefix: "apstore"})
}

// storeMaker opens each store on clients of its own, as a separate process
// would.
func storeMaker(ctx context.Context, tb testing.TB) (driver.Store, error) {
	b, err := New(ctx, storeConfig(tb))
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { b.Close() })
	return b, nil
}

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storeMaker, storetest.Options{
		NoRestart: "Azurite keeps its data in memory here (--inMemoryPersistence) and saves to disk only every few seconds otherwise: no oracle for durability; Blob Storage's own is the service's",
	})
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, storeMaker)
}
