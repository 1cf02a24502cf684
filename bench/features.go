package main

// The features rows: what switching one feature on costs the processing
// rate, each feature alone, on the same backend in the same run. Each run
// is a child process of its own (so its allocations are its alone): N jobs
// enqueued one at a time, then a platform at concurrency featureConc
// works them with a no-op handler, timed from its Start to the N-th
// handler call. The features are alternated, round after round, so that
// the machine's load falls on all of them alike; the table gives each
// one's median.

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// featuresSystem names the features child in a childSpec.
const featuresSystem = "features"

const (
	featureConc   = 20 // the workers' concurrency
	featureRounds = 3  // rounds of every feature
	// featureMemoryScale multiplies N on the memory backend: at several
	// hundred thousand jobs/s a run of N = 10,000 lasts tens of
	// milliseconds, shorter than a GC cycle's swing.
	featureMemoryScale = 20
)

// A feature is one configuration measured: its name in the table and what
// it sets.
type feature struct {
	Name  string
	Label string
	set   func(c *ap.Config)
	key   bool // every job gets a UniqueKey
}

// features are the configurations measured, "nothing" first: the others
// are given as its ratio. The limits are far above what the run reaches,
// so what is measured is their bookkeeping.
var features = []feature{
	{Name: "none", Label: "nothing"},
	{Name: "status", Label: "TrackStatus", set: func(c *ap.Config) { c.TrackStatus = true }},
	{Name: "unique", Label: "UniqueKey on every job", key: true},
	{Name: "cluster", Label: "ClusterConcurrency 80", set: func(c *ap.Config) {
		c.Limits = map[string]ap.TypeLimit{"bench": {ClusterConcurrency: 80}}
	}},
	{Name: "rate", Label: "Rate 1,000,000/s, burst 1,000", set: func(c *ap.Config) {
		c.Limits = map[string]ap.TypeLimit{"bench": {Rate: 1e6, Burst: 1000}}
	}},
}

// featureRun is what one features child reports.
type featureRun struct {
	Backend, Feature string
	Process          float64 // jobs/s, to the N-th handler call
	Stopped          float64 // jobs/s, to Stop's return: what the process left to write (status ends) written
	AllocsPerJob     float64 // heap allocations per job while processing
	ClientCPU        float64 // µs of this process's CPU per job while processing
	ServerCPU        float64 // µs of the local servers' CPU per job while processing (see serverCPU); 0: none found
	Load             float64
	Err              string
}

// featuresResult is one backend's table row: each feature's runs.
type featuresResult struct {
	Backend string
	N       int
	Runs    map[string][]featureRun
}

// median returns the median processing rate of a feature's runs, and the
// median allocations per job, over the runs that finished.
func (r featuresResult) median(name string) (rate, allocs float64, errs []string) {
	var rates, as []float64
	for _, run := range r.Runs[name] {
		if run.Err != "" {
			errs = append(errs, run.Err)
			continue
		}
		rates, as = append(rates, run.Process), append(as, run.AllocsPerJob)
	}
	return medianOf(rates), medianOf(as), errs
}

