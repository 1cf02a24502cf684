package otel

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	ap "github.com/asyncplatform/asyncplatform"
)

// EnqueueMiddleware returns enqueue middleware that starts a producer span
// per job and carries its context to the handler in the job's Headers. The
// job's Headers map is replaced by a copy, so a map shared between jobs is
// left alone.
func EnqueueMiddleware(c Config) ap.EnqueueMiddleware {
	c = c.withDefaults()
	tracer := c.TracerProvider.Tracer(ScopeName)
	prop := c.Propagator
	return func(next ap.EnqueueFunc) ap.EnqueueFunc {
		return func(ctx context.Context, jobs []*ap.Job) error {
			spans := make([]trace.Span, 0, len(jobs))
			nextCtx := ctx
			for _, j := range jobs {
				if j == nil {
					continue // the platform refuses it
				}
				queue := queueOf(j.Queue)
				sctx, span := tracer.Start(ctx, "send "+queue,
					trace.WithSpanKind(trace.SpanKindProducer),
					trace.WithAttributes(
						keySystem.String("asyncplatform"),
						keyDest.String(queue),
						keyOperation.String("send"),
						keyType.String(j.Type),
					))
				h := maps.Clone(j.Headers)
				if h == nil {
					h = make(map[string]string, 2)
				}
				prop.Inject(sctx, propagation.MapCarrier(h))
				j.Headers = h
				spans = append(spans, span)
				if len(jobs) == 1 {
					nextCtx = sctx // the backend's own spans nest under the job's
				}
			}
			err := next(nextCtx, jobs)
			i := 0
			for _, j := range jobs {
				if j == nil {
					continue
				}
				span := spans[i]
				i++
				if j.ID != "" {
					span.SetAttributes(keyMessageID.String(j.ID))
				}
				if err != nil {
					span.RecordError(err)
					span.SetStatus(codes.Error, err.Error())
				}
				span.End()
			}
			return err
		}
	}
}

// Middleware returns handler middleware that runs each attempt in a consumer
// span, a child of the span that enqueued the job when its Headers carry
// one. A handler error sets the span's status to Error, except Reject (the
// job's fault is not in question); a panic does too, and is passed on.
func Middleware(c Config) ap.Middleware {
	c = c.withDefaults()
	tracer := c.TracerProvider.Tracer(ScopeName)
	prop := c.Propagator
	return func(next ap.Handler) ap.Handler {
		return func(ctx context.Context, job *ap.Job) (err error) {
			if len(job.Headers) > 0 {
				ctx = prop.Extract(ctx, propagation.MapCarrier(job.Headers))
			}
			queue := queueOf(job.Queue)
			ctx, span := tracer.Start(ctx, "process "+queue,
				trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(
					keySystem.String("asyncplatform"),
					keyDest.String(queue),
					keyOperation.String("process"),
					keyMessageID.String(job.ID),
					keyType.String(job.Type),
					keyTry.Int(job.TryCount),
					attribute.Int("asyncplatform.job.failures", job.Failures),
					attribute.Int("asyncplatform.job.crashes", job.Crashes),
				))
			defer func() {
				if v := recover(); v != nil {
					span.SetStatus(codes.Error, fmt.Sprintf("panic: %v", v))
					span.End()
					panic(v) // the platform recovers it and keeps the stack
				}
				var rej *ap.RejectError
				switch {
				case err == nil:
				case errors.As(err, &rej):
					span.AddEvent("rejected", trace.WithAttributes(attribute.String("error", err.Error())))
				default:
					span.RecordError(err)
					span.SetStatus(codes.Error, err.Error())
				}
				span.End()
			}()
			return next(ctx, job)
		}
	}
}

func queueOf(q string) string {
	if q == "" {
		return ap.DefaultQueue
	}
	return q
}
