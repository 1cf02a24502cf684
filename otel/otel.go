// Package otel instruments an asyncplatform.Platform with OpenTelemetry:
// traces that follow a job from Enqueue to its handler, and metrics of
// attempts, tries, handler time, queue depths and dead letters. It is a
// package of its own so that the core library does not depend on
// OpenTelemetry. Import it under another name, since its name is the SDK's:
//
//	import apotel "github.com/asyncplatform/asyncplatform/otel"
//
//	cfg := asyncplatform.Config{...}
//	m, err := apotel.Instrument(&cfg, apotel.Config{}) // the global providers
//	p, err := asyncplatform.New(backend, cfg)
//	reg, err := m.ObserveQueues(p, "emails", "billing")
//	defer reg.Unregister()
//
// # Traces
//
// EnqueueMiddleware starts a producer span "send QUEUE" per job and injects
// its context into the job's Headers with the W3C trace-context (and baggage)
// propagator. Middleware extracts it when the job is delivered and runs the
// handler in a consumer span "process QUEUE", a child of the producer span:
// one trace from Enqueue to every attempt of the job, retries included (the
// headers travel with the job). Spans carry messaging.system
// ("asyncplatform"), messaging.destination.name (the queue),
// messaging.message.id (the job ID), messaging.operation.type,
// asyncplatform.job.type and, on process spans, asyncplatform.job.try_count.
//
// # Metrics
//
// Recorded from Config.Hooks (see Metrics.Hooks):
//
//	asyncplatform.attempts            counter    handler calls, by queue, job type, outcome (and reason when dead-lettered)
//	asyncplatform.attempt.tries       histogram  the job's try count at each attempt, by queue, job type, outcome
//	asyncplatform.handler.duration    histogram  seconds in the handler, by queue, job type, outcome
//	asyncplatform.dead_letters        counter    jobs dead-lettered, by queue, job type, reason (poisoned, expired and unhandled jobs included)
//
// Observed from Platform.Stats and Platform.DeadLetters at each collection
// (see Metrics.ObserveQueues):
//
//	asyncplatform.queue.depth             gauge  jobs by queue and state: ready, scheduled, in_flight
//	asyncplatform.queue.dead              gauge  dead letters, by queue
//	asyncplatform.queue.dead.oldest_age   gauge  seconds since the oldest dead letter died, by queue (absent when there is none)
//	asyncplatform.queue.ready.oldest_age  gauge  seconds the oldest ready job has waited since it became deliverable, by queue (0 with none ready; absent when the backend cannot tell)
//
// Observed from Platform.History at each collection (see
// Metrics.ObserveHistory), the same figures in every process:
//
//	asyncplatform.history.attempts  gauge  attempts that ended in the last HistoryWindow (5 min) over every worker, by queue, job type, outcome (succeeded, failed, dead_lettered)
//
// The attributes are asyncplatform.queue, asyncplatform.job.type,
// asyncplatform.outcome, asyncplatform.reason and asyncplatform.state. A
// Prometheus exporter shows them as asyncplatform_attempts_total{asyncplatform_queue="emails",...}.
//
// # Job type labels
//
// A job's type comes from the message, which anyone who can write to the
// broker writes, so the asyncplatform.job.type label is bounded: every new
// value would be a new series in the metrics backend. A type is labeled by
// name when a handler ran for it (it is registered with Platform.Handle; it
// is noted by Metrics.Middleware, which Instrument adds, and by
// AfterAttempt), when it is in Config.JobTypes, or when it is one of the first
// Config.MaxJobTypes (DefaultMaxJobTypes, 100) distinct other types seen, of
// at most 100 bytes of printable UTF-8: these appear only in dead letters
// (unhandled, invalid, expired, payload_missing…). Every other type is
// labeled OtherJobType ("other"). A registered type dead-lettered before any
// of its jobs reached its handler may be labeled "other" once the bound is
// reached; list it in Config.JobTypes to have it by name from the start.
// Queue labels are bounded the same way: a queue is labeled by name when a
// handler ran on it (a worker serves the queues it is configured with),
// when it is in Config.Queues (Instrument adds the platform's configured
// queues), or when it is one of the first Config.MaxQueues
// (DefaultMaxQueues, 100) distinct other queues seen, of at most 100 bytes
// of printable UTF-8: these come from dead letters and from the history in
// the store (Metrics.ObserveHistory), which other workers and anyone who
// can write to the store write. Every other queue is labeled OtherQueue
// ("other"). Spans carry the job type and queue as they are (they are not
// series).
package otel

