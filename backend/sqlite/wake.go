package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// hub is what the Backends of one process share for one database file:
// the writer lock that queues the process's write transactions, and the
// wake-ups of their idle Receives. Its poll goroutine reads PRAGMA
// data_version every PollInterval and wakes every idle Receive when
// another connection (another process's, or a transaction given to
// WithTx) committed meanwhile.
type hub struct {
	path string
	refs int // under hubsMu

	lock *writerLock // the process's writer turn, then the processes' flock

	wmu     sync.Mutex
	waiters map[string][]chan struct{}

	db   *sql.DB
	stop context.CancelFunc
	done chan struct{}
}

var (
	hubsMu sync.Mutex
	hubs   = map[string]*hub{}
)

// joinHub returns the process's hub of the file at path (absolute),
// starting it for the first Backend.
func joinHub(path string, cfg Config) (*hub, error) {
	hubsMu.Lock()
	defer hubsMu.Unlock()
	if h := hubs[path]; h != nil {
		h.refs++
		return h, nil
	}
	db, err := sql.Open("sqlite", dsn(path, cfg.BusyTimeout))
	if err != nil {
		return nil, fmt.Errorf("sqlite: opening %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	fl, err := openFileLock(path)
	if err != nil {
		db.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &hub{path: path, refs: 1, waiters: map[string][]chan struct{}{}, lock: newWriterLock(fl), db: db, stop: cancel, done: make(chan struct{})}
	go h.poll(ctx, cfg.Logger)
	hubs[path] = h
	return h, nil
}

// leave drops a Backend's reference, and stops the hub with the last.
func (h *hub) leave() {
	hubsMu.Lock()
	h.refs--
	last := h.refs == 0
	if last {
		delete(hubs, h.path)
	}
	hubsMu.Unlock()
	if last {
		h.stop()
		<-h.done
		h.db.Close()
		h.lock.close() // after a write of a closed Backend that holds it still
	}
}

// poll wakes every waiter when data_version changes: another connection
// committed.
func (h *hub) poll(ctx context.Context, log *slog.Logger) {
	defer close(h.done)
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	var last int64 = -1
	var c *sql.Conn
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if c == nil {
			c, err = h.db.Conn(ctx)
		}
		var v int64
		if err == nil {
			err = c.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&v)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				log.Warn("sqlite: polling for other processes' commits", "path", h.path, "err", err)
				failing = true
			}
			if c != nil {
				c.Close()
				c = nil
			}
			last = -1
			h.wakeAll()
			continue
		}
		failing = false
		if v != last {
			if last != -1 {
				h.wakeAll()
			}
			last = v
		}
	}
}

// wait registers a waiter of the queue: its channel receives at most one
// wake-up. done unregisters it; a wake-up it got but did not use (used
// false) goes on to another waiter.
func (h *hub) wait(queue string) (c <-chan struct{}, done func(used bool)) {
	ch := make(chan struct{}, 1)
	h.wmu.Lock()
	h.waiters[queue] = append(h.waiters[queue], ch)
	h.wmu.Unlock()
	return ch, func(used bool) {
		h.wmu.Lock()
		ws := h.waiters[queue]
		for i, x := range ws {
			if x == ch {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(h.waiters, queue)
		} else {
			h.waiters[queue] = ws
		}
		h.wmu.Unlock()
		if !used && len(ch) == 1 {
			h.wake(queue, 1)
		}
	}
}

// wake wakes up to n of the queue's waiters, oldest first.
func (h *hub) wake(queue string, n int) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	for _, ch := range h.waiters[queue] {
		if n == 0 {
			return
		}
		select {
		case ch <- struct{}{}:
			n--
		default: // woken already
		}
	}
}

// wakeAll wakes every waiter.
func (h *hub) wakeAll() {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	for _, ws := range h.waiters {
		for _, ch := range ws {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}
