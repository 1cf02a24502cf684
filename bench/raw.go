package main

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// The raw systems are each broker's own client doing the same durable work
// as our backend, with nothing else: batch is 1 for one job per round trip,
// more for the batched ceiling.

// newRaw returns the raw system of a backend.
func newRaw(ctx context.Context, backend, tag string, batch int, srv servers) (system, error) {
	name := "bench-" + tag
	switch backend {
	case "memory":
		return &rawMemory{be: memory.NewBroker().Connect(), queue: name, batch: batch}, nil
	case "redis":
		rdb := goredis.NewClient(&goredis.Options{Addr: srv.Redis, PoolSize: 100})
		return &rawRedis{rdb: rdb, ready: name + ":ready", proc: name + ":processing", batch: batch}, nil
	case "rabbit":
		return newRawRabbit(srv.AMQP, name, batch)
	case "nats":
		return newRawNATS(ctx, srv.NATS, name, batch)
	case "postgres":
		return newRawPostgres(ctx, srv.Postgres, tag, batch)
	case "azure":
		if srv.Azure == "" {
			return nil, fmt.Errorf("%w: no Azurite connection string", errUnavailable)
		}
		return newRawAzure(ctx, srv.Azure, name, batch)
	case "sqlite":
		be, done, err := openSQLite(ctx, tag+"-raw", true)
		if err != nil {
			return nil, err
		}
		return &rawMemory{be: be, queue: name, batch: batch, done: done}, nil
	}
	return nil, fmt.Errorf("unknown backend %q", backend)
}

// workers runs c copies of loop until stop is called; loop returns when
// its context ends.
func workers(c int, loop func(ctx context.Context)) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() { loop(ctx) })
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// ---- memory: the driver without the platform ----

type rawMemory struct {
	be    driver.Backend
	queue string
	batch int
	done  func() // after Close, when set
}

func (r *rawMemory) enqueue(ctx context.Context, p []byte) error {
	return r.be.Enqueue(ctx, r.queue, []driver.Message{{Body: p}})
}

func (r *rawMemory) consume(_ context.Context, c int, handle func([]byte)) (func(), error) {
	return workers(c, func(ctx context.Context) {
		for {
			ds, err := r.be.Receive(ctx, r.queue, r.batch, 30*time.Second)
			if err != nil {
				return
			}
			for _, d := range ds {
				handle(d.Body)
				_ = r.be.Ack(context.Background(), d)
			}
		}
	}), nil
}

func (r *rawMemory) close() error {
	err := r.be.Close()
	if r.done != nil {
		r.done()
	}
	return err
}

// ---- Redis: LPUSH in, BLMOVE to a processing list, LREM to ack ----

type rawRedis struct {
	rdb         *goredis.Client
	ready, proc string
	batch       int
	seq         atomic.Uint64
}

// value makes p unique (LREM removes by value) with a sequence number in
// bytes 8 to 16.
func (r *rawRedis) value(p []byte) []byte {
	binary.BigEndian.PutUint64(p[8:], r.seq.Add(1))
	return p
}

func (r *rawRedis) enqueue(ctx context.Context, p []byte) error {
	return r.rdb.LPush(ctx, r.ready, r.value(p)).Err()
}

func (r *rawRedis) enqueueBatch(ctx context.Context, ps [][]byte) error {
	vals := make([]any, len(ps))
	for i, p := range ps {
		vals[i] = r.value(p)
	}
	return r.rdb.LPush(ctx, r.ready, vals...).Err()
}

