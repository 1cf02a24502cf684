package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
)

// scaleResult is the processing rate of one queue worked by 1, 2 and 4
// worker processes of our facade, and by as many processes of the raw
// one-per-round-trip loop, in the same run: the raw loop's drop is what
// the machine's cores and the broker cost, ours beyond it is the platform's.
type scaleResult struct {
	Backend string
	Conc    int             // handlers per process
	N       int             // jobs drained in each round
	Rounds  int             // rounds; each figure is the median
	Rate    map[int]float64 // ours, by process count
	Raw     map[int]float64 // the raw loop, by process count
	// CPU and RawCPU are the workers' CPU per job in µs, all processes
	// together, from "go" to the stop: what the process count costs the
	// workers themselves, apart from the broker and the machine's load.
	CPU, RawCPU map[int]float64
	// BrokerCPU and RawBrokerCPU are the broker's CPU per job in µs over
	// the drain, where the broker reports it (Redis: INFO cpu); a shared
	// server's other clients count too.
	BrokerCPU, RawBrokerCPU map[int]float64
	Err                     string
}

func (s scaleResult) summary() string {
	if s.Err != "" {
		return "error: " + s.Err
	}
	return fmt.Sprintf("ours 1: %.0f/s, 2: %.0f/s, 4: %.0f/s; raw 1: %.0f/s, 2: %.0f/s, 4: %.0f/s",
		s.Rate[1], s.Rate[2], s.Rate[4], s.Raw[1], s.Raw[2], s.Raw[4])
}

// scaleProcs are the process counts of the scaling phase.
var scaleProcs = []int{1, 2, 4}

// scaleSystems are the systems the scaling phase runs: our facade and the
// raw one-per-round-trip loop of the throughput phase.
var scaleSystems = []string{"ours", "raw1"}

// workerSpec tells a worker process what to work.
type workerSpec struct {
	Backend, Queue, Tag string
	System              string // "ours" or "raw1"
	Conc                int
	Srv                 servers
	Profile             string // a CPU profile's path, from "go" to the stop, or ""
}

// scaleQueue is where one system's jobs wait in the scaling phase: the
// parent process owns it, fills it before each drain, and removes it.
type scaleQueue struct {
	system string
	tag    string // the workers open the same tag
	queue  string // the facade's queue name ("" for the raw loop)
	sys    system // a batcher
}

// measureScale preloads n jobs, then drains them with k worker processes
// for k = 1, 2, 4, timing from the moment all are told to start; for each
// k our facade and the raw loop alternate, rounds times, and each figure is
// the median. When profDir is set, every worker of the 4-process runs
// writes a CPU profile there.
func measureScale(backend string, n, rounds int, profDir string, srv servers) scaleResult {
	res := scaleResult{Backend: backend, Conc: 10, N: n, Rounds: rounds, Rate: map[int]float64{}, Raw: map[int]float64{},
		CPU: map[int]float64{}, RawCPU: map[int]float64{}, BrokerCPU: map[int]float64{}, RawBrokerCPU: map[int]float64{}}
	ctx := context.Background()
	var qs []scaleQueue
	defer func() {
		for _, q := range qs {
			q.sys.close()
		}
	}()
	for _, sys := range scaleSystems {
		tag := fmt.Sprintf("scale-%s-%d", sys, os.Getpid())
		q := scaleQueue{system: sys, tag: tag}
		var err error
		if sys == "ours" {
			var f *facade
			f, err = newFacade(ctx, backend, tag, srv)
			if err == nil {
				q.sys, q.queue = f, f.queue
			}
		} else {
			q.sys, err = newRaw(ctx, backend, tag, 1, srv)
		}
		if err != nil {
			res.Err = fmt.Sprintf("%s: %v", sys, err)
			return res
		}
		qs = append(qs, q)
	}
	for _, k := range scaleProcs {
		rates, cpus, bcpus := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
		for round := range rounds {
			for _, q := range qs {
				var r result
				if err := preload(ctx, q.sys, n, 10, &r); err != nil {
					res.Err = fmt.Sprintf("%s preload: %v", q.system, err)
					return res
				}
				spec := workerSpec{Backend: backend, Queue: q.queue, Tag: q.tag, System: q.system, Conc: res.Conc, Srv: srv}
				if profDir != "" && k == scaleProcs[len(scaleProcs)-1] {
					spec.Profile = filepath.Join(profDir, fmt.Sprintf("scale-%s-%s-k%d-r%d", backend, q.system, k, round))
				}
				b0 := brokerCPU(ctx, backend, srv)
				d, cpu, err := drainWithWorkers(spec, k, n)
				if b0 > 0 {
					if b1 := brokerCPU(ctx, backend, srv); b1 > b0 {
						bcpus[q.system] = append(bcpus[q.system], float64((b1-b0).Microseconds())/float64(n))
					}
				}
				if err != nil {
					res.Err = fmt.Sprintf("%s, %d processes: %v", q.system, k, err)
					return res
				}
				rates[q.system] = append(rates[q.system], rate(n, d))
				if cpu > 0 {
					cpus[q.system] = append(cpus[q.system], float64(cpu.Microseconds())/float64(n))
				}
				log.Printf("%s scaling, %s, %d processes, round %d: %.0f jobs/s, workers' CPU %v (load %.1f)", backend, q.system, k, round, rate(n, d), cpu.Round(time.Millisecond), loadAvg())
			}
		}
		res.Rate[k] = medianOf(rates["ours"])
		res.Raw[k] = medianOf(rates["raw1"])
		res.CPU[k] = medianOf(cpus["ours"])
		res.RawCPU[k] = medianOf(cpus["raw1"])
		res.BrokerCPU[k] = medianOf(bcpus["ours"])
		res.RawBrokerCPU[k] = medianOf(bcpus["raw1"])
	}
	return res
}

