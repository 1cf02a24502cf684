package asyncplatform

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// health runs the health checks and gates the fetchers on their result.
type health struct {
	checks map[string]HealthCheck

	mu      sync.Mutex
	last    map[string]error
	healthy bool
	fast    atomic.Bool   // healthy, readable without the lock on the hot path
	wake    chan struct{} // closed when health returns; replaced when it is lost
	again   chan struct{} // a request to re-check now
	// period is cancelled when health is lost, so a fetcher blocked in
	// Receive stops taking jobs at once. It is a child of base.
	base   context.Context
	period context.Context
	cancel context.CancelFunc
}

func (h *health) init(checks map[string]HealthCheck) {
	h.checks = checks
	h.healthy = true
	h.fast.Store(true)
	h.wake = make(chan struct{})
	close(h.wake)
	h.again = make(chan struct{}, 1)
	h.last = map[string]error{}
}

// addPinger makes the backend's connectivity one of the checks.
func (h *health) addPinger(b driver.Backend) {
	if pinger, ok := b.(driver.Pinger); ok {
		checks := map[string]HealthCheck{"broker": pinger.Ping}
		for k, v := range h.checks {
			checks[k] = v
		}
		h.checks = checks
	}
}

func (h *health) ok() bool { return h.fast.Load() }

func (h *health) results() map[string]error {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]error, len(h.last))
	for k, v := range h.last {
		out[k] = v
	}
	return out
}

// start makes the first healthy period a child of base (the fetchers' context).
func (h *health) start(base context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.base = base
	h.period, h.cancel = context.WithCancel(base)
	if !h.healthy {
		h.cancel()
	}
}

// wait blocks while unhealthy. It returns the context of the current healthy
// period, which ends when health is lost, or nil when ctx ends first.
func (h *health) wait(ctx context.Context) context.Context {
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

// recheck asks the loop to run the checks now.
func (h *health) recheck() {
	if len(h.checks) == 0 {
		return
	}
	select {
	case h.again <- struct{}{}:
	default:
	}
}

// run runs every check once and records the result.
func (h *health) run(ctx context.Context, log *slog.Logger) bool {
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
	h.fast.Store(healthy)
	if healthy {
		if h.base != nil {
			h.period, h.cancel = context.WithCancel(h.base)
		}
		close(h.wake)
		log.Info("asyncplatform: healthy again; taking jobs")
	} else {
		if h.cancel != nil {
			h.cancel()
		}
		h.wake = make(chan struct{})
		log.Warn("asyncplatform: unhealthy; no new jobs are taken until the checks pass", "results", fmt.Sprint(results))
	}
	return healthy
}

func safeCheck(ctx context.Context, check HealthCheck) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("health check panicked: %v", v)
		}
	}()
	return check(ctx)
}

// loop runs the checks every interval and on request, until ctx ends.
func (h *health) loop(ctx context.Context, every time.Duration, log *slog.Logger) {
	if len(h.checks) == 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, every)
		h.run(cctx, log)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.again:
		}
	}
}
