package asyncplatform

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/executor"
	"github.com/asyncplatform/asyncplatform/internal/history"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/workers"
)

// DefaultWorkerHeartbeat is the default of Config.WorkerHeartbeat.
const DefaultWorkerHeartbeat = 10 * time.Second

// WorkerExpiry is how many heartbeats a worker's record outlives its last
// write by: a process that dies without Stop leaves Platform.Workers that
// long after its last heartbeat.
const WorkerExpiry = workers.Expiry

// WorkerInfo is one running platform (a worker process between Start and
// Stop), as the record it keeps in the backend's store says. Any process
// that reaches the store can write such a record: its strings are cut to
// 200 bytes and its queues to 100, but not escaped.
type WorkerInfo struct {
	// ID is the record's key: random, made by New.
	ID string
	// Name is the process's Config.WorkerName.
	Name string
	Host string
	PID  int
	// Queues are the queues it works, sorted.
	Queues []string
	// Concurrency is its handlers, over every queue.
	Concurrency int
	// Held is the jobs it held at its last heartbeat: running, or claimed
	// ahead for a free handler.
	Held int
	// StartedAt is when it started; BeatAt its last heartbeat.
	StartedAt, BeatAt time.Time
	// Version is the asyncplatform module's version it runs ("(devel)"
	// when built from a work tree, "unknown" when the build says none).
	Version string
	// Heartbeat is its Config.WorkerHeartbeat.
	Heartbeat time.Duration
}

// Workers lists the running platforms that share this backend's store,
// from the record each one writes at its heartbeat (Config.WorkerHeartbeat)
// and removes at Stop. A process that died without Stop is listed until
// WorkerExpiry heartbeats after its last one. At most 1,000 records are
// read; a record that does not parse is left out. Without a store the
// error matches ErrNoStore: workers then keep no records.
func (p *Platform) Workers(ctx context.Context) ([]WorkerInfo, error) {
	if p == nil || p.backend == nil {
		return nil, ErrNotNew
	}
	l, err := p.reg.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: %w", err)
	}
	out := make([]WorkerInfo, len(l.Workers))
	for i, w := range l.Workers {
		out[i] = WorkerInfo{ID: w.ID, Name: w.Name, Host: w.Host, PID: w.PID, Queues: w.Queues, Concurrency: w.Concurrency,
			Held: w.Running, StartedAt: w.StartedAt, BeatAt: w.BeatAt, Version: w.Version, Heartbeat: w.Interval}
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int {
		return strings.Compare(a.Name+"\x00"+a.ID, b.Name+"\x00"+b.ID)
	})
	return out, nil
}

// HistoryRetention is how long the throughput history keeps a minute.
const HistoryRetention = history.Retention

// HistorySeries is the attempts of one queue and job type that ended in
// one minute, counted by the workers that ran them. The pairs of a minute
// past the 200th are counted under queue and type "(other)".
type HistorySeries struct {
	Queue, Type string
	// Succeeded: acknowledged; Failed: failed and to be retried;
	// DeadLettered: dead-lettered after a handler call (a job
	// dead-lettered before any, as poisoned or expired, is not counted).
	Succeeded, Failed, DeadLettered int64
}

// HistoryMinute is one minute of the throughput history.
type HistoryMinute struct {
	Start  time.Time
	Series []HistorySeries
}

// History returns the throughput history from since (at most
// HistoryRetention ago) to now, oldest minute first: the attempts that
// ended per minute, by queue and job type, over every worker that shares
// this backend's store. A minute with no attempts is absent. Each worker
// counts in memory and writes its counts every Config.WorkerHeartbeat and
// at Stop, so the last minute or so may not be in yet. A read holds at
// most MaxHistoryReadBytes of minutes, the newest (ReadHistory says when
// it was cut). Without a store the error matches ErrNoStore.
func (p *Platform) History(ctx context.Context, since time.Time) ([]HistoryMinute, error) {
	r, err := p.ReadHistory(ctx, since)
	return r.Minutes, err
}

// MaxHistoryReadBytes bounds what one read of the throughput history
// (History, ReadHistory) reads from the store: a day of minutes of a few
// dozen queue and type pairs each fits; a day of full minutes (about
// 94 MB) does not, and the read then keeps the newest minutes.
const MaxHistoryReadBytes = history.DefaultMaxReadBytes

