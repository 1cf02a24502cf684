package rabbit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Defaults of Config.
const (
	DefaultURL            = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultPrefix         = "asyncplatform"
	DefaultMaxBody        = 16 << 20
	DefaultPublishTimeout = 30 * time.Second
	DefaultBlockedTimeout = 5 * time.Second
	DefaultReconnectMin   = 100 * time.Millisecond
	DefaultReconnectMax   = 10 * time.Second
	DefaultHeartbeat      = 10 * time.Second
	DefaultDeadHold       = 30 * time.Second
	DefaultDelaySweep     = 30 * time.Second
)

// URLEnv names the environment variable that an empty Config.URL falls
// back to: the only one the backend reads, in New.
const URLEnv = "ASYNCPLATFORM_AMQP_URL"

// Errors of this backend, matched with errors.Is.
var (
	// ErrUnroutable is returned when the broker returned a mandatory publish
	// because no queue took it (the queue was deleted, for example).
	ErrUnroutable = errors.New("rabbit: message returned unroutable")

	// ErrNacked is returned when the broker refused a publish (basic.nack).
	ErrNacked = errors.New("rabbit: publish nacked by the broker")

	// ErrBlocked is returned by Enqueue (and the other publishing methods)
	// while the broker blocks the connection (a memory or disk alarm) for
	// longer than Config.BlockedTimeout.
	ErrBlocked = errors.New("rabbit: connection blocked by the broker")

	// ErrIncompatibleQueue is returned by Declare when a queue exists with
	// other arguments than the ones this backend declares it with.
	ErrIncompatibleQueue = errors.New("rabbit: queue exists with incompatible arguments")
)

// Config configures a Backend. The zero value is usable.
type Config struct {
	// URL is the AMQP URL of the broker. For a cluster, it lists several
	// nodes separated by commas, which share its user, password, vhost and
	// query: amqp://user:pass@h1:5672,h2:5672,h3:5672/vhost. New connects to
	// the first node that answers, in the order given; when the connection
	// is lost, the backend dials the next node at once (the one it lost is
	// tried last) and goes round the list, with backoff between rounds. See
	// the package documentation, Clusters. Defaults to
	// $ASYNCPLATFORM_AMQP_URL (URLEnv), or DefaultURL when that is empty.
	URL string

	// Prefix starts every queue name this backend derives. Defaults to
	// "asyncplatform".
	Prefix string

	// Prefetch is the consumer prefetch (basic.qos) of each work queue. Zero
	// takes the max of the first Receive on the queue, which the platform
	// sets to the queue's concurrency. Defaults to 0.
	Prefetch int

	// MaxBody is the largest message body Enqueue accepts, in bytes: set it
	// to the broker's max_message_size, which AMQP does not tell a client.
	// Capabilities.MaxBody reports it; the platform's Config.MaxMessage
	// bounds messages below it. Defaults to 16 MiB (RabbitMQ 4's
	// max_message_size; 3.x accepts 128 MiB).
	MaxBody int

	// PublishTimeout bounds how long one publish waits for its confirm,
	// including the retries after a reconnect, when the caller's context
	// has no earlier deadline. Defaults to 30s.
	PublishTimeout time.Duration

	// BlockedTimeout is how long a publish waits for the broker to lift a
	// connection.blocked before it fails with ErrBlocked. Defaults to 5s.
	BlockedTimeout time.Duration

	// ReconnectMin and ReconnectMax bound the backoff between redials after
	// the connection is lost; each wait is drawn with full jitter below a
	// cap that doubles from ReconnectMin up to ReconnectMax. Defaults to
	// 100ms and 10s.
	ReconnectMin, ReconnectMax time.Duration

	// Heartbeat is the AMQP heartbeat interval. Defaults to 10s.
	Heartbeat time.Duration

	// DelaySweep is how often the Backend looks for messages stuck in the
	// delay queues of the queues it consumes, and moves them on (see the
	// package documentation, Delays). Negative turns the sweeper off.
	// Defaults to 30s.
	DelaySweep time.Duration

	// Logger receives connection events. Defaults to slog.Default().
	Logger *slog.Logger

	// Store is the companion store of the platform's shared state, which
	// RabbitMQ cannot keep: pgstore.New (PostgreSQL), or any other
	// driver.Store (a Redis or NATS backend). Its keys are kept under
	// Prefix, so platforms of several prefixes can share one. The Backend
	// does not close it. See Backend.Store. With a Store, dead letters live
	// in it too, where a peek, a pop, a page and a look-up by ID cost the
	// same at any depth (see Dead letters in the package documentation).
	// Defaults to nil: no shared state, and dead letters in the quorum
	// queue p.q:dead, whose every read costs the whole queue.
	Store driver.Store

	// DeadHold is how long a dead letter NextDead hands out from the Store
	// stays held without ExtendDead or SettleDead
	// (Capabilities.DeadHold): the platform renews it every DeadHold/3
	// while its caller works, so it only bounds how long a record of a
	// caller that vanished stays hidden. A whole number of milliseconds,
	// at least driver.MinTTL. Without a Store a hold lasts as long as the
	// holder's channel, and DeadHold is not used. Defaults to
	// DefaultDeadHold (30s).
	DeadHold time.Duration
}

