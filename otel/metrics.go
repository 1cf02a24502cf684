package otel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	ap "github.com/asyncplatform/asyncplatform"
)

// Metrics records the platform's metrics; see the package documentation for
// their names. Make one with NewMetrics (or Instrument), give its Hooks to
// the platform's Config, and call ObserveQueues once the platform exists.
type Metrics struct {
	meter       metric.Meter
	attempts    metric.Int64Counter
	tries       metric.Int64Histogram
	duration    metric.Float64Histogram
	deadLetters metric.Int64Counter
	isolated    metric.Int64Counter
	types       *typeLabels
	queues      *typeLabels
}

// typeLabels chooses the label of a job type or a queue (see "Job type
// labels" in the package documentation): a known value by name, the first
// max other values that fit a label by name, every later one as other.
type typeLabels struct {
	known sync.Map // string → struct{}: declared, or a handler ran for it

	mu     sync.Mutex
	others map[string]struct{} // labeled by name though not known, at most max
	max    int
	other  string
}

func newTypeLabels(c Config) *typeLabels {
	return newLabels(c.JobTypes, c.MaxJobTypes, DefaultMaxJobTypes, OtherJobType)
}

func newQueueLabels(c Config) *typeLabels {
	return newLabels(c.Queues, c.MaxQueues, DefaultMaxQueues, OtherQueue)
}

// newLabels returns the labels of known values, max others (zero: def;
// negative: none) and other.
func newLabels(known []string, max, def int, other string) *typeLabels {
	l := &typeLabels{others: map[string]struct{}{}, max: max, other: other}
	if l.max == 0 {
		l.max = def
	}
	for _, t := range known {
		l.known.Store(t, struct{}{})
	}
	return l
}

// handled returns the label of a type a handler ran for, which is
// registered: its name.
func (l *typeLabels) handled(t string) string {
	if _, ok := l.known.Load(t); !ok {
		l.known.Store(t, struct{}{})
	}
	return t
}