// HistoryRead is what ReadHistory read.
type HistoryRead struct {
	// Minutes are the minutes read, oldest first.
	Minutes []HistoryMinute
	// Cut says that the read stopped at MaxHistoryReadBytes: the minutes
	// from since to the first of Minutes were not read.
	Cut bool
}

// ReadHistory is History, and says whether the read was cut: it reads
// the newest minutes first and stops once they hold MaxHistoryReadBytes
// (plus at most one minute's record, 64 KiB).
func (p *Platform) ReadHistory(ctx context.Context, since time.Time) (HistoryRead, error) {
	if p == nil || p.backend == nil {
		return HistoryRead{}, ErrNotNew
	}
	if oldest := time.Now().Add(-HistoryRetention); since.Before(oldest) {
		since = oldest
	}
	r, err := p.hist.Read(ctx, since)
	if err != nil {
		return HistoryRead{}, fmt.Errorf("asyncplatform: %w", err)
	}
	out := HistoryRead{Minutes: make([]HistoryMinute, len(r.Minutes)), Cut: r.Cut}
	for i, m := range r.Minutes {
		out.Minutes[i].Start = m.Start
		out.Minutes[i].Series = make([]HistorySeries, len(m.Series))
		for j, s := range m.Series {
			out.Minutes[i].Series[j] = HistorySeries{Queue: s.Queue, Type: s.Type, Succeeded: s.Succeeded, Failed: s.Failed, DeadLettered: s.Dead}
		}
	}
	return out, nil
}

// newWorkers builds the worker registry and the history counter over the
// backend's store; without one both keep nothing.
func newWorkers(p *Platform) {
	wc := workers.Config{Interval: p.cfg.WorkerHeartbeat, Logger: p.log, Self: p.self}
	hc := history.Config{Logger: p.log}
	if d, err := driver.StoreOf(p.backend); err != nil {
		wc.NoStore, hc.NoStore = err, err
	} else {
		wc.Store, hc.Store = kv.Of(d, kv.Workers), kv.Of(d, kv.History)
	}
	p.reg, p.hist = workers.New(wc), history.New(hc)
}

// startWorkers starts the heartbeat and the history's flushes; both end
// with ctx, the heartbeat removing this worker's record.
func (p *Platform) startWorkers(ctx context.Context) {
	p.startedAt = time.Now().UTC()
	p.background.Go(func() { p.reg.Run(ctx) })
	p.background.Go(func() { p.hist.Run(ctx, p.cfg.WorkerHeartbeat) })
}

// self is this process's worker record.
func (p *Platform) self() workers.Info {
	host, _ := os.Hostname()
	in := workers.Info{Name: p.cfg.WorkerName, Host: host, PID: os.Getpid(), StartedAt: p.startedAt, Version: moduleVersion()}
	p.mu.Lock()
	qs := p.queues
	p.mu.Unlock()
	for _, q := range qs {
		in.Queues = append(in.Queues, q.Names()...)
		in.Concurrency += q.Concurrency()
		held, _ := q.Quiet()
		in.Running += held
	}
	slices.Sort(in.Queues)
	return in
}

// countAttempt counts an attempt's end in the throughput history.
func (p *Platform) countAttempt(w *executor.Work[Job], a executor.Attempt) {
	if w.Job == nil || a.Settle != nil {
		return // handed back by Stop, or not reported: the job comes back
	}
	switch a.Decision.Outcome {
	case decide.Succeeded:
		p.hist.Add(w.Job.Queue, w.Job.Type, history.Succeeded)
	case decide.Retried:
		p.hist.Add(w.Job.Queue, w.Job.Type, history.Failed)
	case decide.DeadLettered:
		p.hist.Add(w.Job.Queue, w.Job.Type, history.DeadLettered)
	}
}

// moduleVersion is the version of this module in the running binary.
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	const path = "github.com/asyncplatform/asyncplatform"
	if bi.Main.Path == path {
		return bi.Main.Version
	}
	for _, m := range bi.Deps {
		if m.Path == path {
			return m.Version
		}
	}
	return "unknown"
}
