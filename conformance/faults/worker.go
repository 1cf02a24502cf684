package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/childproc"
)

// childEnv carries a WorkerSpec, as JSON, to a child worker process.
const childEnv = "ASYNCPLATFORM_FAULTS_CHILD"

// The modes of WorkerSpec.DieInDeadLetter.
const (
	dieBefore = "before" // killed before the dead-letter write
	dieAfter  = "after"  // killed after the write and the settle returned
	dieDuring = "during" // killed at a random instant while the call runs
)

// WorkerSpec describes one worker: where it connects and how it works.
type WorkerSpec struct {
	Name        string
	Addr        string
	Queue       string
	Log         string // the history file it appends to
	Concurrency int
	Prefetch    int
	Lease       time.Duration
	RetryLimit  int
	PoisonLimit int
	RejectDelay time.Duration

	// NoExtend turns lease extension off: Extend reports success and does
	// nothing.
	NoExtend bool
	// DieInDeadLetter kills the worker inside its first DeadLetter call
	// (see the die* modes).
	DieInDeadLetter string
	// StopTimeout is how long Stop lets running handlers finish on SIGTERM.
	StopTimeout time.Duration
	// Heartbeat is the platform's WorkerHeartbeat (0: its default). The
	// parent sets it short where Stats cannot tell what is in flight, so
	// that run.quiet can read what each worker holds from its record.
	Heartbeat time.Duration
	// HoldDead makes the worker a dead-letter caller instead: it works no
	// job, takes the queue's oldest free dead letter with NextDeadLetter,
	// logs KindHeld and holds it, its callback never returning, until the
	// process is killed.
	HoldDead bool
	// DieAtSettle makes the worker honour Plan.DieAtSettle: a job whose
	// plan names a mode kills the worker at the settle of its first
	// attempt (see the die* modes: before the ack, or after it returned).
	DieAtSettle bool
}

// faulty wraps a backend to inject faults at the driver level. It passes
// the backend's store on (workflows need it); the backend's other optional
// interfaces are hidden, so only the scenarios that inject such faults
// wrap.
type faulty struct {
	driver.Backend
	noExtend bool
	dieIn    string
	crash    func()

	mu     sync.Mutex
	doomed map[*driver.Delivery]string // delivery -> die* mode at its ack
}

// Store returns the wrapped backend's store.
func (b *faulty) Store() (driver.Store, error) { return driver.StoreOf(b.Backend) }

// doom makes the ack of d kill the worker: before the ack (dieBefore) or
// after it returned (dieAfter).
func (b *faulty) doom(d *driver.Delivery, mode string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.doomed == nil {
		b.doomed = map[*driver.Delivery]string{}
	}
	b.doomed[d] = mode
}

func (b *faulty) Ack(ctx context.Context, d *driver.Delivery) error {
	b.mu.Lock()
	mode := b.doomed[d]
	delete(b.doomed, d)
	b.mu.Unlock()
	switch mode {
	case dieBefore:
		b.crash()
		return driver.ErrClosed
	case dieAfter:
		err := b.Backend.Ack(ctx, d)
		b.crash()
		return err
	}
	return b.Backend.Ack(ctx, d)
}

func (b *faulty) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	if b.noExtend {
		return nil
	}
	return b.Backend.Extend(ctx, d, lease)
}

func (b *faulty) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	switch b.dieIn {
	case dieBefore:
		b.crash()
		return driver.ErrClosed
	case dieAfter:
		err := b.Backend.DeadLetter(ctx, d, rec)
		b.crash()
		return err
	case dieDuring:
		done := make(chan error, 1)
		go func() { done <- b.Backend.DeadLetter(ctx, d, rec) }()
		t := time.NewTimer(rand.N(3 * time.Millisecond))
		defer t.Stop()
		var err error
		select {
		case <-t.C:
			err = driver.ErrClosed
		case err = <-done:
		}
		b.crash()
		return err
	}
	return b.Backend.DeadLetter(ctx, d, rec)
}