func (c Config) withDefaults() Config {
	if c.URL == "" {
		c.URL = os.Getenv(URLEnv)
	}
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.BlockedTimeout == 0 {
		c.BlockedTimeout = DefaultBlockedTimeout
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = DefaultReconnectMax
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.DeadHold == 0 {
		c.DeadHold = DefaultDeadHold
	}
	if c.DelaySweep == 0 {
		c.DelaySweep = DefaultDelaySweep
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Prefetch < 0:
		return fmt.Errorf("rabbit: Config.Prefetch is %d, must not be negative", c.Prefetch)
	case c.Prefetch > 65535:
		return fmt.Errorf("rabbit: Config.Prefetch is %d, AMQP allows at most 65535", c.Prefetch)
	case c.MaxBody < 0:
		return fmt.Errorf("rabbit: Config.MaxBody is %d, must not be negative", c.MaxBody)
	case c.PublishTimeout < 0:
		return fmt.Errorf("rabbit: Config.PublishTimeout is %v, must not be negative", c.PublishTimeout)
	case c.BlockedTimeout < 0:
		return fmt.Errorf("rabbit: Config.BlockedTimeout is %v, must not be negative", c.BlockedTimeout)
	case c.ReconnectMin < 0 || c.ReconnectMax < c.ReconnectMin:
		return fmt.Errorf("rabbit: Config.ReconnectMin (%v) and ReconnectMax (%v) must satisfy 0 <= min <= max", c.ReconnectMin, c.ReconnectMax)
	case driver.CheckTTL(c.DeadHold) != nil:
		return fmt.Errorf("rabbit: Config.DeadHold: %w", driver.CheckTTL(c.DeadHold))
	case driver.CheckPrefix(c.Prefix) != nil:
		return fmt.Errorf("rabbit: Config.Prefix: %w", driver.CheckPrefix(c.Prefix))
	case strings.HasPrefix(c.Prefix, "amq."):
		return fmt.Errorf("rabbit: Config.Prefix %q: %w: RabbitMQ reserves names starting with \"amq.\"", c.Prefix, driver.ErrBadQueue)
	}
	if _, err := splitNodes(c.URL); err != nil {
		return fmt.Errorf("rabbit: Config.URL: %w", err)
	}
	return nil
}

// Backend is a driver.Backend on RabbitMQ. See the package documentation for
// the broker layout. It is safe for concurrent use.
type Backend struct {
	cfg Config
	log *slog.Logger

	closing context.Context    // cancelled by Close
	stop    context.CancelFunc // cancels closing
	done    <-chan struct{}    // closing.Done()
	wg      sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	shutting  bool                     // Close has begun
	conn      *amqp.Connection         // nil while reconnecting
	up        chan struct{}            // closed while conn is set
	pub       *publisher               // of conn, made lazily
	declared  map[string]amqp.Table    // broker queue name → arguments, declared by this backend
	cons      map[string]*consumer     // the live consumer of each queue
	qch       map[string]*qchan        // the consumer channel of each queue
	window    map[string]int           // the largest Receive max of each queue: its prefetch
	blocked   *blockState              // non-nil while the broker blocks conn
	blockSig  chan struct{}            // closed when a block begins; renewed when it lifts
	known     map[string]bool          // queues whose work and dead queues are declared
	legacy    map[string]bool          // queues with a classic dead-letter queue to move (migrateDead)
	deadTurns map[string]chan struct{} // per queue: held by the dead-letter read of this Backend that holds lockDead
	holds     map[*storeHold]bool      // dead letters this Backend holds in the store, let go by Close

	consMu  sync.Mutex // serialises consumer creation
	pubMu   sync.Mutex // serialises publisher creation
	migMu   sync.Mutex // serialises migrateDead
	chanGen atomic.Uint64

	recent  recentAcks  // acks sent lately on the connection (see lostack.go)
	doubt   doubtSet    // acks that may have been lost with their connection
	holding holders     // deliveries handed out and not settled, by origin (see twins.go)
	unsure  unsureSends // instances of failed Enqueues, sent again by the next Enqueue of the same job (see twins.go)
	ran     doubtSet    // origins of deliveries handed out and settled (see twins.go)

	beforeAck atomic.Pointer[func()] // for tests: runs between a Requeue's, DeadLetter's or release's stored successors and their acks

	// For tests: traceDelivery sees each delivery Receive reads and what it
	// did with it; traceResend each message publishFor sends again after a
	// lost channel.
	traceDelivery atomic.Pointer[func(d amqp.Delivery, what string)]
	traceResend   atomic.Pointer[func(m outMsg, attempt int)]

	nodes   []string // one URL per node of Config.URL
	node    int      // the index in nodes of the last connection; guarded by mu
	dialled bool     // a connection was made once; guarded by mu
}

type blockState struct {
	reason string
	since  time.Time
	lifted chan struct{}
}

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.QueueDeleter = (*Backend)(nil)
	_ driver.Pinger       = (*Backend)(nil)
)