// label returns the label of a type seen in a dead letter.
func (l *typeLabels) label(t string) string {
	if _, ok := l.known.Load(t); ok {
		return t
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.others[t]; ok {
		return t
	}
	if len(l.others) >= l.max || !fitLabel(t) {
		return l.other
	}
	l.others[t] = struct{}{}
	return t
}

// fitLabel reports whether t may be a label value: at most 100 bytes of
// printable UTF-8.
func fitLabel(t string) bool {
	if len(t) > 100 || !utf8.ValidString(t) {
		return false
	}
	for _, r := range t {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// Histogram bucket boundaries.
var (
	triesBuckets    = []float64{1, 2, 3, 4, 5, 6, 8, 11, 16, 21, 51, 101}
	durationBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
)

// ObserveTimeout bounds the broker calls of one collection of the observed
// gauges, so that a scrape never hangs on an unreachable broker.
const ObserveTimeout = 10 * time.Second

// NewMetrics makes the instruments with c's meter provider.
func NewMetrics(c Config) (*Metrics, error) {
	c = c.withDefaults()
	m := &Metrics{meter: c.MeterProvider.Meter(ScopeName), types: newTypeLabels(c), queues: newQueueLabels(c)}
	var err, e error
	m.attempts, e = m.meter.Int64Counter("asyncplatform.attempts",
		metric.WithDescription("Handler calls, by outcome."), metric.WithUnit("{attempt}"))
	err = errors.Join(err, e)
	m.tries, e = m.meter.Int64Histogram("asyncplatform.attempt.tries",
		metric.WithDescription("The job's try count at each attempt: 1 on its first."), metric.WithUnit("{try}"),
		metric.WithExplicitBucketBoundaries(triesBuckets...))
	err = errors.Join(err, e)
	m.duration, e = m.meter.Float64Histogram("asyncplatform.handler.duration",
		metric.WithDescription("Time spent in the handler per attempt."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	m.deadLetters, e = m.meter.Int64Counter("asyncplatform.dead_letters",
		metric.WithDescription("Jobs dead-lettered, by reason."), metric.WithUnit("{job}"))
	err = errors.Join(err, e)
	m.isolated, e = m.meter.Int64Counter("asyncplatform.attempts.isolated",
		metric.WithDescription("Attempts of suspects (jobs with a crash behind them) run alone in their process, by outcome."), metric.WithUnit("{attempt}"))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform/otel: making instruments: %w", err)
	}
	return m, nil
}

// Hooks returns hooks that record the attempt and dead-letter metrics and
// then call next's hooks, if set.
func (m *Metrics) Hooks(next ap.Hooks) ap.Hooks {
	return ap.Hooks{
		AfterAttempt: func(ctx context.Context, a ap.Attempt) {
			m.AfterAttempt(ctx, a)
			if next.AfterAttempt != nil {
				next.AfterAttempt(ctx, a)
			}
		},
		OnDeadLetter: func(ctx context.Context, dl ap.DeadLetter) {
			m.OnDeadLetter(ctx, dl)
			if next.OnDeadLetter != nil {
				next.OnDeadLetter(ctx, dl)
			}
		},
	}
}

// Middleware returns a middleware that notes the type of every job that
// reaches a handler as registered, so that its dead letters are labeled by
// name even when they come before the attempt is recorded (see "Job type
// labels" in the package documentation). Instrument adds it; give it to
// Config.Middleware when using Hooks without Instrument.
func (m *Metrics) Middleware() ap.Middleware {
	return func(next ap.Handler) ap.Handler {
		return func(ctx context.Context, j *ap.Job) error {
			m.types.handled(j.Type)
			m.queues.handled(queueOf(j.Queue))
			return next(ctx, j)
		}
	}
}

// AfterAttempt records one attempt; it is a Hooks.AfterAttempt.
func (m *Metrics) AfterAttempt(ctx context.Context, a ap.Attempt) {
	attrs := []attribute.KeyValue{keyQueue.String(m.queues.handled(queueOf(a.Job.Queue))), keyType.String(m.types.handled(a.Job.Type)), keyOutcome.String(string(a.Outcome))}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	if a.Outcome == ap.OutcomeDeadLettered {
		m.attempts.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(append(attrs, keyReason.String(string(a.Reason)))...)))
	} else {
		m.attempts.Add(ctx, 1, set)
	}
	m.tries.Record(ctx, int64(a.Job.TryCount), set)
	m.duration.Record(ctx, a.Duration.Seconds(), set)
	if a.Isolated {
		m.isolated.Add(ctx, 1, set)
	}
}

// OnDeadLetter counts one dead letter; it is a Hooks.OnDeadLetter.
func (m *Metrics) OnDeadLetter(ctx context.Context, dl ap.DeadLetter) {
	m.deadLetters.Add(ctx, 1, metric.WithAttributes(keyQueue.String(m.queues.label(queueOf(dl.Queue))), keyType.String(m.types.label(dl.Job.Type)), keyReason.String(string(dl.Reason))))
}

// ObserveQueues registers the queue gauges for the named queues of p: at
// each collection it reads Platform.Stats and the oldest dead letter of
// each queue (two broker calls per queue, bounded by ObserveTimeout). A
// depth the backend cannot tell (-1) is not reported, nor is the oldest
// ready job's age when the backend cannot tell it (QueueStats.ReadyAge). Unregister the
// returned registration to stop.
func (m *Metrics) ObserveQueues(p *ap.Platform, queues ...string) (metric.Registration, error) {
	if p == nil || len(queues) == 0 {
		return nil, errors.New("asyncplatform/otel: ObserveQueues needs a platform and at least one queue")
	}
	depth, err1 := m.meter.Int64ObservableGauge("asyncplatform.queue.depth",
		metric.WithDescription("Jobs in the queue, by state: ready, scheduled (delayed or in backoff), in_flight."), metric.WithUnit("{job}"))
	dead, err2 := m.meter.Int64ObservableGauge("asyncplatform.queue.dead",
		metric.WithDescription("Dead letters in the queue's dead-letter queue."), metric.WithUnit("{job}"))
	oldest, err3 := m.meter.Float64ObservableGauge("asyncplatform.queue.dead.oldest_age",
		metric.WithDescription("Time since the oldest dead letter of the queue died."), metric.WithUnit("s"))
	readyAge, err4 := m.meter.Float64ObservableGauge("asyncplatform.queue.ready.oldest_age",
		metric.WithDescription("Time the oldest ready job of the queue has waited since it became deliverable; 0 with none ready."), metric.WithUnit("s"))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, fmt.Errorf("asyncplatform/otel: making queue gauges: %w", err)
	}
	queues = append([]string(nil), queues...)
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, ObserveTimeout)
		defer cancel()
		var errs []error
		for _, q := range queues {
			qa := keyQueue.String(q)
			s, err := p.Stats(ctx, q)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, st := range []struct {
				state string
				n     int64
			}{{"ready", s.Ready}, {"scheduled", s.Scheduled}, {"in_flight", s.InFlight}} {
				if st.n >= 0 {
					o.ObserveInt64(depth, st.n, metric.WithAttributes(qa, keyState.String(st.state)))
				}
			}
			if s.Dead >= 0 {
				o.ObserveInt64(dead, s.Dead, metric.WithAttributes(qa))
			}
			if age, ok := s.ReadyAge(time.Now()); ok {
				o.ObserveFloat64(readyAge, age.Seconds(), metric.WithAttributes(qa))
			}
			if s.Dead == 0 {
				continue
			}
			page, err := p.DeadLetters(ctx, q, "", 1)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if len(page.Letters) > 0 {
				age := time.Since(page.Letters[0].DeadAt).Seconds()
				o.ObserveFloat64(oldest, max(age, 0), metric.WithAttributes(qa))
			}
		}
		return errors.Join(errs...)
	}, depth, dead, oldest, readyAge)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform/otel: registering the queue gauges: %w", err)
	}
	return reg, nil
}