// drainWithWorkers starts k worker processes, waits until each is ready,
// tells them all to go, and returns the time until they handled n jobs in
// all. Each worker prints its running count; closing its stdin stops it.
// A spec with a Profile gives worker i the profile Profile-w<i>.pprof.
//
// cpu is the CPU time the workers spent from "go" until told to stop (each
// reports its own as "cpu <µs>" when its stdin closes); 0 when one did not.
func drainWithWorkers(spec workerSpec, k, n int) (d, cpu time.Duration, err error) {
	self, err := os.Executable()
	if err != nil {
		return 0, 0, err
	}
	type proc struct {
		cmd   *exec.Cmd
		in    io.WriteCloser
		lines <-chan string
	}
	var procs []proc
	defer func() {
		reported := 0
		var total time.Duration
		// All are told to stop at once, so that none works on (or polls
		// an empty queue) while another stops.
		for _, p := range procs {
			p.in.Close()
		}
		for _, p := range procs {
			done := make(chan struct{})
			go func() {
				for l := range p.lines {
					if v, ok := strings.CutPrefix(l, "cpu "); ok {
						if us, err := strconv.ParseInt(v, 10, 64); err == nil {
							total += time.Duration(us) * time.Microsecond
							reported++
						}
					}
				}
				p.cmd.Wait()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				p.cmd.Process.Kill()
				<-done
			}
		}
		if reported == len(procs) {
			cpu = total
		}
	}()
	for i := range k {
		ws := spec
		if spec.Profile != "" {
			ws.Profile = fmt.Sprintf("%s-w%d.pprof", spec.Profile, i)
		}
		js, _ := json.Marshal(ws)
		cmd := exec.Command(self, "-worker", string(js))
		in, err := cmd.StdinPipe()
		if err != nil {
			return 0, 0, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, 0, err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return 0, 0, err
		}
		procs = append(procs, proc{cmd, in, readLines(bufio.NewScanner(out))})
	}
	for _, p := range procs {
		select {
		case l := <-p.lines:
			if l != "ready" {
				return 0, 0, fmt.Errorf("worker said %q", l)
			}
		case <-time.After(time.Minute):
			return 0, 0, errors.New("a worker was not ready within a minute")
		}
	}
	start := time.Now()
	for _, p := range procs {
		fmt.Fprintln(p.in, "go")
	}
	counts := make([]int, k)
	deadline := time.After(3 * time.Minute)
	for {
		total := 0
		for i, p := range procs {
		drain:
			for {
				select {
				case l, ok := <-p.lines:
					if !ok {
						return 0, 0, errors.New("a worker exited early")
					}
					counts[i], _ = strconv.Atoi(l)
				default:
					break drain
				}
			}
			total += counts[i]
		}
		if total >= n {
			return time.Since(start), 0, nil
		}
		select {
		case <-deadline:
			return 0, 0, fmt.Errorf("handled %d of %d jobs in 3 minutes", total, n)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// runWorker is a worker process: it opens the system the spec names on
// the parent's queue, says "ready", starts on "go", prints its handled
// count every 5ms, and stops when stdin closes. It leaves the queue to the
// parent.
func runWorker(js string) {
	var spec workerSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	var count atomic.Int64
	handle := func() { count.Add(1) }
	var start func() (stop func(), err error)
	switch spec.System {
	case "ours", "":
		be, cleanup, err := openBackend(ctx, spec.Backend, spec.Tag, false, spec.Srv)
		if err != nil {
			log.Fatal(err)
		}
		defer cleanup()
		defer be.Close()
		p, err := ap.New(be, ap.Config{Queues: map[string]ap.QueueConfig{spec.Queue: {Concurrency: spec.Conc}}, Logger: quiet})
		if err != nil {
			log.Fatal(err)
		}
		p.Handle("bench", func(context.Context, *ap.Job) error {
			handle()
			return nil
		})
		start = func() (func(), error) {
			return func() {
				sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				p.Stop(sctx)
			}, p.Start(ctx)
		}
	case "raw1":
		s, err := newRaw(ctx, spec.Backend, spec.Tag, 1, spec.Srv)
		if err != nil {
			log.Fatal(err)
		}
		defer releaseRaw(s)
		start = func() (func(), error) {
			return s.consume(ctx, spec.Conc, func([]byte) { handle() })
		}
	default:
		log.Fatalf("worker: unknown system %q", spec.System)
	}
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() {
		return
	}
	if spec.Profile != "" {
		f, err := os.Create(spec.Profile)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	cpu0 := cpuTime()
	stopSystem, err := start()
	if err != nil {
		log.Fatal(err)
	}
	stop := make(chan struct{})
	go func() {
		for in.Scan() {
		}
		close(stop)
	}()
	last := int64(-1)
	for {
		select {
		case <-stop:
			fmt.Printf("cpu %d\n", (cpuTime() - cpu0).Microseconds())
			stopSystem()
			return
		case <-time.After(5 * time.Millisecond):
		}
		if c := count.Load(); c != last {
			fmt.Println(c)
			last = c
		}
	}
}

// brokerCPU returns the CPU time, user and system, the broker has used
// since it started, where it reports one (Redis: INFO cpu), or 0.
func brokerCPU(ctx context.Context, backend string, srv servers) time.Duration {
	if backend != "redis" {
		return 0
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Redis})
	defer rdb.Close()
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0
	}
	var secs float64
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0
			}
			secs += f
		}
	}
	return time.Duration(secs * float64(time.Second))
}

