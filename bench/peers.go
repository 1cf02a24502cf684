package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	stdlog "log"
	"sync"
	"time"

	"github.com/RichardKnop/machinery/v2"
	nullbackend "github.com/RichardKnop/machinery/v2/backends/null"
	mamqp "github.com/RichardKnop/machinery/v2/brokers/amqp"
	mredis "github.com/RichardKnop/machinery/v2/brokers/redis"
	mconfig "github.com/RichardKnop/machinery/v2/config"
	eagerlock "github.com/RichardKnop/machinery/v2/locks/eager"
	mlog "github.com/RichardKnop/machinery/v2/log"
	"github.com/RichardKnop/machinery/v2/tasks"
	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/hibiken/asynq"
	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
)

// peer describes a peer library on one of our brokers.
type peer struct {
	name    string // as in the report: "asynq", "watermill", "machinery"
	backend string // the broker it runs on
	note    string // its durability and settings, for the report
	open    func(ctx context.Context, tag string, srv servers) (system, error)
}

// peers are the libraries we compare with, on the broker each shares with
// one of our backends.
var peers = []peer{
	{"asynq", "redis", "asynq v0.26.0 defaults (TaskCheckInterval 1s), lease-based recovery", openAsynq},
	{"watermill", "redis", "watermill-redisstream v1.4.5: consumer group, XACK; one subscriber per handler", openWatermillRedis},
	{"machinery", "redis", "machinery v2.0.13 go-redis broker: BLPOP, no ack (a crash loses the job), null result backend", openMachineryRedis},
	{"watermill", "rabbit", "watermill-amqp v3.0.2: durable quorum queue, persistent, publisher confirms, prefetch 1 per subscriber, one subscriber per handler", openWatermillAMQP},
	{"machinery", "rabbit", "machinery v2.0.13 AMQP broker: durable classic queue, persistent, confirms, prefetch = concurrency, null result backend", openMachineryAMQP},
	{"river", "postgres", "River v0.51.2, riverpgxv5, defaults (FetchCooldown 100 ms: a queue fetches at most MaxWorkers jobs per 100 ms; FetchPollInterval 1 s; LISTEN/NOTIFY wake-ups; completions batched), database bench_river on the same server", openRiver},
	{"river-fast", "postgres", "River as above with FetchCooldown at its minimum, 1 ms (FetchPollInterval 100 ms)", openRiverFast},
	{"watermill", "nats", "watermill-nats v2.1.3 jetstream: work-queue stream on file, durable grouped consumer, double ack; one subscription per handler", openWatermillNATS},
}

// ---- asynq ----

type asynqSys struct {
	opt    asynq.RedisClientOpt
	client *asynq.Client
	queue  string
}

func openAsynq(_ context.Context, tag string, srv servers) (system, error) {
	opt := asynq.RedisClientOpt{Addr: srv.Redis, PoolSize: 100}
	return &asynqSys{opt: opt, client: asynq.NewClient(opt), queue: "bench-" + tag}, nil
}

func (a *asynqSys) enqueue(ctx context.Context, p []byte) error {
	_, err := a.client.EnqueueContext(ctx, asynq.NewTask("bench", p), asynq.Queue(a.queue))
	return err
}