func (r *rawRedis) consume(_ context.Context, c int, handle func([]byte)) (func(), error) {
	return workers(c, func(ctx context.Context) {
		for ctx.Err() == nil {
			var got []string
			if r.batch > 1 {
				cmds := make([]*goredis.StringCmd, r.batch)
				_, _ = r.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
					for i := range cmds {
						cmds[i] = p.LMove(ctx, r.ready, r.proc, "RIGHT", "LEFT")
					}
					return nil
				})
				for _, c := range cmds {
					if v, err := c.Result(); err == nil {
						got = append(got, v)
					}
				}
			}
			if len(got) == 0 { // one per round trip, or an empty queue: block
				v, err := r.rdb.BLMove(ctx, r.ready, r.proc, "RIGHT", "LEFT", time.Second).Result()
				if err != nil {
					continue
				}
				got = append(got, v)
			}
			for _, v := range got {
				handle([]byte(v))
			}
			if len(got) == 1 {
				r.rdb.LRem(context.Background(), r.proc, 1, got[0])
				continue
			}
			_, _ = r.rdb.Pipelined(context.Background(), func(p goredis.Pipeliner) error {
				for _, v := range got {
					p.LRem(context.Background(), r.proc, 1, v)
				}
				return nil
			})
		}
	}), nil
}

func (r *rawRedis) close() error {
	r.rdb.Del(context.Background(), r.ready, r.proc)
	return r.rdb.Close()
}

// ---- RabbitMQ: quorum queue, persistent, confirms, manual ack ----

type rawRabbit struct {
	url   string
	conn  *amqp.Connection
	pub   *amqp.Channel
	queue string
	batch int
}

func newRawRabbit(url, queue string, batch int) (*rawRabbit, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	r := &rawRabbit{url: url, conn: conn, queue: queue, batch: batch}
	if r.pub, err = conn.Channel(); err == nil {
		err = r.pub.Confirm(false)
	}
	if err == nil {
		_, err = r.pub.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	returns := r.pub.NotifyReturn(make(chan amqp.Return, 16))
	go func() {
		for range returns { // drained so the client never blocks; none expected
		}
	}()
	return r, nil
}

func (r *rawRabbit) publish(ctx context.Context, p []byte) (*amqp.DeferredConfirmation, error) {
	return r.pub.PublishWithDeferredConfirmWithContext(ctx, "", r.queue, true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, Body: p,
	})
}

func (r *rawRabbit) enqueue(ctx context.Context, p []byte) error {
	dc, err := r.publish(ctx, p)
	if err != nil {
		return err
	}
	if ok, err := dc.WaitContext(ctx); !ok {
		return errors.Join(errors.New("publish nacked"), err)
	}
	return nil
}

func (r *rawRabbit) enqueueBatch(ctx context.Context, ps [][]byte) error {
	dcs := make([]*amqp.DeferredConfirmation, 0, len(ps))
	for _, p := range ps {
		dc, err := r.publish(ctx, p)
		if err != nil {
			return err
		}
		dcs = append(dcs, dc)
	}
	for _, dc := range dcs {
		if ok, err := dc.WaitContext(ctx); !ok {
			return errors.Join(errors.New("publish nacked"), err)
		}
	}
	return nil
}

// consume takes deliveries with a prefetch of 2c (the platform's window).
// One per round trip: c goroutines each ack their delivery. Batched: one
// goroutine acks with multiple set every c deliveries, or at once when no
// other delivery is waiting.
func (r *rawRabbit) consume(_ context.Context, c int, handle func([]byte)) (func(), error) {
	ch, err := r.conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(2*c, 0, false); err != nil {
		return nil, err
	}
	dl, err := ch.Consume(r.queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	if r.batch == 1 {
		for range c {
			wg.Go(func() {
				for d := range dl {
					handle(d.Body)
					_ = d.Ack(false)
				}
			})
		}
	} else {
		wg.Go(func() {
			var last *amqp.Delivery
			n := 0
			for {
				var d amqp.Delivery
				var ok bool
				if last != nil {
					select {
					case d, ok = <-dl:
					default:
						_ = last.Ack(true)
						last, n = nil, 0
						continue
					}
				} else {
					d, ok = <-dl
				}
				if !ok {
					return
				}
				handle(d.Body)
				last = &d
				if n++; n == c {
					_ = last.Ack(true)
					last, n = nil, 0
				}
			}
		})
	}
	return func() {
		ch.Close()
		wg.Wait()
	}, nil
}

func (r *rawRabbit) close() error {
	r.conn.Close()
	deleteAMQPQueues(r.url, r.queue)
	return nil
}

// ---- NATS JetStream: work-queue stream on file, pull consumer, double ack ----

type rawNATS struct {
	nc      *gonats.Conn
	js      jetstream.JetStream
	stream  string
	subject string
	cons    jetstream.Consumer
	batch   int
}

func newRawNATS(ctx context.Context, url, stream string, batch int) (*rawNATS, error) {
	nc, err := gonats.Connect(url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	r := &rawNATS{nc: nc, js: js, stream: stream, subject: stream + ".q", batch: batch}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{stream + ".>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
	})
	if err == nil {
		r.cons, err = s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: -1,
		})
	}
	if err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *rawNATS) enqueue(ctx context.Context, p []byte) error {
	_, err := r.js.Publish(ctx, r.subject, p)
	return err
}

