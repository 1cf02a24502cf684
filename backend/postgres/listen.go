package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// waker wakes waiting receivers, as many per notification as it
// announces jobs.
type waker struct {
	mu    sync.Mutex
	queue map[string][]chan struct{}
}

// wait registers a waiter of the queue: its channel receives at most one
// wake-up. done unregisters it; a wake-up it got but did not use (used
// false) goes on to another waiter.
func (w *waker) wait(queue string) (c <-chan struct{}, done func(used bool)) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	w.queue[queue] = append(w.queue[queue], ch)
	w.mu.Unlock()
	return ch, func(used bool) {
		w.mu.Lock()
		ws := w.queue[queue]
		for i, x := range ws {
			if x == ch {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(w.queue, queue)
		} else {
			w.queue[queue] = ws
		}
		w.mu.Unlock()
		if !used && len(ch) == 1 {
			w.wake(queue, 1)
		}
	}
}

// wake wakes up to n of the queue's waiters, oldest first.
func (w *waker) wake(queue string, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ws := w.queue[queue]
	for len(ws) > 0 && n > 0 {
		ch := ws[0]
		ws = ws[1:]
		select {
		case ch <- struct{}{}:
			n--
		default: // woken already
		}
	}
	if len(ws) == 0 {
		delete(w.queue, queue)
	} else {
		w.queue[queue] = ws
	}
}

// wakeAll wakes every waiter: notifications may have been missed.
func (w *waker) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for q, ws := range w.queue {
		for _, ch := range ws {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		delete(w.queue, q)
	}
}

// parseWake reads a notification's payload, "<jobs> <queue>". A payload
// of another shape (someone else's NOTIFY on the channel) wakes one
// waiter of the queue it names, if any.
func parseWake(payload string) (queue string, n int) {
	num, q, ok := strings.Cut(payload, " ")
	if !ok {
		return payload, 1
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 {
		return q, 1
	}
	return q, n
}

// listenConn opens the session connection and listens on the channel.
func (b *Backend) listenConn(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: the wake-ups' connection: %w", err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+b.channel); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("postgres: LISTEN %s: %w", b.channel, err)
	}
	return conn, nil
}

// listen passes notifications on to the waker until Close, opening the
// connection again (every second at most) when it is lost.
func (b *Backend) listen(conn *pgx.Conn, cfg *pgx.ConnConfig) {
	defer b.wg.Done()
	for {
		if conn != nil {
			for {
				n, err := conn.WaitForNotification(b.ctx)
				if err != nil {
					if b.ctx.Err() == nil {
						b.cfg.Logger.Warn("postgres: wake-ups lost; Receive polls every IdleWait until they are back", "err", err)
					}
					break
				}
				b.wake.wake(parseWake(n.Payload))
			}
			conn.Close(context.Background())
			conn = nil
		}
		select {
		case <-b.ctx.Done():
			return
		case <-time.After(time.Second):
		}
		ctx, cancel := context.WithTimeout(b.ctx, DefaultQueryWait)
		c, err := b.listenConn(ctx, cfg)
		cancel()
		if err != nil {
			if b.ctx.Err() == nil {
				b.cfg.Logger.Warn("postgres: reconnecting the wake-ups", "err", err)
			}
			continue
		}
		conn = c
		b.wake.wakeAll()
	}
}