func (a *asynqSys) consume(_ context.Context, c int, handle func([]byte)) (func(), error) {
	srv := asynq.NewServer(a.opt, asynq.Config{
		Concurrency: c,
		Queues:      map[string]int{a.queue: 1},
		Logger:      nopLogger{},
		LogLevel:    asynq.FatalLevel,
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc("bench", func(_ context.Context, t *asynq.Task) error {
		handle(t.Payload())
		return nil
	})
	if err := srv.Start(mux); err != nil {
		return nil, err
	}
	return srv.Shutdown, nil
}

func (a *asynqSys) close() error {
	insp := asynq.NewInspector(a.opt)
	defer insp.Close()
	_ = insp.DeleteQueue(a.queue, true)
	// DeleteQueue leaves the queue's daily counters behind.
	rdb := goredis.NewClient(&goredis.Options{Addr: a.opt.Addr})
	defer rdb.Close()
	ctx := context.Background()
	keys, _ := rdb.Keys(ctx, "asynq:{"+a.queue+"}*").Result()
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
	return a.client.Close()
}

// nopLogger silences asynq.
type nopLogger struct{}

func (nopLogger) Debug(...any) {}
func (nopLogger) Info(...any)  {}
func (nopLogger) Warn(...any)  {}
func (nopLogger) Error(...any) {}
func (nopLogger) Fatal(...any) {}

// ---- watermill ----

// wmSys is a watermill publisher and a way to make subscribers; each
// handler gets a subscription of its own, as watermill subscribers handle
// one message at a time.
type wmSys struct {
	pub     message.Publisher
	topic   string
	newSub  func(phase, i int) (message.Subscriber, error)
	endSubs func(phase int) // after a consume's subscribers closed; may be nil
	cleanup func()
	phase   int
}

func (w *wmSys) enqueue(_ context.Context, p []byte) error {
	return w.pub.Publish(w.topic, message.NewMessage(watermill.NewUUID(), p))
}

func (w *wmSys) consume(ctx context.Context, c int, handle func([]byte)) (func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	var subs []message.Subscriber
	var wg sync.WaitGroup
	w.phase++
	phase := w.phase
	stop := func() {
		cancel()
		for _, s := range subs {
			_ = s.Close()
		}
		wg.Wait()
		if w.endSubs != nil {
			w.endSubs(phase)
		}
	}
	for i := range c {
		s, err := w.newSub(phase, i)
		if err != nil {
			stop()
			return nil, err
		}
		subs = append(subs, s)
		msgs, err := s.Subscribe(ctx, w.topic)
		if err != nil {
			stop()
			return nil, err
		}
		wg.Go(func() {
			for m := range msgs {
				handle(m.Payload)
				m.Ack()
			}
		})
	}
	return stop, nil
}

func (w *wmSys) close() error {
	err := w.pub.Close()
	w.cleanup()
	return err
}

func openWatermillRedis(_ context.Context, tag string, srv servers) (system, error) {
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Redis, PoolSize: 100})
	topic := "bench-" + tag
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: rdb}, watermill.NopLogger{})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &wmSys{
		pub:   pub,
		topic: topic,
		// Closing a subscriber closes its client: each gets its own.
		newSub: func(_, i int) (message.Subscriber, error) {
			return redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client:   goredis.NewClient(&goredis.Options{Addr: srv.Redis, PoolSize: 4}),
				Consumer: fmt.Sprintf("c%d", i), ConsumerGroup: "bench",
			}, watermill.NopLogger{})
		},
		cleanup: func() { // the publisher closed rdb
			c := goredis.NewClient(&goredis.Options{Addr: srv.Redis})
			c.Del(context.Background(), topic)
			c.Close()
		},
	}, nil
}

func openWatermillAMQP(_ context.Context, tag string, srv servers) (system, error) {
	topic := "bench-" + tag
	cfg := wamqp.NewDurableQueueConfig(srv.AMQP)
	cfg.Queue.Arguments = amqp.Table{"x-queue-type": "quorum"}
	cfg.Publish.ConfirmDelivery = true
	cfg.Publish.ChannelPoolSize = 10
	// The publisher does not declare the queue: a publish before any
	// subscriber declared it would be dropped.
	sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	err = sub.SubscribeInitialize(topic)
	sub.Close()
	if err != nil {
		return nil, err
	}
	pub, err := wamqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	return &wmSys{
		pub:   pub,
		topic: topic,
		newSub: func(int, int) (message.Subscriber, error) {
			return wamqp.NewSubscriber(cfg, watermill.NopLogger{})
		},
		cleanup: func() { deleteAMQPQueues(srv.AMQP, topic) },
	}, nil
}

func openWatermillNATS(ctx context.Context, tag string, srv servers) (system, error) {
	topic := "bench-" + tag
	if err := createWorkStream(ctx, srv.NATS, topic); err != nil {
		return nil, err
	}
	pub, err := wnats.NewPublisher(wnats.PublisherConfig{URL: srv.NATS, Logger: watermill.NopLogger{}})
	if err != nil {
		deleteStreams(srv.NATS, topic)
		return nil, err
	}
	return &wmSys{
		pub:   pub,
		topic: topic,
		// Each consume gets a durable consumer of its own, deleted after:
		// a closed subscription's pull requests outlive it on the server,
		// and messages sent to them would wait out the 30s AckWait.
		newSub: func(phase, _ int) (message.Subscriber, error) {
			return wnats.NewSubscriber(wnats.SubscriberConfig{
				URL: srv.NATS, Logger: watermill.NopLogger{},
				ResourceInitializer: wnats.GroupedConsumer(fmt.Sprintf("bench%d", phase)),
			})
		},
		endSubs: func(phase int) {
			deleteConsumer(srv.NATS, topic, fmt.Sprintf("watermill__bench%d__%s", phase, topic))
		},
		cleanup: func() { deleteStreams(srv.NATS, topic) },
	}, nil
}