import (
	gotel "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	ap "github.com/asyncplatform/asyncplatform"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/asyncplatform/asyncplatform/otel"

// Config chooses the OpenTelemetry providers. The zero value uses the
// global ones.
type Config struct {
	// TracerProvider makes the tracer. Defaults to the global provider
	// (go.opentelemetry.io/otel.GetTracerProvider).
	TracerProvider trace.TracerProvider

	// MeterProvider makes the meter. Defaults to the global provider
	// (go.opentelemetry.io/otel.GetMeterProvider).
	MeterProvider metric.MeterProvider

	// Propagator carries the trace context in job headers. Defaults to the
	// W3C trace context and baggage propagators.
	Propagator propagation.TextMapPropagator

	// JobTypes are job types the metrics label by name from the start,
	// besides those a handler ran for (which are registered, so bounded).
	// See "Job type labels" in the package documentation.
	JobTypes []string

	// MaxJobTypes bounds the other job types, seen only in dead letters,
	// that the metrics label by name: the first MaxJobTypes distinct ones
	// are, later ones are labeled OtherJobType. Defaults to
	// DefaultMaxJobTypes; a negative value labels every one of them
	// OtherJobType.
	MaxJobTypes int

	// Queues are queues the metrics label by name from the start, besides
	// those a handler ran on. Instrument adds the queues of the platform's
	// Config. Defaults to none.
	Queues []string

	// MaxQueues bounds the other queues, seen in dead letters and in the
	// store's history, that the metrics label by name: the first MaxQueues
	// distinct ones are, later ones are labeled OtherQueue. Defaults to
	// DefaultMaxQueues; a negative value labels every one of them
	// OtherQueue.
	MaxQueues int
}

// DefaultMaxQueues is the default of Config.MaxQueues.
const DefaultMaxQueues = 100

// OtherQueue is the queue label of a job whose queue the metrics do not
// label by name.
const OtherQueue = "other"

// DefaultMaxJobTypes is the default of Config.MaxJobTypes.
const DefaultMaxJobTypes = 100

// OtherJobType is the job type label of a job whose type the metrics do not
// label by name.
const OtherJobType = "other"

func (c Config) withDefaults() Config {
	if c.TracerProvider == nil {
		c.TracerProvider = gotel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = gotel.GetMeterProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return c
}

// Attribute keys.
const (
	keyQueue   = attribute.Key("asyncplatform.queue")
	keyType    = attribute.Key("asyncplatform.job.type")
	keyOutcome = attribute.Key("asyncplatform.outcome")
	keyReason  = attribute.Key("asyncplatform.reason")
	keyState   = attribute.Key("asyncplatform.state")
	keyTry     = attribute.Key("asyncplatform.job.try_count")

	keySystem    = attribute.Key("messaging.system")
	keyDest      = attribute.Key("messaging.destination.name")
	keyMessageID = attribute.Key("messaging.message.id")
	keyOperation = attribute.Key("messaging.operation.type")
)

// Instrument adds tracing (EnqueueMiddleware first, Middleware first), the
// metrics' hooks (before hooks already set) and Metrics.Middleware to cfg,
// and returns the Metrics so that the caller can observe queue depths once
// the platform exists (Metrics.ObserveQueues). The queues of cfg are
// labeled by name (see "Job type labels" in the package documentation).
func Instrument(cfg *ap.Config, c Config) (*Metrics, error) {
	m, err := NewMetrics(c)
	if err != nil {
		return nil, err
	}
	for q := range cfg.Queues {
		m.queues.known.Store(q, struct{}{})
	}
	tracing, note := Middleware(c), m.Middleware()
	cfg.Middleware = append([]ap.Middleware{func(next ap.Handler) ap.Handler { return tracing(note(next)) }}, cfg.Middleware...)
	cfg.EnqueueMiddleware = append([]ap.EnqueueMiddleware{EnqueueMiddleware(c)}, cfg.EnqueueMiddleware...)
	cfg.Hooks = m.Hooks(cfg.Hooks)
	return m, nil
}
