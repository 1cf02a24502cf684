package azure

import (
	"context"
	"regexp"
	"testing"
	"time"

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
	return storeOn(storeConfig(tb))(ctx, tb)
}

// storeOn opens each store with cfg on clients of its own.
func storeOn(cfg Config) storetest.Maker {
	return func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		b, err := New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		tb.Cleanup(func() { b.Close() })
		return b, nil
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storeMaker, storetest.Options{Restart: restartableAzurite})
}

// restartableAzurite runs an Azurite of the test's own that keeps its data
// in a directory (--location, not the package's --inMemoryPersistence),
// for Durability/Restart, and restarts it gracefully (SIGTERM), the way
// the fault suite's BrokerRestart does. Azurite keeps blobs' metadata in
// LokiJS databases that it saves every 5 s (autosaveInterval in
// dist/src/blob/persistence/LokiBlobMetadataStore.js and
// dist/src/common/persistence/LokiExtentMetadataStore.js of azurite 3.37.0)
// and at shutdown: a SIGKILL before a save would test that timer, and one
// after it would read back the very files a graceful stop writes, so a kill
// tells nothing about the store that this restart does not.
func restartableAzurite(t *testing.T) (storetest.Maker, func(*testing.T)) {
	br := privateAzurite(t, true)
	blob := blobEndpoint.FindStringSubmatch(br.Addr)[1]
	waitListening(t, blob)
	cfg := Config{ConnectionString: br.Addr, Prefix: "apstore", ClientOptions: clientOptions()}
	return storeOn(cfg), func(t *testing.T) {
		if err := br.Restart(false); err != nil {
			t.Fatalf("restarting Azurite: %v", err)
		}
		waitListening(t, blob)
	}
}

// blobEndpoint finds the blob endpoint's host and port in a connection
// string.
var blobEndpoint = regexp.MustCompile(`BlobEndpoint=http://([^/;]+)/`)

// waitListening waits until addr takes connections: a restarted Azurite
// opens its queue port (which the restart waits for) and its blob port
// one after the other.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !dialOK(addr); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Azurite's blob service is not listening on %s after a minute", addr)
		}
	}
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, storeMaker)
}