// New connects to the broker and returns a Backend. An unreachable broker is
// an error; after that, a lost connection is redialled in the background.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Backend{
		cfg:       cfg,
		log:       cfg.Logger.With("backend", "rabbit"),
		up:        make(chan struct{}),
		declared:  map[string]amqp.Table{},
		cons:      map[string]*consumer{},
		qch:       map[string]*qchan{},
		window:    map[string]int{},
		blockSig:  make(chan struct{}),
		known:     map[string]bool{},
		legacy:    map[string]bool{},
		deadTurns: map[string]chan struct{}{},
		holds:     map[*storeHold]bool{},
	}
	b.nodes, _ = splitNodes(cfg.URL) // checked by validate
	b.closing, b.stop = context.WithCancel(context.Background())
	b.done = b.closing.Done()
	conn, err := b.dial(ctx)
	if err != nil {
		b.stop()
		return nil, err
	}
	b.attach(conn)
	if cfg.DelaySweep > 0 {
		b.wg.Add(1)
		go b.sweepDelays(cfg.DelaySweep)
	}
	return b, nil
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// isShutting reports whether Close has begun.
func (b *Backend) isShutting() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.shutting
}

// closedErr turns err into driver.ErrClosed (wrapping err) once Close has
// begun: a call still running when Close is called ends with ErrClosed,
// whatever the broker answered on the closing channel or connection (504
// CHANNEL_ERROR, say).
func (b *Backend) closedErr(err error) error {
	if err == nil || errors.Is(err, driver.ErrClosed) || !b.isShutting() {
		return err
	}
	return fmt.Errorf("%w (%w)", driver.ErrClosed, err)
}

// Capabilities reports the backend's limits.
func (b *Backend) Capabilities() driver.Capabilities {
	c := driver.Capabilities{MaxBody: b.cfg.MaxBody, RedeliversOnClose: true}
	if b.cfg.Store != nil {
		c.DeadHold = b.cfg.DeadHold // a hold in the store, with a TTL
	}
	return c
}

// Ping reports whether the connection to the broker is up.
func (b *Backend) Ping(ctx context.Context) error {
	b.mu.Lock()
	closed, conn := b.closed, b.conn
	b.mu.Unlock()
	switch {
	case closed:
		return driver.ErrClosed
	case conn == nil || conn.IsClosed():
		return errors.New("rabbit: not connected (reconnecting)")
	}
	return nil
}

// Close closes the connection; unsettled deliveries return to their queues
// at once with one more delivery counted. It waits for the backend's
// goroutines.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.shutting {
		b.mu.Unlock()
		return nil
	}
	b.shutting = true
	b.mu.Unlock()
	b.releaseAll()
	b.letGoHolds()

	b.mu.Lock()
	b.closed = true
	conn := b.conn
	b.stop()
	b.mu.Unlock()
	var err error
	if conn != nil {
		if cerr := conn.Close(); cerr != nil && !errors.Is(cerr, amqp.ErrClosed) {
			err = cerr
		}
	}
	b.wg.Wait()
	return err
}
