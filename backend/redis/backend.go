package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Defaults of Config.
const (
	DefaultPrefix   = "asyncplatform"
	DefaultDeadHold = 30 * time.Second
	DefaultIdleWait = time.Second
	// DefaultWaitTimeout is the default of Config.WaitTimeout.
	DefaultWaitTimeout = time.Second
)

// maxClaim bounds the messages one Receive hands out, so a claim script's
// commands stay small.
const maxClaim = 1000

// MinLease is the shortest lease the backend honours (Capabilities.MinLease).
const MinLease = 50 * time.Millisecond

var _ driver.Backend = (*Backend)(nil)

var _ driver.QueueDeleter = (*Backend)(nil)

var _ driver.Pinger = (*Backend)(nil)

// Config configures a Backend.
type Config struct {
	// Client is the connection to Redis: a *goredis.Client, a failover
	// (Sentinel) client or a *goredis.ClusterClient. The Backend never closes
	// it. New adds a hook to a *goredis.ClusterClient (once per client) that
	// has it reload its slot map after a command fails on a connection, so
	// it follows a failover within a second of the replica's promotion
	// rather than at its next periodic reload. Required: defaults to nil,
	// which New rejects.
	Client goredis.UniversalClient

	// Prefix starts every key the backend writes, so several platforms can
	// share one Redis. It must not contain '{' or '}'. Defaults to
	// DefaultPrefix ("asyncplatform").
	Prefix string

	// DeadHold is how long a dead letter handed out by NextDead stays held
	// without ExtendDead or SettleDead (Capabilities.DeadHold): the platform
	// renews it every DeadHold/3 while its caller works, so this only bounds
	// how long a vanished holder's record stays hidden. Defaults to
	// DefaultDeadHold (30s).
	DeadHold time.Duration

	// IdleWait is the longest an idle Receive waits for a wake-up signal
	// before it looks at the queue again (a safety net: signals and the
	// timers for scheduled jobs and lease deadlines normally wake it
	// first). Defaults to DefaultIdleWait (1s).
	IdleWait time.Duration

	// WaitReplicas is how many replicas must hold an Enqueue's write before
	// Enqueue returns: after its script, Enqueue sends Redis's WAIT on the
	// same connection to the master, and fails with ErrNotReplicated when
	// fewer replicas confirmed within WaitTimeout (the jobs may still be
	// stored: a retry may then store them twice). Redis replicates
	// asynchronously, so without it a failover (Cluster or Sentinel) can
	// lose an Enqueue acknowledged just before the master died; every other
	// write the Backend makes, when lost that way, only brings a job back
	// (a duplicate), never loses one. It needs a *goredis.Client (Sentinel
	// included) or a *goredis.ClusterClient. Zero waits for none. Defaults
	// to 0.
	WaitReplicas int

	// WaitTimeout bounds the WAIT of WaitReplicas. Defaults to
	// DefaultWaitTimeout (1s).
	WaitTimeout time.Duration

	// Logger receives the backend's logs. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.DeadHold == 0 {
		c.DeadHold = DefaultDeadHold
	}
	if c.IdleWait == 0 {
		c.IdleWait = DefaultIdleWait
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Client == nil:
		return errors.New("redis: Config.Client is required")
	case driver.CheckPrefix(c.Prefix) != nil:
		return fmt.Errorf("redis: Config.Prefix: %w", driver.CheckPrefix(c.Prefix))
	case c.DeadHold < 3*time.Millisecond:
		return fmt.Errorf("redis: Config.DeadHold %v must be at least 3ms", c.DeadHold)
	case c.IdleWait < time.Millisecond:
		return fmt.Errorf("redis: Config.IdleWait %v must be at least 1ms", c.IdleWait)
	case c.WaitReplicas < 0:
		return fmt.Errorf("redis: Config.WaitReplicas %d must not be negative", c.WaitReplicas)
	case c.WaitTimeout < time.Millisecond:
		return fmt.Errorf("redis: Config.WaitTimeout %v must be at least 1ms", c.WaitTimeout)
	}
	if c.WaitReplicas > 0 {
		switch c.Client.(type) {
		case *goredis.Client, *goredis.ClusterClient:
		default:
			return fmt.Errorf("redis: Config.WaitReplicas needs a *goredis.Client or *goredis.ClusterClient, not a %T", c.Client)
		}
	}
	return nil
}

// Backend is a driver.Backend on Redis. Create one with New.
type Backend struct {
	cfg    Config
	rdb    goredis.UniversalClient
	log    *slog.Logger
	tokens string        // random per Backend; lease and hold tokens start with it
	seq    atomic.Uint64 // makes tokens unique within this Backend
	window int           // dead records per DeleteDead script call: deleteWindow, fewer in tests

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
	once   sync.Once

	spawnMu sync.Mutex // orders spawn's wg.Add before Close's wg.Wait
	stopped bool

	mu      sync.Mutex
	waiters map[string]*waiter
	ackers  map[string]*acker

	keyMu  sync.Mutex
	keyset map[string][]string
}

// handle is a Delivery's receipt: the stored copy's id and its lease token.
type handle struct {
	id, token string
}