// quiet is the platform's logger: warnings and errors go to stderr only when
// ASYNCPLATFORM_FAULTS_VERBOSE is set.
func quiet() *slog.Logger {
	if os.Getenv("ASYNCPLATFORM_FAULTS_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// lostLeases is a platform's log handler: it passes every record on to next
// and writes a KindLost event for each warning that a lease was lost.
type lostLeases struct {
	next   slog.Handler
	log    *Log
	worker string
}

func (l *lostLeases) Enabled(ctx context.Context, lv slog.Level) bool {
	return lv >= slog.LevelWarn || l.next.Enabled(ctx, lv)
}

func (l *lostLeases) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && (strings.Contains(r.Message, "lease lost") || strings.Contains(r.Message, "could not extend a lease")) {
		l.log.Add(Event{Kind: KindLost, Worker: l.worker})
	}
	if !l.next.Enabled(ctx, r.Level) {
		return nil
	}
	return l.next.Handle(ctx, r)
}

func (l *lostLeases) WithAttrs(as []slog.Attr) slog.Handler {
	return &lostLeases{next: l.next.WithAttrs(as), log: l.log, worker: l.worker}
}

func (l *lostLeases) WithGroup(name string) slog.Handler {
	return &lostLeases{next: l.next.WithGroup(name), log: l.log, worker: l.worker}
}

// startPlatform starts a platform working spec's queue over b, recording
// into log. crash kills the worker; running counts the handlers running.
func startPlatform(ctx context.Context, b driver.Backend, spec WorkerSpec, log *Log, crash func(), running *handlers) (*ap.Platform, error) {
	var doom func(*driver.Delivery, string)
	if spec.NoExtend || spec.DieInDeadLetter != "" || spec.DieAtSettle {
		f := &faulty{Backend: b, noExtend: spec.NoExtend, dieIn: spec.DieInDeadLetter, crash: crash}
		if spec.DieAtSettle {
			doom = f.doom
		}
		b = f
	}
	cfg := ap.Config{
		Queues: map[string]ap.QueueConfig{spec.Queue: {Concurrency: spec.Concurrency, Prefetch: ap.Limit(spec.Prefetch)}},
		Policy: ap.Policy{
			RetryLimit:  ap.Limit(spec.RetryLimit),
			PoisonLimit: ap.Limit(spec.PoisonLimit),
			BackoffBase: 10 * time.Millisecond,
			BackoffCap:  50 * time.Millisecond,
			Timeout:     time.Minute,
		},
		Lease:            spec.Lease,
		RejectDelay:      spec.RejectDelay,
		UnhandledRetries: ap.Limit(0),
		HealthInterval:   100 * time.Millisecond,
		WorkerName:       spec.Name,
		WorkerHeartbeat:  spec.Heartbeat,
		Logger:           slog.New(&lostLeases{next: quiet().Handler(), log: log, worker: spec.Name}),
		Hooks: ap.Hooks{
			OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) {
				log.Add(Event{Kind: KindDead, ID: dl.Job.ID, Worker: spec.Name, Result: string(dl.Reason), Copy: dl.Job.CopyNumber()})
			},
			AfterAttempt: func(_ context.Context, a ap.Attempt) {
				log.Add(Event{Kind: KindAck, ID: a.Job.ID, Worker: spec.Name, Result: string(a.Outcome),
					Try: a.Job.TryCount, Failures: a.Job.Failures, Crashes: a.Job.Crashes, Copy: a.Job.CopyNumber()})
			},
		},
	}
	p, err := ap.New(b, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Handle(jobType, handler(log, spec.Name, crash, doom, running)); err != nil {
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// worker is one worker the parent controls: a child process, or a platform
// in this process.
type worker interface {
	// Kill kills the worker abruptly (SIGKILL, or a closed connection).
	Kill()
	// Term stops it gracefully (SIGTERM: Stop with the spec's timeout) and
	// waits until it is gone.
	Term()
	// Done is closed when the worker is gone.
	Done() <-chan struct{}
	// Name is the worker's name in the history.
	Name() string
}

// ---- in-process workers ----

type inproc struct {
	name    string
	b       driver.Backend
	p       *ap.Platform
	log     *Log
	stop    time.Duration
	running handlers
	started chan struct{} // closed once p is set (a job may crash the worker during Start)

	once sync.Once
	done chan struct{}
}

func startInproc(ctx context.Context, tg Target, spec WorkerSpec) (*inproc, error) {
	b, err := tg.Open(ctx, spec.Addr)
	if err != nil {
		return nil, err
	}
	log, err := OpenLog(spec.Log)
	if err != nil {
		b.Close()
		return nil, err
	}
	w := &inproc{name: spec.Name, b: b, log: log, stop: spec.StopTimeout, done: make(chan struct{}), started: make(chan struct{})}
	p, err := startPlatform(ctx, b, spec, log, w.crash, &w.running)
	w.p = p
	close(w.started)
	if err != nil {
		b.Close()
		log.Close()
		return nil, err
	}
	return w, nil
}

func (w *inproc) Name() string          { return w.name }
func (w *inproc) Done() <-chan struct{} { return w.done }

// crash is an in-process crash, callable from the worker's own goroutines:
// the history stops and the connection closes at once (abandoning every
// unsettled delivery, as a dead process would); the platform's goroutines
// are wound down in the background.
func (w *inproc) crash() {
	w.log.crash()
	w.b.Close()
	go w.Kill()
}

// Kill crashes the worker and waits until its goroutines are gone.
func (w *inproc) Kill() {
	w.once.Do(func() {
		w.log.crash()
		w.b.Close()
		<-w.started
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		if w.p != nil {
			w.p.Stop(ctx)
		}
		w.running.wait(5 * time.Second)
		w.log.Close()
		close(w.done)
	})
	<-w.done
}

func (w *inproc) Term() {
	w.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), w.stop)
		defer cancel()
		w.p.Stop(ctx)
		w.running.wait(5 * time.Second) // the cancelled handlers write their ends
		w.b.Close()
		w.log.Close()
		close(w.done)
	})
	<-w.done
}

