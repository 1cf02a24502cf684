package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// waker hands each waiting Receive a channel that the next notification
// for its queue closes.
type waker struct {
	mu    sync.Mutex
	chans map[string]chan struct{}
}

// wait returns the channel the queue's next wake-up closes.
func (w *waker) wait(queue string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.chans[queue]
	if c == nil {
		c = make(chan struct{})
		w.chans[queue] = c
	}
	return c
}

// wake wakes the queue's waiting receivers.
func (w *waker) wake(queue string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.chans[queue]; c != nil {
		close(c)
		delete(w.chans, queue)
	}
}

// wakeAll wakes every waiting receiver: notifications may have been
// missed.
func (w *waker) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for q, c := range w.chans {
		close(c)
		delete(w.chans, q)
	}
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
				b.wake.wake(n.Payload)
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
