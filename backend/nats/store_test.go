package nats

import (
	"context"
	"os/exec"
	"testing"

	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
)

// storeStream names the streams of the store tests' backends; their store
// is the bucket storeStream+"_STORE".
const storeStream = "APTSTORE"

// storeOn opens each store on a connection of its own, as a separate
// process would.
func storeOn(url string) storetest.Maker {
	return func(ctx context.Context, tb testing.TB) (driver.Store, error) {
		cfg := testConfig(url)
		cfg.Stream = storeStream
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
	storetest.Run(t, storeOn(realURL(t)), storetest.Options{Restart: restartableNATS})
}

// restartableNATS runs a nats-server of the test's own, with JetStream on
// file storage, for Durability/Restart (a SIGKILL, then a start on the
// same directory).
func restartableNATS(t *testing.T) (storetest.Maker, func(*testing.T)) {
	if _, err := exec.LookPath("nats-server"); err != nil {
		t.Fatalf("no nats-server binary for a server of the test's own: %v", err)
	}
	br := privateNATS(t)
	return storeOn(br.Addr), func(t *testing.T) {
		if err := br.Restart(true); err != nil {
			t.Fatalf("restarting nats-server: %v", err)
		}
	}
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, storeOn(realURL(b)))
}