// cpu returns the median client and server CPU per job (µs) of a
// feature's runs that finished.
func (r featuresResult) cpu(name string) (client, server float64) {
	var cs, ss []float64
	for _, run := range r.Runs[name] {
		if run.Err == "" {
			cs, ss = append(cs, run.ClientCPU), append(ss, run.ServerCPU)
		}
	}
	return medianOf(cs), medianOf(ss)
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// measureFeatures measures every backend o names, the features alternated.
func measureFeatures(o options) []featuresResult {
	var out []featuresResult
	for _, b := range storeBackends(o) {
		n := o.N
		switch b {
		case "azure":
			n = o.AzureN
		case "memory":
			n = featureMemoryScale * o.N
		}
		r := featuresResult{Backend: b, N: n, Runs: map[string][]featureRun{}}
		for round := range featureRounds {
			for _, f := range features {
				if o.FeatureSet != "" && !slices.Contains(strings.Split(o.FeatureSet, ","), f.Name) {
					continue
				}
				run := featureRun{Backend: b, Feature: f.Name}
				spec := childSpec{Backend: b, System: featuresSystem, Feature: f.Name, Plan: plan{N: n}, Srv: o.Srv}
				if o.Profile != "" {
					spec.Profile, _ = filepath.Abs(filepath.Join(o.Profile, fmt.Sprintf("features-%s-%s-r%d.pprof", b, f.Name, round+1)))
				}
				if err := runJSONChild(spec, 10*time.Minute, &run); err != nil {
					run.Err = err.Error()
				}
				log.Printf("%s features round %d %s: %.0f jobs/s, %.1f allocs/job; %.0f jobs/s to Stop; CPU µs/job client %.1f server %.1f %s", b, round+1, f.Name, run.Process, run.AllocsPerJob, run.Stopped, run.ClientCPU, run.ServerCPU, run.Err)
				r.Runs[f.Name] = append(r.Runs[f.Name], run)
			}
		}
		out = append(out, r)
	}
	return out
}

// runFeaturesChild measures one feature on one backend and prints the
// result as JSON.
func runFeaturesChild(spec childSpec) {
	r := featureRun{Backend: spec.Backend, Feature: spec.Feature, Load: loadAvg()}
	if err := featureLoop(context.Background(), spec, &r); err != nil {
		r.Err = err.Error()
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

func featureLoop(ctx context.Context, spec childSpec, r *featureRun) (err error) {
	i := slices.IndexFunc(features, func(f feature) bool { return f.Name == spec.Feature })
	if i < 0 {
		return fmt.Errorf("unknown feature %q", spec.Feature)
	}
	f := features[i]
	tag := fmt.Sprintf("feat-%s-%d", f.Name, time.Now().UnixNano())
	be, cleanup, err := openUniqueBackend(ctx, spec.Backend, tag, spec.Srv)
	if err != nil {
		return err
	}
	queue := "bench-" + tag
	defer func() {
		fc := &facade{be: be, queue: queue, cleanup: func() {}}
		if cerr := fc.close(); cerr != nil && err == nil {
			err = fmt.Errorf("cleanup: %w", cerr)
		}
		if cerr := cleanup(); cerr != nil && err == nil {
			err = fmt.Errorf("cleanup: %w", cerr)
		}
	}()
	config := func(c int) ap.Config {
		cfg := ap.Config{Queues: map[string]ap.QueueConfig{queue: {Concurrency: c}}, Logger: quiet}
		if f.set != nil {
			f.set(&cfg)
		}
		return cfg
	}
	enq, err := ap.New(be, config(1))
	if err != nil {
		return err
	}
	payload := newPayload(time.Now())
	for j := range spec.Plan.N {
		job := &ap.Job{Type: "bench", Queue: queue, Payload: payload}
		if f.key {
			job.UniqueKey = tag + "-" + strconv.Itoa(j)
		}
		if err := enq.Enqueue(ctx, job); err != nil {
			return fmt.Errorf("enqueue %d: %w", j, err)
		}
	}
	p, err := ap.New(be, config(featureConc))
	if err != nil {
		return err
	}
	done := make(chan struct{})
	var count int64
	target := int64(spec.Plan.N)
	var mu = make(chan struct{}, 1)
	if err := p.Handle("bench", func(context.Context, *ap.Job) error {
		mu <- struct{}{}
		count++
		if count == target {
			close(done)
		}
		<-mu
		return nil
	}); err != nil {
		return err
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if spec.Profile != "" { // from Start to the N-th handler call
		if pf, perr := os.Create(spec.Profile); perr == nil {
			defer pf.Close()
			if perr := pprof.StartCPUProfile(pf); perr == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	cpu0, srv0 := cpuTime(), serverCPU(spec.Backend)
	start := time.Now()
	if err := p.Start(ctx); err != nil {
		return err
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		err = fmt.Errorf("%d of %d jobs handled in 5 min", count, target)
	}
	elapsed := time.Since(start)
	cpu1, srv1 := cpuTime(), serverCPU(spec.Backend)
	pprof.StopCPUProfile()
	runtime.ReadMemStats(&after)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	serr := p.Stop(sctx)
	stopped := time.Since(start)
	cancel()
	if err != nil {
		return err
	}
	if serr == nil {
		r.Stopped = float64(target) / stopped.Seconds()
	}
	r.Process = float64(target) / elapsed.Seconds()
	r.AllocsPerJob = float64(after.Mallocs-before.Mallocs) / float64(target)
	r.ClientCPU = float64((cpu1 - cpu0).Microseconds()) / float64(target)
	if srv0 > 0 && srv1 >= srv0 {
		r.ServerCPU = float64((srv1 - srv0).Microseconds()) / float64(target)
	}
	return nil
}

// serverProcs names the local server processes of each backend whose CPU
// the features rows count: RabbitMQ's with its PostgreSQL companion's.
var serverProcs = map[string][]string{
	"redis":    {"redis-server"},
	"nats":     {"nats-server"},
	"rabbit":   {"beam.smp", "postgres"},
	"postgres": {"postgres"},
}

// serverCPU returns the CPU time, user and system, that the processes on
// this machine named as backend's servers (serverProcs) have used, their
// exited children's included (PostgreSQL's closed connections), from
// /proc; 0 when none is found. A shared server's other clients count too.
func serverCPU(backend string) time.Duration {
	names := serverProcs[backend]
	if len(names) == 0 {
		return 0
	}
	dirs, _ := os.ReadDir("/proc")
	var ticks int64
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		open, close := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || close < open || !slices.Contains(names, string(b[open+1:close])) {
			continue
		}
		f := strings.Fields(string(b[close+1:])) // from the state, field 3
		if len(f) < 15 {
			continue
		}
		for _, i := range []int{11, 12, 13, 14} { // utime, stime, cutime, cstime: fields 14 to 17
			n, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ: 100 on Linux
}

// writeFeatures writes the features table.
func (rep *report) writeFeatures(w func(string, ...any)) {
	if len(rep.Features) == 0 {
		return
	}
	w("## Features used: what each costs when switched on\n\n")
	w("Each feature alone, through our facade in a process of its own: N jobs enqueued one at a time (with the feature's configuration), then a platform at concurrency %d works them with a no-op handler, timed from its `Start` to the N-th handler call. The features are alternated over %d rounds in the same run; each cell is the median processing rate, its ratio to *nothing* in the same backend, the heap allocations per job while processing (the whole process: for memory the broker too), and the CPU time per job while processing: the process's, plus the local servers' (read from /proc by name: redis-server, nats-server, RabbitMQ's beam.smp with PostgreSQL's postgres; a shared server's other clients count too). On 2 cores shared by the process and the servers, a feature whose CPU per job doubles halves the rate even with no round trip added. The limits are far above what the run reaches: what they cost is their bookkeeping (RabbitMQ's store: the PostgreSQL companion, `pgstore`).\n\n",
		featureConc, featureRounds)
	w("| backend | N |")
	for _, f := range features {
		w(" %s |", f.Label)
	}
	w("\n|---|--:|")
	for range features {
		w("--:|")
	}
	w("\n")
	var notes []string
	for _, r := range rep.Features {
		base, _, _ := r.median("none")
		w("| %s | %d |", r.Backend, r.N)
		for _, f := range features {
			rate, allocs, errs := r.median(f.Name)
			cell := "–"
			if rate > 0 {
				cell = rateCell(rate)
				if f.Name != "none" {
					cell += " (" + ratioCell(rate, base) + ")"
				}
				cell += fmt.Sprintf(", %.0f allocs", allocs)
				if c, sv := r.cpu(f.Name); sv > 0 {
					cell += fmt.Sprintf("; CPU %.0f + %.0f µs", c, sv)
				} else {
					cell += fmt.Sprintf("; CPU %.0f µs", c)
				}
			}
			w(" %s |", cell)
			for _, e := range errs {
				notes = append(notes, fmt.Sprintf("%s %s: %s", r.Backend, f.Name, e))
			}
		}
		w("\n")
	}
	w("\n")
	for _, n := range notes {
		w("- %s\n", n)
	}
	if len(notes) > 0 {
		w("\n")
	}
}
