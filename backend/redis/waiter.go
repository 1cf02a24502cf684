package redis

import (
	"errors"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// waiter turns the wake tokens of one queue's signal list into a broadcast to
// the idle Receive calls of this Backend. While anyone waits, one goroutine
// (so one pooled connection, however many receivers are idle) blocks in BLPOP
// on the signal list; each token it pops closes the current wake channel.
type waiter struct {
	mu      sync.Mutex
	wake    chan struct{}
	waiting int
	running bool
}

func (b *Backend) waiter(queue string) *waiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	w, ok := b.waiters[queue]
	if !ok {
		w = &waiter{wake: make(chan struct{})}
		b.waiters[queue] = w
	}
	return w
}

// current returns the channel the next broadcast closes.
func (w *waiter) current() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wake
}

func (w *waiter) isRunning() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.running
}

// enter registers an idle receiver and starts the BLPOP loop if needed.
func (w *waiter) enter(b *Backend, signal string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting++
	if w.running {
		return
	}
	w.running = b.spawn(func() { w.loop(b, signal) })
}

func (w *waiter) leave() {
	w.mu.Lock()
	w.waiting--
	w.mu.Unlock()
}

func (w *waiter) broadcast() {
	w.mu.Lock()
	close(w.wake)
	w.wake = make(chan struct{})
	w.mu.Unlock()
}

// blockFor is the BLPOP timeout: Redis counts it in seconds, and go-redis
// rounds anything shorter up to a second. It bounds how long the loop runs on
// after its last receiver left, and how long Close may wait for it.
const blockFor = time.Second

// loop pops wake tokens until nobody waits or the Backend closes.
func (w *waiter) loop(b *Backend, signal string) {
	backoff := 50 * time.Millisecond
	for {
		err := b.rdb.BLPop(b.ctx, blockFor, signal).Err()
		switch {
		case err == nil:
			w.broadcast()
			backoff = 50 * time.Millisecond
		case errors.Is(err, goredis.Nil):
		case b.ctx.Err() != nil:
		default:
			// Let the receivers run their claim and meet the error
			// themselves; don't spin on a broken connection.
			b.log.Debug("redis: wait for signal", "key", signal, "err", err)
			w.broadcast()
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-b.ctx.Done():
			}
			t.Stop()
			backoff = min(2*backoff, b.cfg.IdleWait)
		}
		w.mu.Lock()
		if w.waiting == 0 || b.ctx.Err() != nil {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
}