func (r *rawNATS) enqueueBatch(ctx context.Context, ps [][]byte) error {
	futs := make([]jetstream.PubAckFuture, 0, len(ps))
	for _, p := range ps {
		f, err := r.js.PublishAsync(r.subject, p)
		if err != nil {
			return err
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *rawNATS) consume(_ context.Context, c int, handle func([]byte)) (func(), error) {
	return workers(c, func(ctx context.Context) {
		for ctx.Err() == nil {
			mb, err := r.cons.Fetch(r.batch, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				continue
			}
			for m := range mb.Messages() {
				handle(m.Data())
				_ = m.DoubleAck(context.Background())
			}
		}
	}), nil
}

func (r *rawNATS) close() error {
	_ = r.js.DeleteStream(context.Background(), r.stream)
	r.nc.Close()
	return nil
}

// deleteStreams removes JetStream streams by name, ignoring errors.
func deleteStreams(url string, names ...string) {
	nc, err := gonats.Connect(url)
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range names {
		_ = js.DeleteStream(ctx, n)
	}
}

// ---- Azure Queue Storage: base64 text, TTL -1, dequeue and delete ----

type rawAzure struct {
	q     *azqueue.QueueClient
	batch int
}

func newRawAzure(ctx context.Context, conn, queue string, batch int) (*rawAzure, error) {
	svc, err := azqueue.NewServiceClientFromConnectionString(conn, nil)
	if err != nil {
		return nil, err
	}
	q := svc.NewQueueClient(queue)
	if _, err := q.Create(ctx, nil); err != nil {
		return nil, err
	}
	return &rawAzure{q: q, batch: batch}, nil
}

func (r *rawAzure) enqueue(ctx context.Context, p []byte) error {
	_, err := r.q.EnqueueMessage(ctx, base64.StdEncoding.EncodeToString(p), &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))})
	return err
}

func (r *rawAzure) consume(_ context.Context, c int, handle func([]byte)) (func(), error) {
	return workers(c, func(ctx context.Context) {
		for ctx.Err() == nil {
			resp, err := r.q.DequeueMessages(ctx, &azqueue.DequeueMessagesOptions{
				NumberOfMessages: to.Ptr(int32(r.batch)), VisibilityTimeout: to.Ptr(int32(30)),
			})
			if err != nil || len(resp.Messages) == 0 {
				select {
				case <-time.After(10 * time.Millisecond):
				case <-ctx.Done():
				}
				continue
			}
			for _, m := range resp.Messages {
				b, _ := base64.StdEncoding.DecodeString(*m.MessageText)
				handle(b)
				_, _ = r.q.DeleteMessage(context.Background(), *m.MessageID, *m.PopReceipt, nil)
			}
		}
	}), nil
}

func (r *rawAzure) close() error {
	_, err := r.q.Delete(context.Background(), nil)
	return err
}

// releaseRaw closes a raw system's connections and leaves what it made on
// the broker, for a worker process working its parent's queue.
func releaseRaw(s system) {
	switch r := s.(type) {
	case *rawRedis:
		r.rdb.Close()
	case *rawRabbit:
		r.conn.Close()
	case *rawNATS:
		r.nc.Close()
	case *rawPostgres:
		r.pool.Close()
	}
}
