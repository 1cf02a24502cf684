package flow_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/flow"
)

// The benchmarks report, beside ns/op, the store round trips per operation
// (trips/op): every KV call is one (one script call on Redis).
//
//	go test -run '^$' -bench . -benchtime 2s ./internal/flow

func reportTrips(b *testing.B, kvs ...*countingKV) {
	var n int64
	for _, kv := range kvs {
		n += kv.calls.Load()
	}
	b.ReportMetric(float64(n)/float64(b.N), "trips/op")
}

// BenchmarkSemaphore: TryAcquire then Release on a free semaphore of 5
// slots (the cost per job of a cluster-wide limit), and TryAcquire on one
// whose slots are all held (the cost of learning that).
func BenchmarkSemaphore(b *testing.B) {
	for _, kind := range realKinds {
		b.Run(kind+"/AcquireRelease", func(b *testing.B) {
			c := newCluster(b, kind, slotKeys("bench/sem", 5)...)
			kv := &countingKV{KV: c.Connect(b)}
			s, err := flow.NewSemaphore(kv, flow.SemaphoreConfig{Prefix: "bench/sem", Slots: 5, Lease: time.Minute})
			must(b, "NewSemaphore", err)
			ctx := b.Context()
			b.ResetTimer()
			for b.Loop() {
				sl, ok, err := s.TryAcquire(ctx, "bench")
				if err != nil || !ok {
					b.Fatal(ok, err)
				}
				if err := sl.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
			reportTrips(b, kv)
		})
		b.Run(kind+"/Full", func(b *testing.B) {
			c := newCluster(b, kind, slotKeys("bench/full", 5)...)
			kv := &countingKV{KV: c.Connect(b)}
			s, err := flow.NewSemaphore(kv, flow.SemaphoreConfig{Prefix: "bench/full", Slots: 5, Lease: time.Minute})
			must(b, "NewSemaphore", err)
			ctx := b.Context()
			for range 5 {
				if _, ok, err := s.TryAcquire(ctx, "holder"); err != nil || !ok {
					b.Fatal(ok, err)
				}
			}
			kv.calls.Store(0)
			b.ResetTimer()
			for b.Loop() {
				if _, ok, err := s.TryAcquire(ctx, "bench"); err != nil || ok {
					b.Fatal(ok, err)
				}
			}
			reportTrips(b, kv)
		})
		b.Run(kind+"/Renew", func(b *testing.B) {
			c := newCluster(b, kind, slotKeys("bench/renew", 1)...)
			kv := &countingKV{KV: c.Connect(b)}
			s, err := flow.NewSemaphore(kv, flow.SemaphoreConfig{Prefix: "bench/renew", Slots: 1, Lease: time.Minute})
			must(b, "NewSemaphore", err)
			ctx := b.Context()
			sl, ok, err := s.TryAcquire(ctx, "holder")
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			kv.calls.Store(0)
			b.ResetTimer()
			for b.Loop() {
				if err := sl.Renew(ctx); err != nil {
					b.Fatal(err)
				}
			}
			reportTrips(b, kv)
		})
	}
}

// BenchmarkLocal: TryAcquire then Release of a Local.
func BenchmarkLocal(b *testing.B) {
	l, err := flow.NewLocal(5)
	must(b, "NewLocal", err)
	for b.Loop() {
		if !l.TryAcquire() {
			b.Fatal("refused")
		}
		l.Release()
	}
}

// BenchmarkRate: Take admitted by a limit high enough never to refuse (the
// cost per job of a rate limit, one process), Take refused by a spent
// limit, and admitted Takes by 3 processes (clients) on one key at once,
// back to back: saturation, far beyond what a limit needs, where a Take
// may be refused (its now fell behind) or give up on contention.
func BenchmarkRate(b *testing.B) {
	for _, kind := range realKinds {
		b.Run(kind+"/Admitted", func(b *testing.B) {
			c := newCluster(b, kind, "bench/rate")
			kv := &countingKV{KV: c.Connect(b)}
			r, err := flow.NewRate(kv, flow.RateConfig{Key: "bench/rate", Events: 1e8})
			must(b, "NewRate", err)
			ctx := b.Context()
			b.ResetTimer()
			for b.Loop() {
				if wait, err := r.Take(ctx, time.Now()); err != nil || wait != 0 {
					b.Fatal(wait, err)
				}
			}
			reportTrips(b, kv)
		})
		b.Run(kind+"/Refused", func(b *testing.B) {
			c := newCluster(b, kind, "bench/refused")
			kv := &countingKV{KV: c.Connect(b)}
			r, err := flow.NewRate(kv, flow.RateConfig{Key: "bench/refused", Events: 1, Period: time.Hour})
			must(b, "NewRate", err)
			ctx := b.Context()
			if _, err := r.Take(ctx, time.Now()); err != nil {
				b.Fatal(err)
			}
			kv.calls.Store(0)
			b.ResetTimer()
			for b.Loop() {
				if wait, err := r.Take(ctx, time.Now()); err != nil || wait == 0 {
					b.Fatal(wait, err)
				}
			}
			reportTrips(b, kv)
		})
		b.Run(kind+"/Admitted3Processes", func(b *testing.B) {
			c := newCluster(b, kind, "bench/rate3")
			var kvs []*countingKV
			var rates []*flow.Rate
			for range 3 {
				kv := &countingKV{KV: c.Connect(b)}
				r, err := flow.NewRate(kv, flow.RateConfig{Key: "bench/rate3", Events: 1e8, Burst: 1e6})
				must(b, "NewRate", err)
				kvs, rates = append(kvs, kv), append(rates, r)
			}
			ctx := b.Context()
			b.ResetTimer()
			var wg sync.WaitGroup
			var refused, contended atomic.Int64
			for i, r := range rates {
				n := b.N / 3
				if i == 0 {
					n += b.N % 3
				}
				wg.Go(func() {
					for range n {
						// A goroutine paused between its now and its
						// write (a GC, the scheduler) is behind the TAT
						// the others moved on: refused, as a process
						// with a slow clock is.
						wait, err := r.Take(ctx, time.Now())
						if errors.Is(err, flow.ErrContention) {
							contended.Add(1)
							continue
						}
						if err != nil {
							b.Error(err)
							return
						}
						if wait > 0 {
							refused.Add(1)
						}
					}
				})
			}
			wg.Wait()
			reportTrips(b, kvs...)
			b.ReportMetric(float64(refused.Load())/float64(b.N), "refused/op")
			b.ReportMetric(float64(contended.Load())/float64(b.N), "contended/op")
		})
	}
}