// cpuTime returns the CPU time, user and system, this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// depth is one queue-depth point: jobs waiting in the work queue and
// records in its dead-letter queue.
type depth struct{ Work, Dead int }

// depthsFor returns the depth points for a backend: 1,000, 10,000 and
// 100,000 dead letters (Azure to 10,000), as many jobs waiting, and
// o.BigDepth jobs waiting at the last point on memory and Redis
// (PostgreSQL: o.BigDepth jobs and as many dead letters).
func depthsFor(backend string, o options) []depth {
	out := []depth{{1000, 1000}, {10000, 10000}}
	switch backend {
	case "azure":
		return out
	case "memory", "redis":
		return append(out, depth{max(o.BigDepth, 100000), 100000})
	case "postgres":
		return append(out, depth{max(o.BigDepth, 100000), max(o.BigDepth, 100000)})
	}
	return append(out, depth{100000, 100000})
}

// redriveAt is the depth whose dead letters the depth phase redrives, all
// of them, timed.
const redriveAt = 10000

// depthResult is the median cost of one call at one depth.
type depthResult struct {
	Backend               string
	Depth                 depth
	Enqueue, Claim        time.Duration
	NextDead, NextDeadPop time.Duration // NextDeadLetter keeping, popping the record
	ListPage              time.Duration // DeadLetters: the first page of listPage records
	DeleteOne             time.Duration // the backend's DeleteDead of one record by ID (PostgreSQL only)
	Fill                  time.Duration // time to build the depth
	Redrive               time.Duration // Redrive of every dead letter, at redriveAt
	Redriven              int           // how many it redrove
	Err                   string
}

