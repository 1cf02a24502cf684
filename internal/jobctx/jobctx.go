// Package jobctx is the handler's context and the per-worker timer that
// enforces its timeout.
package jobctx

import (
	"context"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Context is a handler's context. It is cancelled when the handler
// returns, when its timeout passes, when its lease is lost, or when Stop
// gives up waiting. It lives inside the inflight record, so it costs no
// allocation of its own and no timer: its worker's one timer enforces the
// deadline (see Timer.Begin), and Stop cancels the running ones itself
// instead of registering each with a parent. A context.WithTimeout per job
// (a timer and a child registration, created and torn down for every job)
// was a fifth of the memory backend's CPU.
//
// It implements AfterFunc, so contexts derived from it (context.WithTimeout
// in a handler) register a callback instead of starting a goroutine each.
type Context struct {
	Parent   context.Context  // values; set before use
	Due      time.Time        // the deadline; zero: none; set before use
	Delivery *driver.Delivery // the value of driver.DeliveryKey; set before use

	mu     sync.Mutex
	done   chan struct{} // made on first use
	err    error
	afters map[*func()]struct{} // AfterFunc callbacks not yet run or stopped
}

// closedDone is returned by Done for a context cancelled before anyone
// asked for its channel.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Deadline implements context.Context.
func (c *Context) Deadline() (time.Time, bool) { return c.Due, !c.Due.IsZero() }

// Done implements context.Context.
func (c *Context) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		if c.err != nil {
			return closedDone
		}
		c.done = make(chan struct{})
	}
	return c.done
}

// Err implements context.Context.
func (c *Context) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Value implements context.Context with the parent's values, and the
// delivery for driver.DeliveryKey.
func (c *Context) Value(key any) any {
	if _, ok := key.(driver.DeliveryKey); ok && c.Delivery != nil {
		return c.Delivery
	}
	return c.Parent.Value(key)
}

// AfterFunc runs f in its own goroutine once c is cancelled, like
// context.AfterFunc; stop unregisters it.
func (c *Context) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	if c.afters == nil {
		c.afters = map[*func()]struct{}{}
	}
	key := &f
	c.afters[key] = struct{}{}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.afters[key]
		delete(c.afters, key)
		return ok
	}
}

// Cancel ends c with err (context.Canceled or context.DeadlineExceeded);
// only the first call counts.
func (c *Context) Cancel(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	afters := c.afters
	c.afters = nil
	c.mu.Unlock()
	for f := range afters {
		go (*f)()
	}
}

// String names the context in prints.
func (c *Context) String() string { return "asyncplatform.jobContext" }

// Timer belongs to one worker goroutine, which runs one handler at a time:
// it enforces the running job's timeout.
type Timer struct {
	mu    sync.Mutex
	cur   *Context    // the running job's context; nil when idle
	timer *time.Timer // made on first use
	armed time.Time   // when timer fires; zero when it is not armed
}

// Begin makes c the running job's context. The timer is re-armed only when
// it would fire after c's deadline: jobs of one timeout come in deadline
// order, so a timer armed for an earlier job fires, finds a later deadline
// and re-arms once per timeout period, not twice per job.
func (w *Timer) Begin(c *Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cur = c
	if c.Due.IsZero() || (!w.armed.IsZero() && !w.armed.After(c.Due)) {
		return
	}
	w.arm(c.Due)
}

// End marks the worker idle.
func (w *Timer) End() {
	w.mu.Lock()
	w.cur = nil
	w.mu.Unlock()
}

// arm sets the timer to fire at t; w.mu is held.
func (w *Timer) arm(t time.Time) {
	d := time.Until(t)
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.fire)
	} else {
		w.timer.Reset(d)
	}
	w.armed = t
}

// fire cancels the running job if its deadline has passed, and otherwise
// re-arms the timer for it.
func (w *Timer) fire() {
	w.mu.Lock()
	w.armed = time.Time{}
	c := w.cur
	if c == nil || c.Due.IsZero() {
		w.mu.Unlock()
		return
	}
	if time.Now().Before(c.Due) {
		w.arm(c.Due)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	c.Cancel(context.DeadlineExceeded)
}

// Stop stops the timer for good; the worker is exiting.
func (w *Timer) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cur = nil
	if w.timer != nil {
		w.timer.Stop()
	}
}