// HistoryWindow is the span of the history gauges: ObserveHistory reports
// the attempts that ended in the minutes from the one holding
// HistoryWindow ago to now.
const HistoryWindow = 5 * time.Minute

// historyOutcomes name the outcomes of the history gauge.
const (
	historySucceeded    = "succeeded"
	historyFailed       = "failed"
	historyDeadLettered = "dead_lettered"
)

// ObserveHistory registers the history gauge: at each collection it reads
// Platform.History (one read of the backend's store, bounded by
// ObserveTimeout) and reports asyncplatform.history.attempts, the attempts
// that ended in the last HistoryWindow over every worker sharing the store,
// by queue, job type and outcome (succeeded, failed: to be retried,
// dead_lettered: after a handler call). Unlike the attempts counter, which
// each process counts for its own attempts, it is the same figure in every
// process: sum it over queues, not over processes. Job types and queues
// are labeled as in "Job type labels" in the package documentation: the
// store's series name queues of every worker, and anyone who can write to
// the store can forge them. Without a store the
// collection reports nothing and returns the error (matching
// asyncplatform.ErrNoStore). Unregister the returned registration to stop.
func (m *Metrics) ObserveHistory(p *ap.Platform) (metric.Registration, error) {
	if p == nil {
		return nil, errors.New("asyncplatform/otel: ObserveHistory needs a platform")
	}
	attempts, err := m.meter.Int64ObservableGauge("asyncplatform.history.attempts",
		metric.WithDescription("Attempts that ended in the last five minutes over every worker, by queue, job type and outcome (from the platform's history)."),
		metric.WithUnit("{attempt}"))
	if err != nil {
		return nil, fmt.Errorf("asyncplatform/otel: making the history gauge: %w", err)
	}
	type series struct{ queue, typ, outcome string }
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, ObserveTimeout)
		defer cancel()
		mins, err := p.History(ctx, time.Now().Add(-HistoryWindow))
		if err != nil {
			return err
		}
		sums := map[series]int64{}
		for _, mi := range mins {
			for _, s := range mi.Series {
				q, t := m.queues.label(queueOf(s.Queue)), m.types.label(s.Type)
				sums[series{q, t, historySucceeded}] += s.Succeeded
				sums[series{q, t, historyFailed}] += s.Failed
				sums[series{q, t, historyDeadLettered}] += s.DeadLettered
			}
		}
		for s, n := range sums {
			o.ObserveInt64(attempts, n, metric.WithAttributes(keyQueue.String(s.queue), keyType.String(s.typ), keyOutcome.String(s.outcome)))
		}
		return nil
	}, attempts)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform/otel: registering the history gauge: %w", err)
	}
	return reg, nil
}