// handlers counts the handlers running. A handler may start while a
// worker being killed waits for them (a sync.WaitGroup forbids an Add
// from zero concurrent with its Wait), so the wait polls the count.
type handlers struct{ n atomic.Int64 }

// wait waits until no handler runs, at most d.
func (h *handlers) wait(d time.Duration) {
	for end := time.Now().Add(d); h.n.Load() > 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
}

// ---- child processes ----

// child is a worker process, seen from the run.
type child struct {
	name string
	p    *childproc.Proc
}

// startChild re-executes the test binary, running only the test at path,
// which calls Run and so becomes the worker described by spec. Its output
// goes to a file of its own in outDir.
func startChild(path string, spec WorkerSpec, outDir string) (*child, error) {
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	out, err := os.Create(filepath.Join(outDir, spec.Name+".out"))
	if err != nil {
		return nil, err
	}
	p, err := childproc.Start(childproc.Config{Test: path, Env: childEnv, Value: string(js), Timeout: 10 * time.Minute, Output: out, DieWithParent: true})
	if err != nil {
		out.Close()
		return nil, err
	}
	go func() {
		<-p.Done()
		out.Close()
	}()
	return &child{name: spec.Name, p: p}, nil
}

func (c *child) Name() string          { return c.name }
func (c *child) Done() <-chan struct{} { return c.p.Done() }

// Kill kills the worker with SIGKILL and waits for it to exit.
func (c *child) Kill() { c.p.Kill() }

// Term sends the worker SIGTERM and waits for it to exit; after 30 s it is
// killed.
func (c *child) Term() { c.p.Term(30 * time.Second) }

// runChild is the body of a child worker process. It never returns.
func runChild(tg Target, js string) {
	var spec WorkerSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "faults child: bad spec: %v\n", err)
		os.Exit(2)
	}
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "faults child %s: %s: %v\n", spec.Name, what, err)
		os.Exit(3)
	}
	log, err := OpenLog(spec.Log)
	if err != nil {
		fail("opening the history", err)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	crash := func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }

	if spec.HoldDead {
		holdDead(tg, spec, log, fail)
	}

	// The broker may be restarting: keep trying for a while.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	var p *ap.Platform
	var b driver.Backend
	var running handlers
	for {
		b, err = tg.Open(ctx, spec.Addr)
		if err == nil {
			if p, err = startPlatform(ctx, b, spec, log, crash, &running); err == nil {
				break
			}
			b.Close()
		}
		if ctx.Err() != nil {
			fail("starting", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cancel()

	orphaned := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // EOF: the parent closed it or died
		close(orphaned)
	}()
	select {
	case <-term:
		ctx, cancel := context.WithTimeout(context.Background(), spec.StopTimeout)
		p.Stop(ctx)
		cancel()
		running.wait(5 * time.Second) // the cancelled handlers write their ends
		b.Close()
		log.Close()
		os.Exit(0)
	case <-orphaned:
		os.Exit(4)
	case <-time.After(5 * time.Minute):
		fmt.Fprintf(os.Stderr, "faults child %s: lived 5 minutes; exiting\n", spec.Name)
		os.Exit(5)
	}
}

// holdDead is the body of a HoldDead child: it takes one dead letter and
// holds it until the process is killed, or exits when its parent is gone
// or it has lived 5 minutes. It never returns.
func holdDead(tg Target, spec WorkerSpec, log *Log, fail func(string, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // EOF: the parent closed it or died
		os.Exit(4)
	}()
	octx, ocancel := context.WithTimeout(ctx, 60*time.Second)
	b, err := tg.Open(octx, spec.Addr)
	ocancel()
	if err != nil {
		fail("opening the backend", err)
	}
	p, err := ap.New(b, ap.Config{Logger: quiet(), WorkerName: spec.Name, Queues: map[string]ap.QueueConfig{spec.Queue: {}}})
	if err != nil {
		fail("making the platform", err)
	}
	for ctx.Err() == nil {
		err := p.NextDeadLetter(ctx, spec.Queue, func(ctx context.Context, dl ap.DeadLetter) (bool, error) {
			log.Add(Event{Kind: KindHeld, ID: dl.Job.ID, Worker: spec.Name, Try: dl.Job.TryCount})
			<-ctx.Done() // held until the kill
			return false, ctx.Err()
		})
		if err != nil && !errors.Is(err, driver.ErrNoDeadLetters) && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "faults child %s: NextDeadLetter: %v\n", spec.Name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "faults child %s: held a dead letter 5 minutes; exiting\n", spec.Name)
	os.Exit(5)
}
