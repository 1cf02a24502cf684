package azure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Defaults of Config.
const (
	DefaultPrefix          = "ap"
	DefaultDeadLease       = 30 * time.Second
	DefaultPollInterval    = 100 * time.Millisecond
	DefaultEnqueueParallel = 16
)

// MaxBody is the largest message body the backend stores: 64 KiB of base64
// message text, less the backend's 15-byte framing.
const MaxBody = maxBody

// minPoll is the first wait after an empty receive; it doubles up to
// Config.PollInterval.
const minPoll = 10 * time.Millisecond

// Config configures a Backend. Exactly one of ConnectionString and Client is
// required.
type Config struct {
	// ConnectionString is an Azure Storage connection string, for example
	// Azurite's "DefaultEndpointsProtocol=http;AccountName=...;AccountKey=...;QueueEndpoint=...".
	// Defaults to "" (then Client is required).
	ConnectionString string

	// ClientOptions are the SDK options for the client made from
	// ConnectionString (transport, retries, telemetry). Against Azurite,
	// whose server closes idle connections after 5s, give it an http.Client
	// whose Transport has an IdleConnTimeout under 5s: a request sent on a
	// connection being closed is reset, and the SDK's retry of a delete or
	// update that had in fact succeeded then fails as if the lease were
	// lost. Defaults to nil (the SDK's defaults).
	ClientOptions *azqueue.ClientOptions

	// Client is a queue service client the caller built, with a shared key,
	// a token credential (azidentity) or a SAS URL. Defaults to nil (then
	// ConnectionString is required).
	Client *azqueue.ServiceClient

	// Prefix starts every Azure queue name the backend creates: 1 to 8
	// lowercase letters or digits. Two backends sharing an account need
	// prefixes of which neither is a prefix of the other. Defaults to "ap".
	Prefix string

	// DeadLease is how long NextDead hides a record from other callers; a
	// caller that vanishes releases it after this long, and a caller that
	// holds it longer may lose it to another (its SettleDead then fails
	// with driver.ErrLeaseLost). Whole seconds, at least 1s. Defaults to
	// 30s.
	DeadLease time.Duration

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
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.DeadLease == 0 {
		c.DeadLease = DefaultDeadLease
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

func (c Config) validate() error {
	switch {
	case c.ConnectionString == "" && c.Client == nil:
		return errors.New("azure: Config.ConnectionString or Config.Client is required")
	case c.ConnectionString != "" && c.Client != nil:
		return errors.New("azure: set only one of Config.ConnectionString and Config.Client")
	case c.Client != nil && c.ClientOptions != nil:
		return errors.New("azure: Config.ClientOptions applies to Config.ConnectionString only; configure Config.Client when you build it")
	case !prefixRe.MatchString(c.Prefix):
		return fmt.Errorf("azure: Config.Prefix %q: want 1 to %d lowercase letters or digits", c.Prefix, maxPrefixLen)
	case c.DeadLease < time.Second:
		return fmt.Errorf("azure: Config.DeadLease %v: want at least 1s", c.DeadLease)
	case c.DeadLease > maxVisibility*time.Second:
		return fmt.Errorf("azure: Config.DeadLease %v: want at most 7 days", c.DeadLease)
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
	prefix       string
	deadLease    time.Duration
	pollInterval time.Duration
	parallel     int
	log          *slog.Logger

	mu       sync.Mutex
	declared map[string]bool // Azure work queue names known to exist

	bg        sync.WaitGroup // updates that outlive their caller's ctx
	closeOnce sync.Once
	closed    chan struct{}
}

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.QueueDeleter = (*Backend)(nil)
	_ driver.Pinger       = (*Backend)(nil)
)

// New returns a Backend. It does not contact the service; Declare and Ping do.
func New(cfg Config) (*Backend, error) {
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
	return &Backend{
		svc:          svc,
		prefix:       cfg.Prefix,
		deadLease:    cfg.DeadLease,
		pollInterval: cfg.PollInterval,
		parallel:     cfg.EnqueueParallel,
		log:          cfg.Logger,
		declared:     make(map[string]bool),
		closed:       make(chan struct{}),
	}, nil
}

// receipt is Delivery.Handle: the message and its current pop receipt.
type receipt struct {
	b            *Backend
	q            *azqueue.QueueClient
	id           string
	dequeueCount int64
	closed       chan struct{}

	mu      sync.Mutex
	pop     string
	content string        // the message text as stored, for Extend
	lease   time.Duration // the last lease asked for
	pending chan struct{} // closed when the last update has finished
}

// current waits for an update still in flight (see update) and returns the
// pop receipt and content.
func (r *receipt) current(ctx context.Context) (pop, content string, err error) {
	r.mu.Lock()
	pending := r.pending
	r.mu.Unlock()
	if pending != nil {
		select {
		case <-pending:
		case <-ctx.Done():
			return "", "", ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pop, r.content, nil
}

// update runs one UpdateMessage that ctx does not cut short. An update
// changes the pop receipt, so one abandoned halfway could succeed on the
// server and leave us with a dead receipt. When ctx ends first, update
// returns ctx.Err() and the request goes on (bounded by requestTimeout); its
// new receipt is kept, and the next call on the delivery waits for it.
func (r *receipt) update(ctx context.Context, content string, vis int32, lease time.Duration) error {
	pop, _, err := r.current(ctx)
	if err != nil {
		return err
	}
	done := make(chan struct{})
	var uerr error
	r.mu.Lock()
	r.pending = done
	r.mu.Unlock()
	r.b.bg.Add(1)
	go func() {
		defer r.b.bg.Done()
		defer close(done)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		resp, err := r.q.UpdateMessage(rctx, r.id, pop, content, &azqueue.UpdateMessageOptions{VisibilityTimeout: &vis})
		uerr = err
		if err == nil {
			r.mu.Lock()
			r.pop, r.content = *resp.PopReceipt, content
			if lease > 0 {
				r.lease = lease
			}
			r.mu.Unlock()
		}
	}()
	select {
	case <-done:
		return uerr
	case <-ctx.Done():
		return ctx.Err()
	}
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
	return driver.Capabilities{MaxBody: maxBody, MinLease: time.Second, RedeliversOnClose: false}
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

// Declare implements driver.Backend. It creates the work queue; dead-letter
// records are queues of their own, created as they are written.
func (b *Backend) Declare(ctx context.Context, queue string) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	n, err := b.names(queue)
	if err != nil {
		return err
	}
	return b.create(ctx, n.work)
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
	n, err := b.names(queue)
	if err != nil {
		return err
	}
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

// Receive implements driver.Backend. Azure cannot signal new work, so an
// empty queue is polled, the wait doubling from 10ms to Config.PollInterval.
func (b *Backend) Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	n, err := b.names(queue)
	if err != nil {
		return nil, err
	}
	if max <= 0 {
		return nil, fmt.Errorf("azure: receive: max %d: want a positive number", max)
	}
	max = min(max, 32)
	vis := max32(visibility(lease), 1)
	q := b.svc.NewQueueClient(n.work)
	wait := minPoll
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// The request is not cut short by ctx: a dequeue whose response were
		// dropped would count a delivery for every message it took. When ctx
		// ends meanwhile, the messages are handed back uncounted.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		resp, err := q.DequeueMessages(rctx, &azqueue.DequeueMessagesOptions{
			NumberOfMessages:  to.Ptr(int32(max)),
			VisibilityTimeout: to.Ptr(vis),
		})
		cancel()
		if err == nil && ctx.Err() != nil {
			b.handBack(queue, q, resp.Messages)
			return nil, ctx.Err()
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if b.isClosed() {
				return nil, driver.ErrClosed
			}
			return nil, fmt.Errorf("azure: receive from %s: %w", n.work, err)
		}
		var out []*driver.Delivery
		for _, m := range resp.Messages {
			if d := b.delivery(ctx, queue, q, m, lease); d != nil {
				out = append(out, d)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		if len(resp.Messages) > 0 {
			continue // all were early: look again at once
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-b.closed:
			t.Stop()
			return nil, driver.ErrClosed
		case <-t.C:
		}
		wait = min(wait*2, b.pollInterval)
	}
}

// requestTimeout bounds a receive request that ctx does not cut short.
const requestTimeout = 30 * time.Second

// handBack makes messages received for a caller that has gone visible again
// at once, with the base moved up by one so this receive is not counted.
func (b *Backend) handBack(queue string, q *azqueue.QueueClient, msgs []*azqueue.DequeuedMessage) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	for _, m := range msgs {
		if m.MessageText == nil {
			continue
		}
		f, err := decodeWork(*m.MessageText)
		if err != nil {
			continue // foreign: it comes back after its lease
		}
		// Uncount this receive only: earlier deliveries that ended without
		// an outcome still count.
		f.base++
		if _, err := q.UpdateMessage(ctx, *m.MessageID, *m.PopReceipt, f.encode(), &azqueue.UpdateMessageOptions{
			VisibilityTimeout: to.Ptr(int32(0)),
		}); err != nil {
			b.log.Warn("azure: handing back a message received after cancellation failed; it comes back after its lease, counted", "queue", queue, "err", err)
		}
	}
}

func max32(a, b int32) int32 {
	if a > b {
		return a
	}
	return b
}

// delivery turns a dequeued message into a Delivery, or hides it again and
// returns nil when it surfaced before its NotBefore (a delay over 7 days).
func (b *Backend) delivery(ctx context.Context, queue string, q *azqueue.QueueClient, m *azqueue.DequeuedMessage, lease time.Duration) *driver.Delivery {
	r := &receipt{b: b, q: q, id: *m.MessageID, pop: *m.PopReceipt, dequeueCount: *m.DequeueCount, lease: lease, closed: b.closed}
	if m.MessageText != nil {
		r.content = *m.MessageText
	}
	f, err := decodeWork(r.content)
	if err != nil {
		// Not ours: hand the raw text to the platform, which dead-letters it.
		return &driver.Delivery{Queue: queue, Body: []byte(r.content), Deliveries: int(r.dequeueCount), Handle: r}
	}
	if !f.notBefore.IsZero() {
		if early := time.Until(f.notBefore); early > 0 {
			// Surfaced early: hide it again. Not a delivery, so the base
			// moves up by one (earlier crashes of this copy still count).
			f.base++
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
			defer cancel()
			if _, err := q.UpdateMessage(ctx, r.id, r.pop, f.encode(), &azqueue.UpdateMessageOptions{
				VisibilityTimeout: to.Ptr(visibility(early)),
			}); err != nil && !leaseLost(err) {
				b.log.Warn("azure: hiding an early message again failed; it will surface after its lease", "queue", queue, "err", err)
			}
			return nil
		}
	}
	deliveries := int(r.dequeueCount - int64(f.base))
	if deliveries < 1 {
		deliveries = 1
	}
	return &driver.Delivery{Queue: queue, Body: f.body, Deliveries: deliveries, Handle: r}
}

// leaseLost reports whether err means the pop receipt no longer holds the
// message: it was deleted, or received (or updated) since.
func leaseLost(err error) bool {
	return queueerror.HasCode(err, queueerror.MessageNotFound, queueerror.PopReceiptMismatch, queueerror.QueueNotFound)
}

func (b *Backend) receipt(d *driver.Delivery) (*receipt, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	r, ok := d.Handle.(*receipt)
	if !ok || r == nil {
		return nil, fmt.Errorf("azure: delivery handle %T is not this backend's", d.Handle)
	}
	if r.closed != b.closed {
		return nil, fmt.Errorf("azure: delivery belongs to another backend: %w", driver.ErrLeaseLost)
	}
	return r, nil
}

func wrapSettle(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("azure: %s: %w", op, err)
	}
	if leaseLost(err) {
		return fmt.Errorf("azure: %s: %w (%v)", op, driver.ErrLeaseLost, err)
	}
	return fmt.Errorf("azure: %s: %w", op, err)
}

// Ack implements driver.Backend with DeleteMessage.
func (b *Backend) Ack(ctx context.Context, d *driver.Delivery) error {
	r, err := b.receipt(d)
	if err != nil {
		return err
	}
	pop, _, err := r.current(ctx)
	if err != nil {
		return err
	}
	_, err = r.q.DeleteMessage(ctx, r.id, pop, nil)
	return wrapSettle("ack", err)
}

// Extend implements driver.Backend with an UpdateMessage that keeps the
// content and sets the visibility timeout; the new pop receipt replaces the
// old one in the handle.
func (b *Backend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	r, err := b.receipt(d)
	if err != nil {
		return err
	}
	_, content, err := r.current(ctx)
	if err != nil {
		return err
	}
	return wrapSettle("extend", r.update(ctx, content, max32(visibility(lease), 1), lease))
}

// Requeue implements driver.Backend with one UpdateMessage: the new body, the
// base set to the current DequeueCount, and the visibility up to NotBefore.
func (b *Backend) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	r, err := b.receipt(d)
	if err != nil {
		return err
	}
	if len(msg.Body) > maxBody {
		return tooLarge(len(msg.Body))
	}
	text := workFrame{base: uint32(r.dequeueCount), notBefore: msg.NotBefore, body: msg.Body}.encode()
	var vis int32
	if !msg.NotBefore.IsZero() {
		vis = visibility(time.Until(msg.NotBefore))
	}
	return wrapSettle("requeue", r.update(ctx, text, vis, 0))
}