// createWorkStream makes a work-queue stream on file named and subjected
// after topic.
func createWorkStream(ctx context.Context, url, topic string) error {
	nc, err := gonats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: topic, Subjects: []string{topic}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
	})
	return err
}

// deleteConsumer removes a JetStream consumer, ignoring errors.
func deleteConsumer(url, stream, name string) {
	nc, err := gonats.Connect(url)
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = js.DeleteConsumer(ctx, stream, name)
}

// deleteAMQPQueues deletes queues (and exchanges of the same names),
// ignoring errors.
func deleteAMQPQueues(url string, names ...string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	for _, n := range names {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(n, false, false, false)
			ch.Close()
		}
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(n, false, false)
			ch.Close()
		}
	}
}

// ---- machinery ----

// machinerySys enqueues through one server; each consume makes a server of
// its own, as stopping a worker closes its broker's connection.
type machinerySys struct {
	server    *machinery.Server
	newServer func(prefetch int) *machinery.Server
	cleanup   func()
}

func init() {
	quietLog := stdlog.New(io.Discard, "", 0)
	mlog.Set(quietLog)
}

func openMachineryAMQP(_ context.Context, tag string, srv servers) (system, error) {
	q := "bench-" + tag
	cnf := &mconfig.Config{
		Broker:        srv.AMQP,
		DefaultQueue:  q,
		NoUnixSignals: true,
		AMQP: &mconfig.AMQPConfig{
			Exchange: q, ExchangeType: "direct", BindingKey: q,
		},
	}
	newServer := func(prefetch int) *machinery.Server {
		c := *cnf
		amqpCnf := *cnf.AMQP
		amqpCnf.PrefetchCount = prefetch
		c.AMQP = &amqpCnf
		return machinery.NewServer(&c, mamqp.New(&c), nullbackend.New(), eagerlock.New())
	}
	return &machinerySys{server: newServer(1), newServer: newServer, cleanup: func() { deleteAMQPQueues(srv.AMQP, q) }}, nil
}

func openMachineryRedis(_ context.Context, tag string, srv servers) (system, error) {
	q := "bench-" + tag
	cnf := &mconfig.Config{
		Broker:        "redis://" + srv.Redis,
		DefaultQueue:  q,
		NoUnixSignals: true,
		Redis:         &mconfig.RedisConfig{MaxActive: 100, NormalTasksPollPeriod: 1000, DelayedTasksPollPeriod: 500},
	}
	newServer := func(int) *machinery.Server {
		return machinery.NewServer(cnf, mredis.NewGR(cnf, []string{srv.Redis}, 0), nullbackend.New(), eagerlock.New())
	}
	return &machinerySys{server: newServer(0), newServer: newServer, cleanup: func() {
		rdb := goredis.NewClient(&goredis.Options{Addr: srv.Redis})
		rdb.Del(context.Background(), q)
		rdb.Close()
	}}, nil
}

func (m *machinerySys) enqueue(ctx context.Context, p []byte) error {
	_, err := m.server.SendTaskWithContext(ctx, &tasks.Signature{
		Name: "bench",
		Args: []tasks.Arg{{Type: "string", Value: base64.StdEncoding.EncodeToString(p)}},
	})
	return err
}

func (m *machinerySys) consume(_ context.Context, c int, handle func([]byte)) (func(), error) {
	srv := m.newServer(c)
	if err := srv.RegisterTask("bench", func(s string) error {
		b, _ := base64.StdEncoding.DecodeString(s)
		handle(b)
		return nil
	}); err != nil {
		return nil, err
	}
	w := srv.NewWorker(fmt.Sprintf("bench-%d", time.Now().UnixNano()), c)
	errs := make(chan error, 1)
	w.LaunchAsync(errs)
	return func() {
		w.Quit()
		select {
		case <-errs:
		case <-time.After(10 * time.Second):
		}
	}, nil
}

func (m *machinerySys) close() error {
	m.cleanup()
	return nil
}