func (d depthResult) summary() string {
	if d.Err != "" {
		return "error: " + d.Err
	}
	s := fmt.Sprintf("enqueue %v, claim %v, NextDeadLetter keep %v pop %v, DeadLetters page %v (fill %v)", d.Enqueue, d.Claim, d.NextDead, d.NextDeadPop, d.ListPage, d.Fill.Round(time.Second))
	if d.DeleteOne > 0 {
		s += fmt.Sprintf(", DeleteDead(1) %v", d.DeleteOne)
	}
	if d.Redriven > 0 {
		s += fmt.Sprintf(", Redrive of %d %v", d.Redriven, d.Redrive.Round(time.Millisecond))
	}
	return s
}

// depthSamples is how many calls each median is taken over; listSamples
// for DeadLetters, whose page of listPage records costs more.
const (
	depthSamples = 200
	listSamples  = 20
	listPage     = 100
)

// measureDepth fills a queue with d.Dead dead letters (through handlers that
// fail permanently) and d.Work waiting jobs, then times Enqueue, a claim
// (the backend's Receive of one job; its Ack is not timed) and
// NextDeadLetter (keep: the record goes back, so the depth stays), each the
// median of depthSamples calls.
func measureDepth(backend string, d depth, srv servers) depthResult {
	res := depthResult{Backend: backend, Depth: d}
	ctx := context.Background()
	tag := fmt.Sprintf("depth-%d-%d", d.Work, os.Getpid())
	f, err := newFacade(ctx, backend, tag, srv)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer f.close()
	start := time.Now()
	fail := func(what string, err error) depthResult {
		res.Err = fmt.Sprintf("%s: %v", what, err)
		return res
	}
	// phase logs each step of a point as it ends, so that a point that
	// does not finish shows where its time went.
	phase := func(what string) {
		log.Printf("%s depth %d/%d: %s done at %v", backend, d.Work, d.Dead, what, time.Since(start).Round(time.Millisecond))
	}
	// Azurite walks every message of the account in every queue operation
	// (backend/azure, TestAzuriteDequeueCostFact): dead-lettering 10,000
	// waiting jobs at once runs at a few jobs a second there, so Azure's
	// dead letters are made 1,000 at a time.
	round := d.Dead
	if backend == "azure" {
		round = min(round, 1000)
	}
	if backend == "postgres" && d.Dead > redriveAt {
		// Copies of one record, in one statement: the fill's own cost is
		// not what is measured.
		if err := fillPostgresDead(ctx, f, d.Dead, srv.Postgres); err != nil {
			return fail("filling dead letters", err)
		}
		round = 0
	}
	if backend == "azure" && d.Dead > 1000 {
		// Copies of one record, written by the backend's dead-letter
		// write: the platform's worker loop on Azurite stalls for minutes
		// between rounds (see fillAzureDead).
		if err := fillAzureDead(ctx, f, d.Dead); err != nil {
			return fail("filling dead letters", err)
		}
		round = 0
		phase(fmt.Sprintf("%d dead letters made (copies)", d.Dead))
	}
	for made := 0; round > 0 && made < d.Dead; made += round {
		n := min(round, d.Dead-made)
		if err := fill(ctx, f, n); err != nil {
			return fail("filling", err)
		}
		if err := dead(ctx, f, n); err != nil {
			return fail("dead-lettering", err)
		}
		phase(fmt.Sprintf("%d dead letters made", made+n))
	}
	if err := fill(ctx, f, d.Work); err != nil {
		return fail("filling", err)
	}
	res.Fill = time.Since(start)
	phase("fill")

	res.Enqueue, err = median(depthSamples, func() error { return f.enqueue(ctx, newPayload(time.Now())) })
	if err != nil {
		return fail("enqueue", err)
	}
	// Waiting jobs are claimed by the backend directly: the platform has no
	// call for one claim.
	res.Claim, err = median(depthSamples, func() error {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		t := time.Now()
		ds, err := f.be.Receive(rctx, f.queue, 1, time.Minute)
		el := time.Since(t)
		for _, dl := range ds {
			_ = f.be.Ack(ctx, dl)
		}
		if err == nil && len(ds) == 0 {
			err = errors.New("no job claimed")
		}
		return timedErr{el, err}
	})
	if err != nil {
		return fail("claim", err)
	}
	phase("enqueue and claim")
	res.NextDead, err = median(depthSamples, func() error {
		return f.enq.NextDeadLetter(ctx, f.queue, func(context.Context, ap.DeadLetter) (bool, error) { return false, nil })
	})
	if err != nil {
		return fail("NextDeadLetter", err)
	}
	phase("keep")
	res.ListPage, err = median(listSamples, func() error {
		page, err := f.enq.DeadLetters(ctx, f.queue, "", listPage)
		if err == nil && len(page.Letters) != min(listPage, d.Dead) {
			err = fmt.Errorf("a page of %d dead letters, want %d", len(page.Letters), min(listPage, d.Dead))
		}
		return err
	})
	if err != nil {
		return fail("DeadLetters", err)
	}
	phase("page")
	if backend == "postgres" {
		// DeleteDead of one record (the dashboard's delete; Redrive and
		// purge delete by IDs too), a record of the first page each time.
		res.DeleteOne, err = median(listSamples, func() error {
			page, err := f.enq.DeadLetters(ctx, f.queue, "", 1)
			if err != nil || len(page.Letters) == 0 {
				return errors.Join(err, errors.New("no dead letter to delete"))
			}
			t := time.Now()
			n, err := f.be.DeleteDead(ctx, f.queue, []string{page.Letters[0].ID})
			if err == nil && n != 1 {
				err = fmt.Errorf("DeleteDead deleted %d records, want 1", n)
			}
			return timedErr{time.Since(t), err}
		})
		if err != nil {
			return fail("DeleteDead", err)
		}
	}
	res.NextDeadPop, err = median(min(depthSamples, d.Dead), func() error {
		return f.enq.NextDeadLetter(ctx, f.queue, func(context.Context, ap.DeadLetter) (bool, error) { return true, nil })
	})
	if err != nil {
		return fail("NextDeadLetter (pop)", err)
	}
	phase("pop")
	if d.Dead == redriveAt {
		// The pops took up to depthSamples records: make them again, so
		// that the redrive moves redriveAt.
		popped := min(depthSamples, d.Dead)
		if err := fill(ctx, f, popped); err != nil {
			return fail("filling", err)
		}
		if err := dead(ctx, f, popped); err != nil {
			return fail("dead-lettering", err)
		}
		t := time.Now()
		res.Redriven, err = f.enq.Redrive(ctx, f.queue)
		res.Redrive = time.Since(t)
		if err != nil {
			return fail("Redrive", err)
		}
	}
	return res
}

