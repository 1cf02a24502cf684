package azure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Defaults of Config.
const (
	DefaultPrefix          = "ap"
	DefaultDeadHold        = 30 * time.Second
	DefaultPollInterval    = 100 * time.Millisecond
	DefaultEnqueueParallel = 16
)

// ConnectionStringEnv names the environment variable that an empty
// Config.ConnectionString falls back to when Client and BlobClient are nil
// too: the only one the backend reads, in New.
const ConnectionStringEnv = "ASYNCPLATFORM_AZURE_CONNECTION_STRING"

// The bounds of Config.DeadHold: Azure's bounds for a blob lease.
const (
	MinDeadHold = 15 * time.Second
	MaxDeadHold = 60 * time.Second
)

// MaxBody is the largest message body the backend stores: 64 KiB of base64
// message text, less the backend's 15-byte framing.
const MaxBody = maxBody

// minPoll is the first wait after an empty receive; it doubles up to
// Config.PollInterval.
const minPoll = 10 * time.Millisecond

// Config configures a Backend. Exactly one of ConnectionString and the pair
// Client and BlobClient is required.
type Config struct {
	// ConnectionString is an Azure Storage connection string, for example
	// Azurite's "DefaultEndpointsProtocol=http;AccountName=...;AccountKey=...;QueueEndpoint=...;BlobEndpoint=...".
	// The backend uses its queue service and its blob service (dead
	// letters); a string that names a QueueEndpoint must name a
	// BlobEndpoint too. When Client and BlobClient are nil, defaults to
	// $ASYNCPLATFORM_AZURE_CONNECTION_STRING (ConnectionStringEnv); when
	// that is empty too, New fails.
	ConnectionString string

	// ClientOptions are the SDK options for the clients made from
	// ConnectionString (transport, retries, telemetry); the blob client
	// gets its azcore part. Against Azurite,
	// whose server closes idle connections after 5s, give it an http.Client
	// whose Transport has an IdleConnTimeout under 5s: a request sent on a
	// connection being closed is reset, and the SDK's retry of an update
	// that had in fact succeeded then fails as if the lease were lost (see
	// the package doc); a retried message delete that finds the message
	// gone succeeds. Defaults to nil (the SDK's defaults).
	ClientOptions *azqueue.ClientOptions

	// Client is a queue service client the caller built, with a shared key,
	// a token credential (azidentity) or a SAS URL. Defaults to nil (then
	// ConnectionString is required).
	Client *azqueue.ServiceClient

	// BlobClient is a Blob Storage client of the same account, built like
	// Client; it is required with Client. Its credential must be able to
	// create, read, list, delete and lease blobs in Container (and create
	// Container, unless it exists). Defaults to nil (then ConnectionString
	// is required).
	BlobClient *azblob.Client

	// Container is the Blob Storage container that holds the backend's
	// blobs (dead-letter records), created by New when it is missing: 3 to
	// 63 lowercase letters, digits and single hyphens. Two backends with
	// different prefixes need different containers. Defaults to Prefix +
	// "-asyncplatform" (DefaultContainerSuffix).
	Container string

	// Prefix starts every Azure queue name the backend creates: 1 to 8
	// lowercase letters or digits. Two backends sharing an account need
	// prefixes of which neither is a prefix of the other. Defaults to "ap".
	Prefix string

	// DeadHold is the duration of the blob lease by which NextDead holds a
	// record (Capabilities.DeadHold). The platform renews it with
	// ExtendDead every DeadHold/3 while its caller works, so it only bounds
	// how long a record held by a caller that vanished (crashed, or closed
	// its Backend) stays hidden from others. Whole seconds from 15s to
	// 60s, Azure's bounds for a blob lease. Defaults to DefaultDeadHold
	// (30s).
	DeadHold time.Duration

	// PollInterval is the longest wait between two receives of an empty
	// queue; the wait starts at 10ms and doubles up to it. Defaults to
	// 100ms.
	PollInterval time.Duration

	// EnqueueParallel bounds the concurrent requests of one Enqueue call
	// (Azure has no batch send). Defaults to 16.
	EnqueueParallel int

	// Logger receives the backend's warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.ConnectionString == "" && c.Client == nil && c.BlobClient == nil {
		c.ConnectionString = os.Getenv(ConnectionStringEnv)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Container == "" {
		c.Container = c.Prefix + DefaultContainerSuffix
	}
	if c.DeadHold == 0 {
		c.DeadHold = DefaultDeadHold
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.EnqueueParallel == 0 {
		c.EnqueueParallel = DefaultEnqueueParallel
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// errNoAccount reports a Config that names no storage account.
var errNoAccount = errors.New("azure: Config.ConnectionString (default $" + ConnectionStringEnv + ", which is empty) or Config.Client is required")

func (c Config) validate() error {
	switch {
	case c.ConnectionString == "" && c.Client == nil:
		return errNoAccount
	case c.ConnectionString != "" && (c.Client != nil || c.BlobClient != nil):
		return errors.New("azure: set only one of Config.ConnectionString and Config.Client with Config.BlobClient")
	case c.Client != nil && c.BlobClient == nil:
		return errors.New("azure: Config.BlobClient is required with Config.Client: dead letters are kept in Blob Storage")
	case c.Client != nil && c.ClientOptions != nil:
		return errors.New("azure: Config.ClientOptions applies to Config.ConnectionString only; configure Config.Client when you build it")
	case !prefixRe.MatchString(c.Prefix):
		return fmt.Errorf("azure: Config.Prefix %q: want 1 to %d lowercase letters or digits", c.Prefix, maxPrefixLen)
	case !validContainer(c.Container):
		return fmt.Errorf("azure: Config.Container %q: want 3 to 63 lowercase letters, digits and single hyphens", c.Container)
	case c.DeadHold < MinDeadHold || c.DeadHold > MaxDeadHold || c.DeadHold%time.Second != 0:
		return fmt.Errorf("azure: Config.DeadHold %v: want whole seconds from %v to %v (a blob lease)", c.DeadHold, MinDeadHold, MaxDeadHold)
	case c.PollInterval < 0:
		return fmt.Errorf("azure: Config.PollInterval %v: want a positive duration", c.PollInterval)
	case c.EnqueueParallel < 0:
		return fmt.Errorf("azure: Config.EnqueueParallel %d: want a positive number", c.EnqueueParallel)
	}
	return nil
}

// Backend is a driver.Backend on Azure Queue Storage. It is safe for
// concurrent use.
type Backend struct {
	svc          *azqueue.ServiceClient
	blobs        *azblob.Client    // the account's Blob Storage (blob.go)
	container    *container.Client // Config.Container
	prefix       string
	deadHold     time.Duration
	pollInterval time.Duration
	parallel     int
	log          *slog.Logger
	retry        policy.RetryOptions // Config.ClientOptions.Retry: see deleteMessage

	mu       sync.Mutex
	declared map[string]bool         // Azure work queue names known to exist
	legacy   map[string]*legacyState // by legacy prefix (legacy.go)

	deadNames deadNames // record names by ID, as listings showed them

	bg        sync.WaitGroup // updates that outlive their caller's ctx
	closeOnce sync.Once
	closed    chan struct{}
}

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.QueueDeleter = (*Backend)(nil)
	_ driver.Pinger       = (*Backend)(nil)
)

// retryOptions are the retry options of the queue client: those of
// Config.ClientOptions, or the SDK's defaults.
func retryOptions(cfg Config) policy.RetryOptions {
	if cfg.ClientOptions != nil {
		return cfg.ClientOptions.Retry
	}
	return policy.RetryOptions{}
}

// New returns a Backend. It creates Config.Container when it is missing
// (ctx bounds that request); queues are created by Declare.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	svc := cfg.Client
	if svc == nil {
		var err error
		svc, err = azqueue.NewServiceClientFromConnectionString(cfg.ConnectionString, cfg.ClientOptions)
		if err != nil {
			return nil, fmt.Errorf("azure: Config.ConnectionString: %w", err)
		}
	}
	blobs, err := newBlobClient(cfg)
	if err != nil {
		return nil, err
	}
	cc := blobs.ServiceClient().NewContainerClient(cfg.Container)
	if err := createContainer(ctx, cc); err != nil {
		return nil, err
	}
	return &Backend{
		svc:          svc,
		blobs:        blobs,
		container:    cc,
		prefix:       cfg.Prefix,
		deadHold:     cfg.DeadHold,
		pollInterval: cfg.PollInterval,
		parallel:     cfg.EnqueueParallel,
		log:          cfg.Logger,
		retry:        retryOptions(cfg),
		declared:     make(map[string]bool),
		legacy:       make(map[string]*legacyState),
		closed:       make(chan struct{}),
	}, nil
}

func (b *Backend) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// Capabilities implements driver.Backend.
func (b *Backend) Capabilities() driver.Capabilities {
	return driver.Capabilities{MaxBody: maxBody, MinLease: time.Second, RedeliversOnClose: false, DeadHold: b.deadHold}
}

// Ping implements driver.Pinger with a service-properties request.
func (b *Backend) Ping(ctx context.Context) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	if _, err := b.svc.GetServiceProperties(ctx, nil); err != nil {
		return fmt.Errorf("azure: ping: %w", err)
	}
	return nil
}

