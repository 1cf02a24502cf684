package runner

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// KeepDead renews the hold on the dead letter d, handed out by b.NextDead,
// every third of hold until the returned stop is called; stop waits for the
// renewals to end, so the caller may settle d once it returns. hold is the
// backend's Capabilities.DeadHold: with zero, holds do not lapse and nothing
// is started.
//
// A renewal that finds the hold lost (driver.ErrLeaseLost) ends the renewals:
// the holder's SettleDead then says so. Any other failure is logged and tried
// again at the next tick. A renewal may take until the hold would lapse
// (at least a third of hold). Renewals keep ctx's values but not its
// cancellation: the hold lasts as long as its holder works, until stop.
func KeepDead(ctx context.Context, b driver.Backend, d *driver.DeadDelivery, hold time.Duration, log *slog.Logger) (stop func()) {
	if hold <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		keepDead(ctx, b, d, hold, log)
	}()
	return func() {
		cancel()
		<-done
	}
}

func keepDead(ctx context.Context, b driver.Backend, d *driver.DeadDelivery, hold time.Duration, log *slog.Logger) {
	every := max(hold/3, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A renewal may take what is left of the hold: a slow store
			// (a loaded machine) answering within it still keeps it. The
			// hold is counted from the renewal's start, the latest the
			// store could have renewed from.
			now := time.Now()
			rctx, cancel := context.WithTimeout(ctx, max(every, hold-now.Sub(renewed)))
			err := b.ExtendDead(rctx, d)
			cancel()
			switch {
			case err == nil:
				renewed = now
			case ctx.Err() != nil:
				return // stopped during the renewal
			case errors.Is(err, driver.ErrLeaseLost):
				log.WarnContext(ctx, "asyncplatform: the hold on a dead letter was lost; another caller may take it", "id", d.ID, "error", err)
				return
			case now.Sub(renewed) >= hold:
				log.WarnContext(ctx, "asyncplatform: could not renew the hold on a dead letter before it lapsed; another caller may take it; will retry", "id", d.ID, "error", err)
			default:
				log.WarnContext(ctx, "asyncplatform: renewing the hold on a dead letter failed; will retry", "id", d.ID, "error", err)
			}
		}
	}
}
