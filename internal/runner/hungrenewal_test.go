package runner

import (
	"context"
	"testing"
	"time"
)

// TestHungRenewalDelaysSettlePastLease: a renewal whose request hangs (a
// lost reply on one connection) holds the delivery's lock, which Settle
// needs. The renewal gives up after a third of the lease, so a handler
// that ended during it is settled within the lease; a renewal allowed what
// is left of the lease would hold the settle until the lease lapsed, and
// the job, done, would be delivered again.
func TestHungRenewalDelaysSettlePastLease(t *testing.T) {
	const lease = 3 * time.Second // 500 ms of slack, for a loaded machine
	b := setup(t, testOpts{lease: lease})
	b.backend.extendWait = time.Hour // the renewal never answers; it ends on its context
	var handlerStart time.Time
	b.handler = func(ctx context.Context, f *Delivery[string]) error {
		handlerStart = time.Now()
		select {
		case <-time.After(lease * 6 / 10): // past the first renewal's start (lease/3 .. lease/2)
		case <-ctx.Done():
		}
		return nil
	}
	b.backend.push(testQueue, 1)
	b.start()
	err := recv(t, "the settle", b.settleErrs)
	took := time.Since(handlerStart)
	b.stop(t)
	if err != nil || took >= lease {
		t.Errorf("settle %v, %v after the handler started (lease %v): a hung renewal held the settle until the lease lapsed", err, took, lease)
	}
}
