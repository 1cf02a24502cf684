package runner

import (
	"context"
	"testing"
	"time"
)

// reviewG: a renewal whose request hangs (a lost reply on one connection)
// holds f.mu, which Settle needs. Before cbccd0e a renewal gave up after a
// third of the lease, so a handler that ended during it was settled well
// within the lease; with the renewal's timeout now "what is left of the
// lease", the settle waits until the lease has lapsed: the job, done, is
// delivered again (runs twice).
func TestHungRenewalDelaysSettlePastLease(t *testing.T) {
	const lease = 1500 * time.Millisecond
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
