package azure

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	azlog "github.com/Azure/azure-sdk-for-go/sdk/azcore/log"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"

	"github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// benchJobs is the number of jobs per iteration: Azurite slows as a queue
// deepens, so keep it near 1,000 and compare only within one run.
const benchJobs = 1000

// BenchmarkThroughput compares, in one run, the facade end to end (enqueue
// with EnqueueBatch, then handlers at concurrency C until all are done) with
// a raw azqueue loop of C goroutines that dequeue one message per request
// (raw1) or 32 (raw32) and delete each. Each iteration runs the three in
// turn on benchJobs jobs, so a noisy machine disturbs all three alike; run it
// with -benchtime=3x. Metrics: each mode's drain rate in jobs/s (after its
// enqueue, which is reported as enq/s), and the facade's ratio to each raw
// loop.
func BenchmarkThroughput(b *testing.B) {
	for _, c := range []int{10, 50} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			retries := countRetries(b)
			be, q := newBackend(b, Config{})
			var enq, drain [3]time.Duration
			for range b.N {
				for i, mode := range []func() (time.Duration, time.Duration){
					func() (time.Duration, time.Duration) { return roundFacade(b, be, q, c) },
					func() (time.Duration, time.Duration) { return roundRaw(b, be, q, c, 1) },
					func() (time.Duration, time.Duration) { return roundRaw(b, be, q, c, 32) },
				} {
					e, d := mode()
					enq[i] += e
					drain[i] += d
				}
			}
			n := float64(benchJobs * b.N)
			for i, name := range []string{"facade", "raw1", "raw32"} {
				b.ReportMetric(n/drain[i].Seconds(), name+"-jobs/s")
				b.ReportMetric(n/enq[i].Seconds(), name+"-enq/s")
			}
			b.ReportMetric(drain[1].Seconds()/drain[0].Seconds(), "facade/raw1")
			b.ReportMetric(drain[2].Seconds()/drain[0].Seconds(), "facade/raw32")
			b.ReportMetric(float64(retries.Load()), "sdk-retries")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// countRetries counts the SDK's retried requests (a stall's usual cause)
// until the benchmark ends.
func countRetries(b *testing.B) *atomic.Int64 {
	var n atomic.Int64
	azlog.SetEvents(azlog.EventRetryPolicy)
	azlog.SetListener(func(_ azlog.Event, msg string) {
		if strings.HasPrefix(msg, "=====> Try=") && !strings.HasPrefix(msg, "=====> Try=1 ") {
			n.Add(1)
		}
	})
	b.Cleanup(func() { azlog.SetListener(nil) })
	return &n
}

func roundFacade(b *testing.B, be *Backend, q string, c int) (enq, drain time.Duration) {
	ctx := context.Background()
	p, err := asyncplatform.New(be, asyncplatform.Config{
		Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: c}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	var done atomic.Int64
	all := make(chan struct{})
	if err := p.Handle("bench", func(ctx context.Context, j *asyncplatform.Job) error {
		if done.Add(1) == benchJobs {
			close(all)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	jobs := make([]*asyncplatform.Job, benchJobs)
	for i := range jobs {
		jobs[i] = &asyncplatform.Job{Type: "bench", Queue: q, Payload: make([]byte, 100)}
	}
	t0 := time.Now()
	if err := p.EnqueueBatch(ctx, jobs); err != nil {
		b.Fatal(err)
	}
	t1 := time.Now()
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-all
	t2 := time.Now()
	if err := p.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	return t1.Sub(t0), t2.Sub(t1)
}

func roundRaw(b *testing.B, be *Backend, q string, c, batch int) (enq, drain time.Duration) {
	ctx := context.Background()
	wq := be.svc.NewQueueClient(be.names(q).work)
	text := workFrame{body: make([]byte, 100)}.encode()
	t0 := time.Now()
	parallel(b, DefaultEnqueueParallel, benchJobs, func() error {
		_, err := wq.EnqueueMessage(ctx, text, &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))})
		return err
	})
	t1 := time.Now()
	var done atomic.Int64
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Load() < benchJobs {
				resp, err := wq.DequeueMessages(ctx, &azqueue.DequeueMessagesOptions{
					NumberOfMessages: to.Ptr(int32(batch)), VisibilityTimeout: to.Ptr(int32(30)),
				})
				if err != nil {
					b.Error(err)
					return
				}
				if len(resp.Messages) == 0 {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				for _, m := range resp.Messages {
					if _, err := wq.DeleteMessage(ctx, *m.MessageID, *m.PopReceipt, nil); err != nil {
						if queueerror.HasCode(err, queueerror.MessageNotFound) {
							// An SDK retry of a delete that had succeeded.
							done.Add(1)
							continue
						}
						if leaseLost(err) { // an overloaded machine: it comes back
							continue
						}
						b.Error(err)
						return
					}
					done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return t1.Sub(t0), time.Since(t1)
}

// parallel runs fn n times on w goroutines.
func parallel(b testing.TB, w, n int, fn func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := fn(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkDepth measures the cost of one call against queue depth: with
// d jobs waiting and d records in the dead-letter queue (d from
// $ASYNCPLATFORM_AZURE_DEPTHS, comma-separated, default 1000,10000), the
// median of depthSamples calls of a claim (Receive of one job with a
// one-minute lease; its Ack not timed; and the slowest), of the same claim
// made with the azqueue SDK alone (DequeueMessages of one message, then
// DeleteMessage untimed), alternating with ours, so that what Azurite costs
// and what the backend adds are told apart; Enqueue of one job, NextDead
// kept and popped, ListDead's first page of 100 (listSamples calls), and
// the time to page through every record 100 at a time (unless a page takes
// over a second).
//
// Each depth runs on an Azurite of its own (evidence: docs/reliability.md,
// "Azure: the benchmark's claim that failed with context deadline exceeded").
// The dead letters are made first, 1,000 at a time on a shallow queue (as
// the bench harness makes them), and after each 1,000 the run waits for
// Azurite's queue garbage collector to sweep what the deletes left: a
// sweep blocks Azurite for a time that grows with the square of the deletes
// since the last one (42 s after 2,000, 142 s after 4,000), longer than a
// request's 30 s deadline. ASYNCPLATFORM_AZURE_DEPTH_NOGCWAIT=1 skips the
// waits. With ASYNCPLATFORM_AZURE_DEPTH_DEBUG=1 Azurite writes its debug
// log, the waits end with the sweep it reports and every sweep is logged
// (that log slows Azurite down by itself at depth); otherwise a wait is 65
// s (the GC sleeps 60 s between sweeps) and one request answered. A probe
// request every 500 ms during the measurements gives the longest time
// Azurite did not answer (stall-max-s). Claims that miss the deadline are
// counted (claim-timeouts), not fatal. Run it with -benchtime=1x:
//
//	go test -run '^$' -bench Depth -benchtime=1x -timeout 60m ./backend/azure/
func BenchmarkDepth(b *testing.B) {
	depths := []int{1000, 10000}
	if s := os.Getenv("ASYNCPLATFORM_AZURE_DEPTHS"); s != "" {
		depths = nil
		for _, f := range strings.Split(s, ",") {
			d, err := strconv.Atoi(f)
			if err != nil {
				b.Fatal(err)
			}
			depths = append(depths, d)
		}
	}
	for _, d := range depths {
		b.Run(fmt.Sprintf("depth=%d", d), func(b *testing.B) {
			for range b.N {
				benchDepth(b, d)
			}
		})
	}
}

// depthSamples is how many calls each median is taken over; listSamples
// for a ListDead page of 100 records, which costs more.
const (
	depthSamples = 50
	listSamples  = 5
)

// claimDeadline bounds one sampled claim, as in the bench harness.
const claimDeadline = 30 * time.Second

func benchDepth(b *testing.B, depth int) {
	ctx := context.Background()
	cs, az, stop := debugAzurite(b, os.Getenv("ASYNCPLATFORM_AZURE_DEPTH_DEBUG") == "1")
	defer stop()
	be, err := New(ctx, Config{ConnectionString: cs, ClientOptions: clientOptions()})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	q := queueName(b)
	if err := be.Declare(ctx, q); err != nil {
		b.Fatal(err)
	}
	raw := be.svc.NewQueueClient(be.names(q).work)
	t0 := time.Now()
	// depth dead letters, made as the platform makes them (receive, then
	// DeadLetter each delivery), 1,000 at a time.
	var (
		next   atomic.Int64
		gcWait time.Duration
	)
	for made := 0; made < depth; made += 1000 {
		n := min(1000, depth-made)
		msgs := make([]driver.Message, n)
		for i := range msgs {
			msgs[i] = driver.Message{Body: []byte("x")}
		}
		if err := be.Enqueue(ctx, q, msgs); err != nil {
			b.Fatal(err)
		}
		parallel(b, DefaultEnqueueParallel, DefaultEnqueueParallel, func() error {
			for next.Load() < int64(made+n) {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				ds, err := be.Receive(rctx, q, 32, time.Minute)
				cancel()
				if err != nil && rctx.Err() == nil {
					return err
				}
				for _, dl := range ds {
					i := next.Add(1)
					if err := be.DeadLetter(ctx, dl, driver.DeadMessage{ID: fmt.Sprintf("d%06d", i), Body: make([]byte, 300)}); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if os.Getenv("ASYNCPLATFORM_AZURE_DEPTH_NOGCWAIT") != "1" {
			t := time.Now()
			az.waitSweep(b, be)
			gcWait += time.Since(t)
		}
	}
	b.ReportMetric(gcWait.Seconds(), "gc-wait-s")
	work := make([]driver.Message, depth)
	for i := range work {
		work[i] = driver.Message{Body: make([]byte, 100)}
	}
	if err := be.Enqueue(ctx, q, work); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(time.Since(t0).Seconds(), "fill-s")

	measured := time.Now()
	stopProbe := probeStalls(be)
	defer stopProbe()
	var timeouts int
	ours := make([]time.Duration, 0, depthSamples)
	bare := make([]time.Duration, 0, depthSamples)
	for range depthSamples {
		rctx, cancel := context.WithTimeout(ctx, claimDeadline)
		t := time.Now()
		ds, err := be.Receive(rctx, q, 1, time.Minute)
		ours = append(ours, time.Since(t))
		cancel()
		for _, dl := range ds {
			_ = be.Ack(ctx, dl)
		}
		if err != nil && rctx.Err() != nil {
			timeouts++
		} else if err != nil || len(ds) != 1 {
			b.Fatalf("claim: %d jobs, %v", len(ds), err)
		}
		rctx, cancel = context.WithTimeout(ctx, claimDeadline)
		t = time.Now()
		resp, err := raw.DequeueMessages(rctx, &azqueue.DequeueMessagesOptions{NumberOfMessages: to.Ptr(int32(1)), VisibilityTimeout: to.Ptr(int32(60))})
		bare = append(bare, time.Since(t))
		cancel()
		if err != nil && rctx.Err() != nil {
			timeouts++
		} else if err != nil || len(resp.Messages) != 1 {
			b.Fatalf("raw dequeue: %d messages, %v", len(resp.Messages), err)
		}
		for _, m := range resp.Messages {
			_, _ = raw.DeleteMessage(ctx, *m.MessageID, *m.PopReceipt, nil)
		}
	}
	slices.Sort(ours)
	slices.Sort(bare)
	enq := medianOf(b, depthSamples, func() (time.Duration, error) {
		t := time.Now()
		err := be.Enqueue(ctx, q, []driver.Message{{Body: make([]byte, 100)}})
		return time.Since(t), err
	})
	keep := medianOf(b, depthSamples, func() (time.Duration, error) {
		t := time.Now()
		dd, err := be.NextDead(ctx, q)
		if err == nil {
			err = be.SettleDead(ctx, dd, false)
		}
		return time.Since(t), err
	})
	pop := medianOf(b, depthSamples, func() (time.Duration, error) {
		t := time.Now()
		dd, err := be.NextDead(ctx, q)
		if err == nil {
			err = be.SettleDead(ctx, dd, true)
		}
		return time.Since(t), err
	})
	page := medianOf(b, listSamples, func() (time.Duration, error) {
		t := time.Now()
		recs, _, err := be.ListDead(ctx, q, "", 100)
		if err == nil && len(recs) != 100 {
			err = fmt.Errorf("first page of %d records, want 100", len(recs))
		}
		return time.Since(t), err
	})
	b.ReportMetric(ms(ours[len(ours)/2]), "claim-ms")
	b.ReportMetric(ms(ours[len(ours)-1]), "claim-max-ms")
	b.ReportMetric(ms(bare[len(bare)/2]), "raw-claim-ms")
	b.ReportMetric(ms(bare[len(bare)-1]), "raw-claim-max-ms")
	b.ReportMetric(float64(timeouts), "claim-timeouts")
	b.ReportMetric(ms(enq), "enqueue-ms")
	b.ReportMetric(ms(keep), "nextdead-keep-ms")
	b.ReportMetric(ms(pop), "nextdead-pop-ms")
	b.ReportMetric(ms(page), "listdead-page-ms")
	b.ReportMetric(0, "ns/op")
	if page <= time.Second { // else paging through everything would take (depth/100) pages of this
		t1 := time.Now()
		listed, cursor := 0, ""
		for {
			recs, next, err := be.ListDead(ctx, q, cursor, 100)
			if err != nil {
				b.Fatal(err)
			}
			listed += len(recs)
			if next == "" {
				break
			}
			cursor = next
		}
		if want := depth - depthSamples; listed != want {
			b.Errorf("paged through %d records, want %d", listed, want)
		}
		b.ReportMetric(time.Since(t1).Seconds(), "listdead-all-s")
	}
	b.ReportMetric(stopProbe().Seconds(), "stall-max-s")
	var longest time.Duration
	for _, sw := range az.sweeps() {
		b.Logf("Azurite queue GC at %v: %d unreferenced extents, sweep took %v", sw.at.Sub(t0).Round(time.Second), sw.extents, sw.took)
		if sw.at.After(measured) {
			longest = max(longest, sw.took)
		}
	}
	b.ReportMetric(longest.Seconds(), "gc-max-s")
}

// debugAzurite starts an Azurite of the benchmark's own, in memory, that
// writes its debug log (with the queue GC's lines) to a file when debug is
// set; stop (or the end of the benchmark) kills it.
func debugAzurite(tb testing.TB, debug bool) (cs string, az *azuriteLog, stop func()) {
	tb.Helper()
	bin, err := filepath.Abs(azuriteBin)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		testenv.Unreachable(tb, "Azurite (run scripts/azurite.sh install)", err)
	}
	port, _ := freePort()
	blobPort, _ := freePort()
	dir := tb.TempDir()
	args := append(azuriteArgs(port, blobPort), "--inMemoryPersistence")
	az = &azuriteLog{}
	if debug {
		az.path = filepath.Join(dir, "debug.log")
		args = append(args, "--debug", az.path)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), "AZURITE_ACCOUNTS="+devAccount+":"+devKey)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) }
	tb.Cleanup(stop)
	addr, blobAddr := fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.1:%d", blobPort)
	for deadline := time.Now().Add(time.Minute); !dialOK(addr) || !dialOK(blobAddr); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatal("Azurite did not listen within a minute")
		}
	}
	return azuriteConnString(addr, blobAddr), az, stop
}

// azuriteLog reads the queue GC's lines from an Azurite debug log. The log
// grows by megabytes a second (every request is logged), so it is read
// from where the last read stopped.
type azuriteLog struct {
	path string

	mu      sync.Mutex
	offset  int64
	partial string // an unfinished last line
	started int    // sweeps started so far
	extents int    // unreferenced extents of the sweep under way
	done    []sweep
}

// sweep is one run of Azurite's queue garbage collector, read from its log.
type sweep struct {
	at      time.Time // when it finished
	extents int       // unreferenced extents it found
	took    time.Duration
}

var (
	sweepFound = regexp.MustCompile(`QueueGCManager:markSweep\(\) Got referred extents, unreferenced extents count is (\d+)`)
	sweepDone  = regexp.MustCompile(`^(\S+) .*QueueGCManager:markSweepLoop\(\) Mark and sweep finished, take (\d+)ms`)
)

// read takes in what the log gained since the last read.
func (l *azuriteLog) read() {
	if l.path == "" {
		return
	}
	f, err := os.Open(l.path)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(l.offset, io.SeekStart); err != nil {
		return
	}
	data, _ := io.ReadAll(f)
	l.offset += int64(len(data))
	text := l.partial + string(data)
	last := strings.LastIndexByte(text, '\n')
	l.partial = text[last+1:]
	for _, line := range strings.Split(text[:last+1], "\n") {
		if !strings.Contains(line, "QueueGCManager") {
			continue
		}
		if strings.Contains(line, "Start new mark and sweep") {
			l.started++
		}
		if m := sweepFound.FindStringSubmatch(line); m != nil {
			l.extents, _ = strconv.Atoi(m[1])
		}
		if m := sweepDone.FindStringSubmatch(line); m != nil {
			at, _ := time.Parse(time.RFC3339Nano, m[1])
			took, _ := strconv.Atoi(m[2])
			l.done = append(l.done, sweep{at: at, extents: l.extents, took: time.Duration(took) * time.Millisecond})
			l.extents = -1
		}
	}
}

// sweeps returns the finished sweeps.
func (l *azuriteLog) sweeps() []sweep {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.read()
	return slices.Clone(l.done)
}

// waitSweep waits until a sweep that started after the call has finished
// (Azurite sweeps every 60 s, after the previous sweep ends). Without a
// log it waits 65 s and for one request to be answered.
func (l *azuriteLog) waitSweep(tb testing.TB, be *Backend) {
	if l.path == "" {
		time.Sleep(65 * time.Second)
		if err := be.Ping(context.Background()); err != nil {
			tb.Fatal(err)
		}
		return
	}
	l.mu.Lock()
	l.read()
	started := l.started
	l.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Minute); len(l.sweeps()) <= started; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			tb.Fatalf("no Azurite queue GC sweep finished within 10 minutes (%d started before)", started)
		}
	}
}

// probeStalls sends a request to the queue service every 500 ms until stop,
// which returns the longest one took.
func probeStalls(be *Backend) (stop func() time.Duration) {
	var longest atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			t := time.Now()
			_ = be.Ping(context.Background())
			if d := int64(time.Since(t)); d > longest.Load() {
				longest.Store(d)
			}
			select {
			case <-done:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	return func() time.Duration {
		once.Do(func() { close(done); wg.Wait() })
		return time.Duration(longest.Load())
	}
}

// medianOf returns the median of n durations fn reports.
func medianOf(b *testing.B, n int, fn func() (time.Duration, error)) time.Duration {
	med, _ := medianMax(b, n, fn)
	return med
}

// medianMax returns the median and the largest of n durations fn reports.
func medianMax(b *testing.B, n int, fn func() (time.Duration, error)) (med, most time.Duration) {
	ds := make([]time.Duration, 0, n)
	for range n {
		d, err := fn()
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