// timedErr lets a sampled call report its own duration.
type timedErr struct {
	d   time.Duration
	err error
}

func (t timedErr) Error() string { return fmt.Sprint(t.err) }

// median calls fn n times and returns the median duration. fn may return a
// timedErr to report the part it timed itself.
func median(n int, fn func() error) (time.Duration, error) {
	ds := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		err := fn()
		d := time.Since(t)
		var te timedErr
		if errors.As(err, &te) {
			d, err = te.d, te.err
		}
		if err != nil {
			return 0, err
		}
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// fill enqueues n jobs in batches of 1,000.
func fill(ctx context.Context, f *facade, n int) error {
	for i := 0; i < n; i += 1000 {
		batch := make([][]byte, min(1000, n-i))
		for j := range batch {
			batch[j] = newPayload(time.Now())
		}
		if err := f.enqueueBatch(ctx, batch); err != nil {
			return err
		}
	}
	return nil
}

// dead runs handlers that fail permanently until n jobs are dead-lettered.
func dead(ctx context.Context, f *facade, n int) error {
	if n == 0 {
		return nil
	}
	p, err := ap.New(f.be, ap.Config{Queues: map[string]ap.QueueConfig{f.queue: {Concurrency: 50}}, Logger: quiet})
	if err != nil {
		return err
	}
	var count atomic.Int64
	all := make(chan struct{})
	p.Handle("bench", func(context.Context, *ap.Job) error {
		if count.Add(1) == int64(n) {
			close(all)
		}
		return ap.Permanent(errors.New("bench"))
	})
	if err := p.Start(ctx); err != nil {
		return err
	}
	var timeout error
	select {
	case <-all:
	case <-time.After(10 * time.Minute):
		timeout = fmt.Errorf("%d of %d dead-lettered", count.Load(), n)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return errors.Join(timeout, p.Stop(sctx))
}
