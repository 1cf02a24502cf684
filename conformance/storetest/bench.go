package storetest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// benchParallelism is how many goroutines per GOMAXPROCS each benchmark
// runs: enough to keep a networked store busy, as a worker pool would.
const benchParallelism = 4

// Bench benchmarks the stores makeStore opens, through asyncplatform.Store,
// with sub-benchmarks Get (one present key), Create (a new key each time)
// and CAS (an Update at the revision the previous one returned, one key per
// goroutine). Each runs GOMAXPROCS×4 goroutines on one connection and
// reports, beside ns/op, the throughput (ops/s) and the median latency of
// one operation (p50-ms). Call it from one benchmark of the store's
// package, conventionally BenchmarkStore.
func Bench(b *testing.B, makeStore Maker) {
	b.Run("Get", func(b *testing.B) {
		s, ctx := benchStore(b, makeStore, "get")
		_, err := s.Create(ctx, "k", []byte("value"), 0)
		if err != nil {
			b.Fatal(err)
		}
		measure(b, func(int, *goroutineState) error {
			_, _, err := s.Get(ctx, "k")
			return err
		})
	})
	b.Run("Create", func(b *testing.B) {
		s, ctx := benchStore(b, makeStore, "create")
		measure(b, func(i int, g *goroutineState) error {
			_, err := s.Create(ctx, fmt.Sprintf("%d/%d", g.id, i), []byte("value"), time.Hour)
			return err
		})
	})
	b.Run("CAS", func(b *testing.B) {
		s, ctx := benchStore(b, makeStore, "cas")
		measure(b, func(i int, g *goroutineState) error {
			key := fmt.Sprintf("c/%d", g.id)
			if g.rev == "" {
				rev, err := s.Create(ctx, key, []byte("0"), 0)
				if err != nil {
					return err
				}
				g.rev = rev
			}
			rev, err := s.Update(ctx, key, []byte("value"), g.rev, 0)
			g.rev = rev
			return err
		})
	})
}

func benchStore(b *testing.B, makeStore Maker, name string) (*ap.Store, context.Context) {
	ctx := b.Context()
	d, err := makeStore(ctx, b)
	if err != nil {
		b.Fatal(err)
	}
	ns := namespace("bench-" + name)
	s, err := ap.NewStore(d, ns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { benchClean(b, s) })
	return s, ctx
}

// benchClean deletes the namespace's keys, several at a time.
func benchClean(b *testing.B, s *ap.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		page, err := s.List(ctx, "", "", ap.MaxListLimit)
		if err != nil || len(page.Keys) == 0 {
			if err != nil {
				b.Logf("cleaning up: %v", err)
			}
			return
		}
		var wg sync.WaitGroup
		keys := make(chan string)
		for range 16 {
			wg.Go(func() {
				for k := range keys {
					_ = s.Delete(ctx, k, "")
				}
			})
		}
		for _, k := range page.Keys {
			keys <- k
		}
		close(keys)
		wg.Wait()
	}
}

// goroutineState is what one benchmark goroutine keeps between operations.
type goroutineState struct {
	id  int
	rev string
	lat []time.Duration
}

// measure runs op b.N times over the benchmark's goroutines, timing each
// call, and reports ops/s and p50-ms.
func measure(b *testing.B, op func(i int, g *goroutineState) error) {
	var (
		ids  atomic.Int64
		mu   sync.Mutex
		all  []time.Duration
		fail error
	)
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		g := &goroutineState{id: int(ids.Add(1))}
		for i := 0; pb.Next(); i++ {
			t0 := time.Now()
			if err := op(i, g); err != nil {
				mu.Lock()
				fail = cmp.Or(fail, err)
				mu.Unlock()
				continue
			}
			g.lat = append(g.lat, time.Since(t0))
		}
		mu.Lock()
		all = append(all, g.lat...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if fail != nil {
		b.Fatal(fail)
	}
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(len(all))/elapsed.Seconds(), "ops/s")
		b.ReportMetric(float64(all[len(all)/2])/float64(time.Millisecond), "p50-ms")
	}
}