// Stats implements driver.Backend. Azure tells only an approximate count of
// all messages, visible or not, so Ready is counted with Peek when fewer
// than 32 are visible (else -1), and Scheduled and InFlight are -1.
func (b *Backend) Stats(ctx context.Context, queue string) (driver.Stats, error) {
	if b.isClosed() {
		return driver.Stats{}, driver.ErrClosed
	}
	n, err := b.names(queue)
	if err != nil {
		return driver.Stats{}, err
	}
	st := driver.Stats{Ready: -1, Scheduled: -1, InFlight: -1}
	resp, err := b.svc.NewQueueClient(n.work).PeekMessages(ctx, &azqueue.PeekMessagesOptions{NumberOfMessages: to.Ptr(int32(32))})
	if err != nil && !queueerror.HasCode(err, queueerror.QueueNotFound) {
		return driver.Stats{}, fmt.Errorf("azure: stats of %s: %w", n.work, err)
	}
	if len(resp.Messages) < 32 {
		st.Ready = int64(len(resp.Messages))
	}
	dead, err := b.countDead(ctx, n.dead)
	if err != nil {
		return driver.Stats{}, err
	}
	st.Dead = dead
	return st, nil
}

// DeleteQueue implements driver.QueueDeleter: it deletes the work queue and
// every dead-letter record queue of the queue.
func (b *Backend) DeleteQueue(ctx context.Context, queue string) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	n, err := b.names(queue)
	if err != nil {
		return err
	}
	if _, err := b.svc.DeleteQueue(ctx, n.work, nil); err != nil && !queueerror.HasCode(err, queueerror.QueueNotFound) {
		return fmt.Errorf("azure: delete queue %s: %w", n.work, err)
	}
	b.forget(n.work)
	_, err = b.purge(ctx, n.dead)
	return err
}

// Close implements driver.Backend. HTTP holds no per-delivery state, so
// unsettled deliveries simply reappear when their visibility timeout ends.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() { close(b.closed) })
	b.bg.Wait()
	return nil
}
