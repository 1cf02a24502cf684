package rabbit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// dialTimeout bounds the TCP connect and the AMQP handshake of one dial.
const dialTimeout = 30 * time.Second

// nodeConnectTimeout bounds the TCP connect to one node when the URL lists
// several, so that an unreachable host (one that drops packets, not
// refuses) does not hold up the others for dialTimeout.
const nodeConnectTimeout = 5 * time.Second

// dial opens one connection, trying each node of Config.URL once, starting
// with the one after the node of the last connection (so a node that just
// died is tried last), and gives up when all failed, ctx ends or Close is
// called.
func (b *Backend) dial(ctx context.Context) (*amqp.Connection, error) {
	b.mu.Lock()
	start := 0 // New: the nodes in the order given
	if b.dialled {
		start = (b.node + 1) % len(b.nodes)
	}
	b.mu.Unlock()
	var errs []error
	for i := range b.nodes {
		n := (start + i) % len(b.nodes)
		c, err := b.dialNode(ctx, b.nodes[n])
		if err == nil {
			b.mu.Lock()
			b.node, b.dialled = n, true
			b.mu.Unlock()
			if len(b.nodes) > 1 {
				b.log.Info("connected", "node", redactNode(b.nodes[n]))
			}
			return c, nil
		}
		if errors.Is(err, driver.ErrClosed) || ctx.Err() != nil {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// dialNode opens one connection to one node.
func (b *Backend) dialNode(ctx context.Context, node string) (*amqp.Connection, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.closing, cancel)()
	var stops []func() bool
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	connect := dialTimeout
	if len(b.nodes) > 1 {
		connect = nodeConnectTimeout
	}
	c, err := amqp.DialConfig(node, amqp.Config{
		Heartbeat:  b.cfg.Heartbeat,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": "asyncplatform"},
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: connect}
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The handshake runs under this deadline (the client clears it
			// afterwards); ending ctx cuts it short.
			conn.SetDeadline(time.Now().Add(dialTimeout))
			stops = append(stops, context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) }))
			return conn, nil
		},
	})
	if err != nil {
		if b.closing.Err() != nil {
			return nil, driver.ErrClosed
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("rabbit: dial %s: %w", redactNode(node), err)
	}
	return c, nil
}

// attach installs conn as the live connection and starts its watchers.
func (b *Backend) attach(conn *amqp.Connection) {
	closeCh := conn.NotifyClose(make(chan *amqp.Error, 1))
	blockCh := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		conn.Close()
		return
	}
	b.conn = conn
	b.pub = nil
	b.blocked = nil
	close(b.up)
	b.mu.Unlock()

	b.wg.Add(2)
	go b.watchBlocked(blockCh)
	go b.supervise(closeCh)
}

// watchBlocked drains the connection's blocked notifications until the
// connection closes.
func (b *Backend) watchBlocked(ch <-chan amqp.Blocking) {
	defer b.wg.Done()
	for bl := range ch {
		b.mu.Lock()
		if bl.Active && b.blocked == nil {
			b.blocked = &blockState{reason: bl.Reason, since: time.Now(), lifted: make(chan struct{})}
			close(b.blockSig)
			b.log.Warn("connection blocked by the broker", "reason", bl.Reason)
		} else if !bl.Active && b.blocked != nil {
			close(b.blocked.lifted)
			b.blocked = nil
			b.blockSig = make(chan struct{})
			b.log.Info("connection unblocked")
		}
		b.mu.Unlock()
	}
	b.mu.Lock()
	if b.blocked != nil {
		close(b.blocked.lifted)
		b.blocked = nil
		b.blockSig = make(chan struct{})
	}
	b.mu.Unlock()
}

// supervise waits for the connection to close and redials until it has a new
// one, or until Close.
func (b *Backend) supervise(closeCh <-chan *amqp.Error) {
	defer b.wg.Done()
	var cause *amqp.Error
	select {
	case cause = <-closeCh:
	case <-b.done:
		return
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.conn = nil
	b.pub = nil
	b.cons = map[string]*consumer{}
	b.qch = map[string]*qchan{}
	b.up = make(chan struct{})
	b.mu.Unlock()
	b.log.Warn("connection lost; reconnecting", "err", cause)
	b.lostAcks()

	ceiling := b.cfg.ReconnectMin
	for attempt := 1; ; attempt++ {
		wait := time.Duration(0)
		if ceiling > 0 {
			wait = rand.N(ceiling) + 1
		}
		select {
		case <-time.After(wait):
		case <-b.done:
			return
		}
		ceiling = min(2*ceiling, b.cfg.ReconnectMax)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		conn, err := b.dial(ctx)
		if err == nil {
			err = b.redeclare(conn)
			if err != nil {
				conn.Close()
			}
		}
		cancel()
		if err != nil {
			b.log.Warn("reconnect failed", "attempt", attempt, "err", err)
			continue
		}
		b.log.Info("reconnected", "attempts", attempt)
		b.attach(conn) // starts the next supervisor
		return
	}
}

// redeclare declares again every queue this backend declared, on a new
// connection, before it goes live.
func (b *Backend) redeclare(conn *amqp.Connection) error {
	b.mu.Lock()
	queues := make(map[string]amqp.Table, len(b.declared))
	for n, args := range b.declared {
		queues[n] = args
	}
	b.mu.Unlock()
	if len(queues) == 0 {
		return nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { ch.Close() }()
	for n, args := range queues {
		err := declareQueue(ch, n, args)
		if err == nil {
			continue
		}
		if conn.IsClosed() {
			return err
		}
		// One queue that cannot be declared (a classic queue whose node
		// is down: 404) must not keep the connection from going live;
		// its own calls fail until it can.
		b.log.Warn("declaring a queue again after a reconnect failed", "queue", n, "err", err)
		if ch, err = conn.Channel(); err != nil {
			return err
		}
	}
	return nil
}

// connection returns the live connection, waiting for a reconnect when there
// is none.
func (b *Backend) connection(ctx context.Context) (*amqp.Connection, error) {
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, driver.ErrClosed
		}
		conn, up := b.conn, b.up
		b.mu.Unlock()
		if conn != nil && !conn.IsClosed() {
			return conn, nil
		}
		if conn != nil {
			// Closed, and the supervisor has not noticed yet.
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		select {
		case <-up:
		case <-b.done:
			return nil, driver.ErrClosed
		case <-ctx.Done():
			return nil, fmt.Errorf("rabbit: waiting for the connection: %w", ctx.Err())
		}
	}
}

// withChannel runs fn on a fresh channel of the live connection and closes
// the channel after it.
func (b *Backend) withChannel(ctx context.Context, fn func(ch *amqp.Channel) error) error {
	conn, err := b.connection(ctx)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbit: open channel: %w", err)
	}
	defer ch.Close()
	return fn(ch)
}