// Declare implements driver.Backend. It creates the work queue, labelled
// with the queue's name when its base is hashed (for Queues); dead-letter
// records are blobs in the container New made.
func (b *Backend) Declare(ctx context.Context, queue string) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	n := b.names(queue)
	if err := b.create(ctx, n.work); err != nil {
		return err
	}
	return b.label(ctx, queue)
}

func (b *Backend) create(ctx context.Context, name string) error {
	b.mu.Lock()
	ok := b.declared[name]
	b.mu.Unlock()
	if ok {
		return nil
	}
	if _, err := b.svc.CreateQueue(ctx, name, nil); err != nil && !queueerror.HasCode(err, queueerror.QueueAlreadyExists) {
		return fmt.Errorf("azure: create queue %s: %w", name, err)
	}
	b.mu.Lock()
	b.declared[name] = true
	b.mu.Unlock()
	return nil
}

func tooLarge(n int) error {
	return fmt.Errorf("azure: %w: body of %d bytes exceeds the limit of %d bytes (64 KiB of base64 message text less %d bytes of framing)",
		driver.ErrTooLarge, n, maxBody, workHeader)
}

// Enqueue implements driver.Backend: one request per message (Azure has no
// batch send), at most Config.EnqueueParallel at a time, each with a
// time-to-live of -1 (never expires) and a visibility timeout up to its
// NotBefore.
func (b *Backend) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	n := b.names(queue)
	for _, m := range msgs {
		if len(m.Body) > maxBody {
			return tooLarge(len(m.Body))
		}
	}
	q := b.svc.NewQueueClient(n.work)
	send := func(m driver.Message) error {
		text := workFrame{notBefore: m.NotBefore, body: m.Body}.encode()
		opts := &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))}
		if !m.NotBefore.IsZero() {
			opts.VisibilityTimeout = to.Ptr(visibility(time.Until(m.NotBefore)))
		}
		_, err := q.EnqueueMessage(ctx, text, opts)
		if queueerror.HasCode(err, queueerror.QueueNotFound) {
			b.forget(n.work)
			if err = b.create(ctx, n.work); err == nil {
				_, err = q.EnqueueMessage(ctx, text, opts)
			}
		}
		if err != nil {
			return fmt.Errorf("azure: enqueue to %s: %w", n.work, err)
		}
		return nil
	}
	if len(msgs) == 1 {
		return send(msgs[0])
	}
	var (
		wg    sync.WaitGroup
		sem   = make(chan struct{}, b.parallel)
		errMu sync.Mutex
		first error
	)
	for _, m := range msgs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := send(m); err != nil {
				errMu.Lock()
				if first == nil {
					first = err
				}
				errMu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

func (b *Backend) forget(name string) {
	b.mu.Lock()
	delete(b.declared, name)
	b.mu.Unlock()
}

// Stats implements driver.Backend. Azure tells only an approximate count of
// all messages, visible or not, so Ready is counted with Peek when fewer
// than 32 are visible (else -1), and Scheduled and InFlight are -1.
func (b *Backend) Stats(ctx context.Context, queue string) (driver.Stats, error) {
	if b.isClosed() {
		return driver.Stats{}, driver.ErrClosed
	}
	n := b.names(queue)
	st := driver.Stats{Ready: -1, Scheduled: -1, InFlight: -1}
	resp, err := b.svc.NewQueueClient(n.work).PeekMessages(ctx, &azqueue.PeekMessagesOptions{NumberOfMessages: to.Ptr(int32(32))})
	if err != nil && !queueerror.HasCode(err, queueerror.QueueNotFound) {
		return driver.Stats{}, fmt.Errorf("azure: stats of %s: %w", n.work, err)
	}
	if len(resp.Messages) < 32 {
		st.Ready = int64(len(resp.Messages))
	}
	if err := b.migrateDue(ctx, n); err != nil {
		return driver.Stats{}, err
	}
	dead, err := b.countDead(ctx, n)
	if err != nil {
		return driver.Stats{}, err
	}
	st.Dead = dead
	return st, nil
}

// DeleteQueue implements driver.QueueDeleter: it deletes the work queue and
// every dead-letter record of the queue (blobs, and record queues of the
// legacy layout).
func (b *Backend) DeleteQueue(ctx context.Context, queue string) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	n := b.names(queue)
	if _, err := b.svc.DeleteQueue(ctx, n.work, nil); err != nil && !queueerror.HasCode(err, queueerror.QueueNotFound) {
		return fmt.Errorf("azure: delete queue %s: %w", n.work, err)
	}
	b.forget(n.work)
	_, err := b.purge(ctx, n)
	return err
}

// Close implements driver.Backend. HTTP holds no per-delivery state, so
// unsettled deliveries simply reappear when their visibility timeout ends.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() { close(b.closed) })
	b.bg.Wait()
	return nil
}
