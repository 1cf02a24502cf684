package admit

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkRateFar: 20 workers take starts of a limit far above their
// demand (1,000,000/s, a burst of 1,000: a grace of a millisecond), a job
// every 200 µs each, on a store of 300 µs round trips: what the limit
// costs them, as store writes and jobs that waited for the store per
// start (the bench's features phase measures the speed).
func BenchmarkRateFar(b *testing.B) {
	kv, l := farLine(b, 300*time.Microsecond)
	defer l.stop()
	const workers = 20
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ResetTimer()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if wait, err := l.start(b.Context(), time.Minute, workers); err != nil || wait != 0 {
					b.Errorf("start = %v, %v; want at once", wait, err)
					return
				}
				time.Sleep(200 * time.Microsecond)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(kv.writes.Load())/float64(b.N), "writes/start")
	b.ReportMetric(float64(l.stalls.Load())/float64(b.N), "stalls/start")
}
