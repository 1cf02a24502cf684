// Package health runs the platform's health checks and gates the fetchers
// on their result: while a check fails, no new job is taken.
package health

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Check reports whether something the handlers need is healthy.
type Check = func(ctx context.Context) error

// Gate runs the health checks and gates the fetchers on their result. Its
// zero value is not usable: call Init.
type Gate struct {
	checks map[string]Check

	mu      sync.Mutex
	last    map[string]error
	healthy bool
	held    bool          // Hold: closed whatever the checks say
	fast    atomic.Bool   // open (healthy and not held), readable without the lock on the hot path
	wake    chan struct{} // closed when health returns; replaced when it is lost
	again   chan struct{} // a request to re-check now
	// period is cancelled when health is lost, so a fetcher blocked in
	// Receive stops taking jobs at once. It is a child of base.
	base   context.Context
	period context.Context
	cancel context.CancelFunc
}

// Init sets the checks; the gate starts healthy.
func (h *Gate) Init(checks map[string]Check) {
	h.checks = checks
	h.healthy = true
	h.fast.Store(true)
	h.wake = make(chan struct{})
	close(h.wake)
	h.again = make(chan struct{}, 1)
	h.last = map[string]error{}
}

// AddPinger makes the backend's connectivity one of the checks.
func (h *Gate) AddPinger(b driver.Backend) {
	if pinger, ok := b.(driver.Pinger); ok {
		checks := map[string]Check{"broker": pinger.Ping}
		for k, v := range h.checks {
			checks[k] = v
		}
		h.checks = checks
	}
}

// OK reports, without a lock, whether the gate is open: healthy and not
// held.
func (h *Gate) OK() bool { return h.fast.Load() }

// Results returns the last result of each check: nil for a pass.
func (h *Gate) Results() map[string]error {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]error, len(h.last))
	for k, v := range h.last {
		out[k] = v
	}
	return out
}

// Start makes the first healthy period a child of base (the fetchers' context).
func (h *Gate) Start(base context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.base = base
	h.period, h.cancel = context.WithCancel(base)
	if !h.fast.Load() {
		h.cancel()
	}
}

// Wait blocks while unhealthy. It returns the context of the current healthy
// period, which ends when health is lost, or nil when ctx ends first.
func (h *Gate) Wait(ctx context.Context) context.Context {
	for {
		h.mu.Lock()
		wake, period := h.wake, h.period
		h.mu.Unlock()
		select {
		case <-wake:
			if period.Err() == nil {
				return period
			}
		case <-ctx.Done():
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// Recheck asks the loop to run the checks now.
func (h *Gate) Recheck() {
	if len(h.checks) == 0 {
		return
	}
	select {
	case h.again <- struct{}{}:
	default:
	}
}

// Run runs every check once and records the result.
func (h *Gate) Run(ctx context.Context, log *slog.Logger) bool {
	results := make(map[string]error, len(h.checks))
	healthy := true
	for name, check := range h.checks {
		err := safeCheck(ctx, check)
		results[name] = err
		if err != nil {
			healthy = false
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = results
	if healthy == h.healthy {
		return healthy
	}
	h.healthy = healthy
	if healthy {
		log.Info("asyncplatform: healthy again; taking jobs")
	} else {
		log.Warn("asyncplatform: unhealthy; no new jobs are taken until the checks pass", "results", fmt.Sprint(results))
	}
	h.apply()
	return healthy
}

// Hold closes the gate whatever the checks say, until Release: no job is
// taken, and deliveries already taken are handed back (the platform runs a
// suspect alone).
func (h *Gate) Hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = true
	h.apply()
}

// Release undoes Hold.
func (h *Gate) Release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = false
	h.apply()
}

// Healthy reports whether every check passed on its last run (a Hold does
// not change it).
func (h *Gate) Healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy
}

// apply opens or closes the gate to match healthy and held; h.mu is held.
func (h *Gate) apply() {
	open := h.healthy && !h.held
	if open == h.fast.Load() {
		return
	}
	h.fast.Store(open)
	if open {
		if h.base != nil {
			h.period, h.cancel = context.WithCancel(h.base)
		}
		close(h.wake)
	} else {
		if h.cancel != nil {
			h.cancel()
		}
		h.wake = make(chan struct{})
	}
}

func safeCheck(ctx context.Context, check Check) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("health check panicked: %v", v)
		}
	}()
	return check(ctx)
}

// FirstRetry is how soon Loop runs the checks again after a run that
// failed; each failure after that doubles the wait, up to the interval.
const FirstRetry = 250 * time.Millisecond

// Loop runs the checks every interval and on request, until ctx ends. While
// they fail it runs them sooner (after FirstRetry, doubling up to every),
// so the gate opens soon after what it checks is back.
func (h *Gate) Loop(ctx context.Context, every time.Duration, log *slog.Logger) {
	if len(h.checks) == 0 {
		return
	}
	retry := min(FirstRetry, every)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, every)
		healthy := h.Run(cctx, log)
		cancel()
		next := every
		if healthy {
			retry = min(FirstRetry, every)
		} else {
			next, retry = retry, min(2*retry, every)
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.again:
		}
	}
}
