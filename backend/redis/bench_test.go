package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
)

// The benchmarks measure draining a queue of b.N jobs already enqueued
// (enqueueing is outside the timer in every variant), on the machine's Redis:
//
//	go test -run '^$' -bench . -benchtime 20000x -count 6 ./backend/redis/
//
// BenchmarkFacade goes end to end through asyncplatform (claim with lease
// and delivery count, decode, no-op handler, ack). BenchmarkRaw is the
// ceiling: the same durable work as bare go-redis commands, LMOVE to a
// processing list and LREM to ack, one job per round trip, and batched.
// Besides jobs/s each reports the CPU time per job spent by Redis and by
// this process, which stays readable when the machine is busy with other
// work and the rates swing; compare medians over several counts.

var benchConcurrency = []int{10, 50}

const benchPayload = 64

func benchClient(b *testing.B, poolSize int) *goredis.Client {
	b.Helper()
	addr := realRedis(b)
	c := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: poolSize})
	b.Cleanup(func() { c.Close() })
	return c
}

// cpuMeter reads the CPU time spent by the Redis server (INFO cpu) and by
// this process (getrusage), so a benchmark can say where the time goes even
// when the machine is busy with other work.
type cpuMeter struct {
	rdb            *goredis.Client
	server, client time.Duration
	serverErr      error
}

func redisCPU(rdb *goredis.Client) (time.Duration, error) {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU(rdb *goredis.Client) *cpuMeter {
	m := &cpuMeter{rdb: rdb}
	m.server, m.serverErr = redisCPU(rdb)
	m.client = selfCPU()
	return m
}

// report adds the rate and the CPU time per job on each side.
func (m *cpuMeter) report(b *testing.B, n int, d time.Duration) {
	server, err := redisCPU(m.rdb)
	client := selfCPU()
	b.ReportMetric(float64(n)/d.Seconds(), "jobs/s")
	b.ReportMetric(0, "ns/op")
	if err == nil && m.serverErr == nil {
		b.ReportMetric(float64((server-m.server).Microseconds())/float64(n), "redis-cpu-µs/job")
	}
	b.ReportMetric(float64((client-m.client).Microseconds())/float64(n), "client-cpu-µs/job")
}

func BenchmarkFacade(b *testing.B) {
	for _, c := range benchConcurrency {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			rdb := benchClient(b, c+20)
			ctx := context.Background()
			be, err := New(context.Background(), Config{Client: rdb, Prefix: "aptbench"})
			if err != nil {
				b.Fatal(err)
			}
			q := testQueue(b)
			b.Cleanup(func() {
				_ = be.DeleteQueue(ctx, q)
				be.Close()
			})
			p, err := ap.New(be, ap.Config{Queues: map[string]ap.QueueConfig{q: {Concurrency: c}}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			var done atomic.Int64
			all := make(chan struct{})
			n := int64(b.N)
			if err := p.Handle("bench", func(ctx context.Context, job *ap.Job) error {
				if done.Add(1) == n {
					close(all)
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, benchPayload)
			for i := 0; i < b.N; i += 1000 {
				batch := make([]*ap.Job, 0, 1000)
				for j := i; j < min(i+1000, b.N); j++ {
					batch = append(batch, &ap.Job{Type: "bench", Queue: q, Payload: payload})
				}
				if err := p.EnqueueBatch(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			cpu := startCPU(rdb)
			start := time.Now()
			if err := p.Start(ctx); err != nil {
				b.Fatal(err)
			}
			select {
			case <-all:
			case <-time.After(5 * time.Minute):
				b.Fatalf("handled %d of %d jobs", done.Load(), n)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			cpu.report(b, b.N, elapsed)
			if err := p.Stop(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// fillRaw pushes n payloads to key, pipelined.
func fillRaw(b *testing.B, rdb *goredis.Client, key string, n int) {
	b.Helper()
	ctx := context.Background()
	payload := make([]byte, benchPayload)
	for i := 0; i < n; i += 1000 {
		vals := make([]any, 0, 1000)
		for j := i; j < min(i+1000, n); j++ {
			// Distinct values, as LREM removes by value.
			v := append([]byte(fmt.Sprintf("%012d", j)), payload[12:]...)
			vals = append(vals, v)
		}
		if err := rdb.LPush(ctx, key, vals...).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRaw(b *testing.B) {
	for _, batch := range []int{1, 10} {
		name := "one-per-round-trip"
		if batch > 1 {
			name = fmt.Sprintf("batch=%d", batch)
		}
		for _, c := range benchConcurrency {
			b.Run(fmt.Sprintf("%s/c=%d", name, c), func(b *testing.B) {
				rdb := benchClient(b, c+20)
				ctx := context.Background()
				q := testQueue(b)
				src, proc := "{aptbench:"+q+"}:raw", "{aptbench:"+q+"}:processing"
				b.Cleanup(func() { rdb.Del(ctx, src, proc) })
				fillRaw(b, rdb, src, b.N)
				b.ResetTimer()
				cpu := startCPU(rdb)
				start := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, c)
				for range c {
					wg.Go(func() {
						var err error
						if batch == 1 {
							err = rawWorker(ctx, rdb, src, proc)
						} else {
							err = rawBatchWorker(ctx, rdb, src, proc, batch)
						}
						if err != nil {
							errs <- err
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				cpu.report(b, b.N, elapsed)
			})
		}
	}
}

// rawWorker moves one job at a time to the processing list and acks it.
func rawWorker(ctx context.Context, rdb *goredis.Client, src, proc string) error {
	for {
		v, err := rdb.LMove(ctx, src, proc, "RIGHT", "LEFT").Result()
		if errors.Is(err, goredis.Nil) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := rdb.LRem(ctx, proc, 1, v).Err(); err != nil {
			return err
		}
	}
}

// rawBatchWorker moves up to batch jobs in one pipeline, then acks them in
// another.
func rawBatchWorker(ctx context.Context, rdb *goredis.Client, src, proc string, batch int) error {
	for {
		cmds := make([]*goredis.StringCmd, batch)
		_, err := rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i := range cmds {
				cmds[i] = p.LMove(ctx, src, proc, "RIGHT", "LEFT")
			}
			return nil
		})
		if err != nil && !errors.Is(err, goredis.Nil) {
			return err
		}
		var got []string
		for _, c := range cmds {
			if v, err := c.Result(); err == nil {
				got = append(got, v)
			}
		}
		if len(got) == 0 {
			return nil
		}
		if _, err := rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for _, v := range got {
				p.LRem(ctx, proc, 1, v)
			}
			return nil
		}); err != nil {
			return err
		}
	}
}
