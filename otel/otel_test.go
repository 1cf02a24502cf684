package otel_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	apotel "github.com/asyncplatform/asyncplatform/otel"
)

// start makes a platform on the memory backend with cfg, registers the
// handlers and starts it; Stop and Close are cleanups.
func start(t *testing.T, cfg ap.Config, handlers map[string]ap.Handler) *ap.Platform {
	t.Helper()
	b := memory.NewBroker().Connect()
	t.Cleanup(func() { b.Close() })
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.Policy.BackoffBase == 0 {
		cfg.Policy.BackoffBase, cfg.Policy.BackoffCap = time.Millisecond, 2*time.Millisecond
	}
	p, err := ap.New(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for typ, h := range handlers {
		if err := p.Handle(typ, h); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(ctx) })
	return p
}

// wait receives n values from ch, or fails the test after a minute (a
// safety net, not an assertion on time).
func wait[T any](t *testing.T, ch <-chan T, n int) []T {
	t.Helper()
	var out []T
	for range n {
		select {
		case v := <-ch:
			out = append(out, v)
		case <-time.After(time.Minute):
			t.Fatalf("got %d of %d events", len(out), n)
		}
	}
	return out
}

func spansNamed(sr *tracetest.SpanRecorder, name string, traceID trace.TraceID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name && s.SpanContext().TraceID() == traceID {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// One trace spans Enqueue and every attempt of the job, retries included.
func TestTraceFromEnqueueToHandler(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	c := apotel.Config{TracerProvider: tp}

	type seen struct {
		job  *ap.Job
		span trace.SpanContext
	}
	handled := make(chan seen, 10)
	attempts := make(chan ap.Attempt, 10)
	p := start(t, ap.Config{
		Queues:            map[string]ap.QueueConfig{"q": {}},
		Middleware:        []ap.Middleware{apotel.Middleware(c)},
		EnqueueMiddleware: []ap.EnqueueMiddleware{apotel.EnqueueMiddleware(c)},
		Hooks:             ap.Hooks{AfterAttempt: func(_ context.Context, a ap.Attempt) { attempts <- a }},
	}, map[string]ap.Handler{
		"flaky": func(ctx context.Context, j *ap.Job) error {
			handled <- seen{j, trace.SpanContextFromContext(ctx)}
			if j.TryCount == 1 {
				return errors.New("try again")
			}
			return nil
		},
	})

	ctx, request := tp.Tracer("test").Start(context.Background(), "request")
	job := &ap.Job{Type: "flaky", Queue: "q", Headers: map[string]string{"tenant": "acme"}}
	if err := p.Enqueue(ctx, job); err != nil {
		t.Fatal(err)
	}
	request.End()
	got := wait(t, handled, 2)
	wait(t, attempts, 2)

	traceID := request.SpanContext().TraceID()
	sends := spansNamed(sr, "send q", traceID)
	if len(sends) != 1 {
		t.Fatalf("%d send spans in the request's trace, want 1", len(sends))
	}
	send := sends[0]
	if send.SpanKind() != trace.SpanKindProducer || send.Parent().SpanID() != request.SpanContext().SpanID() {
		t.Errorf("send span: kind %v, parent %v; want a producer child of the request", send.SpanKind(), send.Parent().SpanID())
	}
	if attr(send, "messaging.message.id").AsString() != job.ID || attr(send, "asyncplatform.job.type").AsString() != "flaky" {
		t.Errorf("send span attributes: %v", send.Attributes())
	}
	if got[0].job.Headers["traceparent"] == "" || got[0].job.Headers["tenant"] != "acme" {
		t.Errorf("the handler's job headers: %v", got[0].job.Headers)
	}

	procs := spansNamed(sr, "process q", traceID)
	if len(procs) != 2 {
		t.Fatalf("%d process spans in the request's trace, want 2 (a retry)", len(procs))
	}
	for i, s := range procs {
		if s.SpanKind() != trace.SpanKindConsumer || s.Parent().SpanID() != send.SpanContext().SpanID() {
			t.Errorf("process span %d: kind %v, parent %v; want a consumer child of the send span", i, s.SpanKind(), s.Parent().SpanID())
		}
		if !s.SpanContext().Equal(got[i].span) {
			t.Errorf("the handler's context does not hold process span %d", i)
		}
		if try := attr(s, "asyncplatform.job.try_count").AsInt64(); try != int64(i+1) {
			t.Errorf("process span %d: try count %d", i, try)
		}
	}
	if procs[0].Status().Code != codes.Error || procs[0].Status().Description != "try again" || procs[1].Status().Code != codes.Unset {
		t.Errorf("statuses %v, %v; want Error then Unset", procs[0].Status(), procs[1].Status())
	}
}

// A panic ends the span with an error and still reaches the platform, which
// keeps the stack; Reject is not an error.
func TestTracePanicAndReject(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	c := apotel.Config{TracerProvider: tp}
	dead := make(chan ap.DeadLetter, 1)
	attempts := make(chan ap.Attempt, 10)
	var busyCalls atomic.Int32
	p := start(t, ap.Config{
		Queues:            map[string]ap.QueueConfig{"q": {}},
		Policy:            ap.Policy{RetryLimit: ap.Limit(0)},
		RejectDelay:       time.Millisecond,
		Middleware:        []ap.Middleware{apotel.Middleware(c)},
		EnqueueMiddleware: []ap.EnqueueMiddleware{apotel.EnqueueMiddleware(c)},
		Hooks: ap.Hooks{
			OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl },
			AfterAttempt: func(_ context.Context, a ap.Attempt) { attempts <- a },
		},
	}, map[string]ap.Handler{
		"boom": func(context.Context, *ap.Job) error { panic("kaboom") },
		"busy": func(context.Context, *ap.Job) error {
			if busyCalls.Add(1) == 1 {
				return ap.Reject(errors.New("db down"))
			}
			return nil
		},
	})
	ctx, request := tp.Tracer("test").Start(context.Background(), "request")
	if err := p.Enqueue(ctx, &ap.Job{Type: "boom", Queue: "q"}); err != nil {
		t.Fatal(err)
	}
	dl := wait(t, dead, 1)[0]
	wait(t, attempts, 1)
	if !strings.Contains(dl.Error, "kaboom") || !strings.Contains(dl.Error, "goroutine") {
		t.Errorf("the dead letter lost the panic or its stack: %q", dl.Error)
	}
	procs := spansNamed(sr, "process q", request.SpanContext().TraceID())
	if len(procs) != 1 || procs[0].Status().Code != codes.Error || procs[0].Status().Description != "panic: kaboom" {
		t.Fatalf("process spans after a panic: %v", procs)
	}

	ctx, request2 := tp.Tracer("test").Start(context.Background(), "request")
	if err := p.Enqueue(ctx, &ap.Job{Type: "busy", Queue: "q"}); err != nil {
		t.Fatal(err)
	}
	as := wait(t, attempts, 2)
	if as[0].Outcome != ap.OutcomeRejected || as[1].Outcome != ap.OutcomeSucceeded {
		t.Fatalf("outcomes %v, %v", as[0].Outcome, as[1].Outcome)
	}
	procs = spansNamed(sr, "process q", request2.SpanContext().TraceID())
	if len(procs) != 2 || procs[0].Status().Code != codes.Unset || len(procs[0].Events()) != 1 || procs[0].Events()[0].Name != "rejected" {
		t.Errorf("a rejected attempt's span: %+v", procs[0])
	}
}

// A batch gets a span per job, and jobs sharing a headers map do not share
// their trace context.
func TestTraceBatch(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	b := memory.NewBroker().Connect()
	defer b.Close()
	p, err := ap.New(b, ap.Config{EnqueueMiddleware: []ap.EnqueueMiddleware{apotel.EnqueueMiddleware(apotel.Config{TracerProvider: tp})}})
	if err != nil {
		t.Fatal(err)
	}
	shared := map[string]string{"tenant": "acme"}
	jobs := []*ap.Job{{Type: "a", Headers: shared}, {Type: "b", Headers: shared}}
	if err := p.EnqueueBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	if len(shared) != 1 {
		t.Errorf("the caller's map was changed: %v", shared)
	}
	if jobs[0].Headers["traceparent"] == "" || jobs[0].Headers["traceparent"] == jobs[1].Headers["traceparent"] {
		t.Errorf("trace contexts %q and %q", jobs[0].Headers["traceparent"], jobs[1].Headers["traceparent"])
	}
	if n := len(sr.Ended()); n != 2 {
		t.Errorf("%d spans, want 2", n)
	}
	// A refused job's span records the error.
	sr.Reset()
	if err := p.Enqueue(context.Background(), &ap.Job{}); !errors.Is(err, ap.ErrInvalidJob) {
		t.Fatalf("Enqueue of a job with no type: %v", err)
	}
	if spans := sr.Ended(); len(spans) != 1 || spans[0].Status().Code != codes.Error {
		t.Errorf("spans of a refused job: %v", spans)
	}
}

// points indexes a metric's data points by their attributes, "k=v,k=v".
type points map[string]float64

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != apotel.ScopeName {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func key(s attribute.Set) string { return s.Encoded(attribute.DefaultEncoder()) }

// values returns the value of each data point (a histogram's count, and its
// sum under "sum:"+attributes).
func values(t *testing.T, data metricdata.Aggregation) points {
	t.Helper()
	out := points{}
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out[key(p.Attributes)] = float64(p.Value)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out[key(p.Attributes)] = float64(p.Value)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			out[key(p.Attributes)] = p.Value
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			out[key(p.Attributes)] = float64(p.Count)
			out["sum:"+key(p.Attributes)] = float64(p.Sum)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out[key(p.Attributes)] = float64(p.Count)
			out["sum:"+key(p.Attributes)] = p.Sum
		}
	case nil:
	default:
		t.Fatalf("unexpected aggregation %T", data)
	}
	return out
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	attempts := make(chan ap.Attempt, 10)
	dead := make(chan ap.DeadLetter, 10)
	cfg := ap.Config{
		Queues:           map[string]ap.QueueConfig{"q": {}},
		UnhandledRetries: ap.Limit(0),
		Hooks: ap.Hooks{
			AfterAttempt: func(_ context.Context, a ap.Attempt) { attempts <- a },
			OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl },
		},
	}
	m, err := apotel.Instrument(&cfg, apotel.Config{MeterProvider: mp, TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, cfg, map[string]ap.Handler{
		"ok": func(context.Context, *ap.Job) error { return nil },
		"flaky": func(_ context.Context, j *ap.Job) error {
			if j.TryCount == 1 {
				return errors.New("try again")
			}
			return nil
		},
		"bad": func(context.Context, *ap.Job) error { return ap.Invalid(errors.New("not JSON")) },
	})
	ctx := context.Background()
	for _, typ := range []string{"ok", "ok", "flaky", "bad", "unknown"} {
		if err := p.Enqueue(ctx, &ap.Job{Type: typ, Queue: "q"}); err != nil {
			t.Fatal(err)
		}
	}
	wait(t, attempts, 5) // ok, ok, flaky ×2, bad
	wait(t, dead, 2)     // bad, unknown
	if err := p.Enqueue(ctx, &ap.Job{Type: "ok", Queue: "q", NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	reg, err := m.ObserveQueues(p, "q")
	if err != nil {
		t.Fatal(err)
	}

	data := collect(t, reader)
	const q = "asyncplatform.queue=q"
	for _, tc := range []struct {
		metric string
		want   points
	}{
		{"asyncplatform.attempts", points{
			"asyncplatform.job.type=ok,asyncplatform.outcome=succeeded," + q:                                        2,
			"asyncplatform.job.type=flaky,asyncplatform.outcome=retried," + q:                                       1,
			"asyncplatform.job.type=flaky,asyncplatform.outcome=succeeded," + q:                                     1,
			"asyncplatform.job.type=bad,asyncplatform.outcome=dead_lettered," + q + ",asyncplatform.reason=invalid": 1,
		}},
		{"asyncplatform.dead_letters", points{
			"asyncplatform.job.type=bad," + q + ",asyncplatform.reason=invalid":       1,
			"asyncplatform.job.type=unknown," + q + ",asyncplatform.reason=unhandled": 1,
		}},
		{"asyncplatform.attempt.tries", points{
			"asyncplatform.job.type=ok,asyncplatform.outcome=succeeded," + q:          2,
			"sum:asyncplatform.job.type=ok,asyncplatform.outcome=succeeded," + q:      2,
			"asyncplatform.job.type=flaky,asyncplatform.outcome=retried," + q:         1,
			"sum:asyncplatform.job.type=flaky,asyncplatform.outcome=retried," + q:     1,
			"asyncplatform.job.type=flaky,asyncplatform.outcome=succeeded," + q:       1,
			"sum:asyncplatform.job.type=flaky,asyncplatform.outcome=succeeded," + q:   2,
			"asyncplatform.job.type=bad,asyncplatform.outcome=dead_lettered," + q:     1,
			"sum:asyncplatform.job.type=bad,asyncplatform.outcome=dead_lettered," + q: 1,
		}},
		{"asyncplatform.queue.depth", points{
			q + ",asyncplatform.state=ready":     0,
			q + ",asyncplatform.state=scheduled": 1,
			q + ",asyncplatform.state=in_flight": 0,
		}},
		{"asyncplatform.queue.dead", points{q: 2}},
	} {
		got := values(t, data[tc.metric])
		if len(got) != len(tc.want) {
			t.Errorf("%s: %v, want %v", tc.metric, got, tc.want)
			continue
		}
		for k, v := range tc.want {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s{%s} = %v (present %v), want %v; all: %v", tc.metric, k, g, ok, v, got)
			}
		}
	}
	durations := values(t, data["asyncplatform.handler.duration"])
	if n := durations["asyncplatform.job.type=ok,asyncplatform.outcome=succeeded,"+q]; n != 2 {
		t.Errorf("handler.duration count for ok = %v, want 2: %v", n, durations)
	}
	if age, ok := values(t, data["asyncplatform.queue.dead.oldest_age"])[q]; !ok || age < 0 {
		t.Errorf("oldest dead age = %v (present %v)", age, ok)
	}

	// Once the queue's dead letters are purged, there is no oldest age.
	if _, err := p.PurgeDeadLetters(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	data = collect(t, reader)
	if got := values(t, data["asyncplatform.queue.dead"]); got[q] != 0 {
		t.Errorf("dead after purge: %v", got)
	}
	if got := values(t, data["asyncplatform.queue.dead.oldest_age"]); len(got) != 0 {
		t.Errorf("oldest age after purge: %v", got)
	}

	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	if got := values(t, collect(t, reader)["asyncplatform.queue.depth"]); len(got) != 0 {
		t.Errorf("depth after Unregister: %v", got)
	}
	if _, err := m.ObserveQueues(p); err == nil {
		t.Error("ObserveQueues with no queue: no error")
	}
}

// The hooks already in the config still run, after the metrics'.
func TestInstrumentKeepsHooksAndMiddleware(t *testing.T) {
	t.Parallel()
	var calls []string
	mw := func(next ap.Handler) ap.Handler { return next }
	cfg := ap.Config{
		Middleware: []ap.Middleware{mw},
		Hooks:      ap.Hooks{AfterAttempt: func(context.Context, ap.Attempt) { calls = append(calls, "attempt") }},
	}
	m, err := apotel.Instrument(&cfg, apotel.Config{MeterProvider: sdkmetric.NewMeterProvider(), TracerProvider: noop.NewTracerProvider()})
	if err != nil || m == nil {
		t.Fatal(err)
	}
	if len(cfg.Middleware) != 2 || len(cfg.EnqueueMiddleware) != 1 {
		t.Errorf("middleware: %d, enqueue middleware: %d", len(cfg.Middleware), len(cfg.EnqueueMiddleware))
	}
	cfg.Hooks.AfterAttempt(context.Background(), ap.Attempt{Job: &ap.Job{Type: "t"}, Outcome: ap.OutcomeSucceeded})
	cfg.Hooks.OnDeadLetter(context.Background(), ap.DeadLetter{}) // no user hook: no panic
	if len(calls) != 1 {
		t.Errorf("user hook calls: %v", calls)
	}
}