// New returns a Backend over cfg.Client. It does not contact Redis (ctx is
// not used; Declare and Ping contact it).
func New(_ context.Context, cfg Config) (*Backend, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("redis: token seed: %w", err)
	}
	followFailovers(cfg.Client)
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{
		cfg:     cfg,
		rdb:     cfg.Client,
		log:     cfg.Logger,
		tokens:  hex.EncodeToString(rnd[:]),
		window:  deleteWindow,
		ctx:     ctx,
		cancel:  cancel,
		waiters: make(map[string]*waiter),
		ackers:  make(map[string]*acker),
		keyset:  make(map[string][]string),
	}
	return b, nil
}

// spawn runs fn in a goroutine that Close waits for, unless the Backend is
// closing. It reports whether fn was started.
func (b *Backend) spawn(fn func()) bool {
	b.spawnMu.Lock()
	defer b.spawnMu.Unlock()
	if b.stopped {
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		fn()
	}()
	return true
}

// keys returns the keys of one queue, in the order the scripts expect. The
// slice is shared: never modify it.
func (b *Backend) keys(queue string) []string {
	b.keyMu.Lock()
	defer b.keyMu.Unlock()
	if k, ok := b.keyset[queue]; ok {
		return k
	}
	tag := "{" + b.cfg.Prefix + ":" + queue + "}:"
	k := []string{
		tag + "ready", tag + "sched", tag + "inflight", tag + "jobs",
		tag + "signal", tag + "seq", tag + "dead", tag + "held", tag + "heldrec",
		tag + "deadrm",
	}
	b.keyset[queue] = k
	return k
}

// Indexes into Backend.keys.
const (
	keyJobs   = 3
	keySignal = 4
	keySeq    = 5
	keyDead   = 6
)

func (b *Backend) token() string {
	return b.tokens + "-" + strconv.FormatUint(b.seq.Add(1), 36) + "-"
}

// Capabilities reports the backend's limits.
func (b *Backend) Capabilities() driver.Capabilities {
	return driver.Capabilities{MinLease: MinLease, RedeliversOnClose: false, DeadHold: b.cfg.DeadHold}
}

// Ping checks the connection to Redis.
func (b *Backend) Ping(ctx context.Context) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if err := b.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: ping: %w", err)
	}
	return nil
}

// Declare adds the queue to the registry set that Queues lists (which also
// checks that Redis answers). Its keys are created on first use.
func (b *Backend) Declare(ctx context.Context, queue string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if err := b.rdb.SAdd(ctx, b.registryKey(), queue).Err(); err != nil {
		return fmt.Errorf("redis: declare %q: %w", queue, err)
	}
	return nil
}

// Enqueue stores msgs in one script call.
func (b *Backend) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(msgs))
	for i := range msgs {
		args = append(args, unixMs(msgs[i].NotBefore), msgs[i].Body)
	}
	keys := b.keys(queue)[:keySeq+1]
	if b.cfg.WaitReplicas > 0 {
		return b.enqueueReplicated(ctx, queue, keys, args)
	}
	if err := enqueueScript.Run(ctx, b.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("redis: enqueue to %q: %w", queue, err)
	}
	return nil
}

// DeleteQueue removes every key of the queue and its dead letters, then the
// queue from the registry set.
func (b *Backend) DeleteQueue(ctx context.Context, queue string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if err := b.rdb.Del(ctx, b.keys(queue)...).Err(); err != nil {
		return fmt.Errorf("redis: delete queue %q: %w", queue, err)
	}
	if err := b.rdb.SRem(ctx, b.registryKey(), queue).Err(); err != nil {
		return fmt.Errorf("redis: delete queue %q: %w", queue, err)
	}
	return nil
}

// Stats returns the queue's depths. Expired leases and due scheduled jobs
// count as ready.
func (b *Backend) Stats(ctx context.Context, queue string) (driver.Stats, error) {
	if b.closed.Load() {
		return driver.Stats{}, driver.ErrClosed
	}
	v, err := statsScript.Run(ctx, b.rdb, b.keys(queue)).Int64Slice()
	if err != nil {
		return driver.Stats{}, fmt.Errorf("redis: stats of %q: %w", queue, err)
	}
	if len(v) != 5 {
		return driver.Stats{}, fmt.Errorf("redis: stats of %q: unexpected reply of %d items", queue, len(v))
	}
	s := driver.Stats{Ready: v[0], Scheduled: v[1], InFlight: v[2], Dead: v[3]}
	if v[4] > 0 {
		s.OldestReady = time.UnixMilli(v[4])
	}
	return s, nil
}

// Close stops the backend's goroutines and waits for them. Unsettled
// deliveries are abandoned: they come back when their lease runs out. The
// client is left open.
func (b *Backend) Close() error {
	b.once.Do(func() {
		b.closed.Store(true)
		b.spawnMu.Lock()
		b.stopped = true
		b.spawnMu.Unlock()
		b.cancel()
		b.mu.Lock()
		var signals []string
		for q, w := range b.waiters {
			if w.isRunning() {
				signals = append(signals, b.keys(q)[keySignal])
			}
		}
		b.mu.Unlock()
		// Wake our own blocked BLPOPs (another process may take the
		// token instead; then ours ends within a second), and take back
		// the tokens nobody took, so a deleted queue stays deleted.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		tok := "close:" + b.tokens
		for _, s := range signals {
			_ = b.rdb.LPush(ctx, s, tok).Err()
		}
		b.wg.Wait()
		for _, s := range signals {
			_ = b.rdb.LRem(ctx, s, 0, tok).Err()
		}
	})
	return nil
}
