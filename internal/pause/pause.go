// Package pause is the platform's flow switch: queues and groups of a
// queue's jobs paused by an operator, for every worker process. A pause is a
// key in the store (namespace kv.Flow): pause/<queue> for a queue,
// group/<queue>/<group> for a group. A working platform reads them at
// Start and every Config.Poll after, holds the gate of each paused queue it
// works, and sets the jobs of a paused group aside on the group's held
// queue (HeldQueue) until ResumeGroup moves them back.
package pause

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/health"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// The store's keys: pause/<queue> and group/<queue>/<group>.
const (
	queuePrefix = "pause/"
	groupPrefix = "group/"
)

// minPollTimeout is the shortest time one poll of the pauses may take.
const minPollTimeout = 2 * time.Second

// record is the value of a pause key: who paused the queue, and when.
type record struct {
	At time.Time `json:"at"`
	By string    `json:"by,omitempty"`
}

// Config is what an Engine works with.
type Config struct {
	// Store holds the pauses. Nil: the backend keeps no state and nothing
	// can be paused; NoStore says why.
	Store *kv.Store
	// NoStore is the error of a backend without a store; it matches
	// driver.ErrNoStore. Nil: driver.ErrNoStore.
	NoStore error
	// Backend carries the held queues, and hands back what it buffered of
	// a queue just paused when it is a driver.Releaser.
	Backend driver.Backend
	// Declare declares a queue before the engine writes to it.
	Declare func(ctx context.Context, queue string) error
	// Log receives the engine's records. Nil: slog.Default().
	Log *slog.Logger
	// Poll is how often Run reads the pauses.
	Poll time.Duration
	// Lease is the platform's lease: it bounds a worker's store read and
	// held-copy write (a third of it, at least a second) and sets the lease
	// ResumeGroup takes on held jobs.
	Lease time.Duration
	// Worker names this worker process in the records of the queues it
	// pauses.
	Worker string
	// Now is the clock of the records. Nil: time.Now.
	Now func() time.Time

	// Queues are the queues this process works; Start gives each a gate.
	Queues []string
	// Levels maps each priority level worked here to its queue: a level
	// pauses with its queue, and its jobs with their queue's groups.
	Levels map[string]string
	// LevelQueues returns the queues of a queue's priority levels, the
	// queue itself (level 0) first: ResumeGroup moves back what each
	// level's held queue holds. Nil: a queue has no levels.
	LevelQueues func(queue string) []string
	// Hold is called when a worked queue becomes paused, after its gate is
	// held and the backend has released what it buffered: it hands back
	// what the platform claimed ahead of the queue.
	Hold func(queue string)
	// Wake is called when a worked queue is paused or resumed: it wakes
	// the fetchers, which read the pause gates again (a pool cancels the
	// Receive it keeps waiting on a paused queue).
	Wake func()
	// Receiving reports whether a Receive of a worked queue may still run
	// in this process (or pass on what it got); it is counted before the
	// queue's gate is read. A pause calls the backend's Release only once
	// it is false: RabbitMQ's Release does nothing while a Receive reads
	// the queue. Nil: no Receive is waited for.
	Receiving func(queue string) bool
	// MoveBack returns the message that moves a held delivery back to its
	// queue, and the identity of the job it carries (a job held twice is
	// moved back once); an empty identity says it is no job, and the
	// message carries it as it is, for the queue's worker to dead-letter.
	MoveBack func(d *driver.Delivery) (id string, msg driver.Message)
}

// Engine keeps the pauses of queues and groups, and a worker's view of
// them. Its methods take queue and group names their caller checked
// (driver.CheckQueue, CheckGroup).
type Engine struct {
	cfg    Config
	gates  map[string]*health.Gate         // per worked queue, held while it is paused; set by Start
	groups atomic.Pointer[map[string]bool] // "queue/group" of each paused group; nil: none
}

// New returns an Engine with cfg.
func New(cfg Config) *Engine {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NoStore == nil {
		cfg.NoStore = driver.ErrNoStore
	}
	return &Engine{cfg: cfg}
}

func (e *Engine) store() (*kv.Store, error) {
	if e.cfg.Store == nil {
		return nil, fmt.Errorf("asyncplatform: pausing queues needs the backend's store: %w", e.cfg.NoStore)
	}
	return e.cfg.Store, nil
}

// Pause pauses queue: it writes its pause record, or leaves the one there.
func (e *Engine) Pause(ctx context.Context, queue string) error {
	s, err := e.store()
	if err != nil {
		return err
	}
	b, err := json.Marshal(record{At: e.cfg.Now().UTC(), By: e.cfg.Worker})
	if err != nil {
		return fmt.Errorf("asyncplatform: pausing queue %q: %w", queue, err)
	}
	if _, err := s.Create(ctx, queuePrefix+queue, b, 0); err != nil && !errors.Is(err, driver.ErrKeyExists) {
		return fmt.Errorf("asyncplatform: pausing queue %q: %w", queue, err)
	}
	e.cfg.Log.InfoContext(ctx, "asyncplatform: queue paused", "queue", queue)
	return nil
}

// Resume ends the pause of queue, if any.
func (e *Engine) Resume(ctx context.Context, queue string) error {
	s, err := e.store()
	if err != nil {
		return err
	}
	if err := s.Delete(ctx, queuePrefix+queue, ""); err != nil && !errors.Is(err, driver.ErrKeyNotFound) {
		return fmt.Errorf("asyncplatform: resuming queue %q: %w", queue, err)
	}
	e.cfg.Log.InfoContext(ctx, "asyncplatform: queue resumed", "queue", queue)
	return nil
}

// Queues returns the names of the paused queues, sorted; none, with no
// error, without a store. A key that is no queue name is left out.
func (e *Engine) Queues(ctx context.Context) ([]string, error) {
	s, err := e.store()
	if errors.Is(err, driver.ErrNoStore) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	err = s.ListAll(ctx, queuePrefix, func(k string) (bool, error) {
		if q := strings.TrimPrefix(k, queuePrefix); driver.CheckQueue(q) == nil {
			out = append(out, q)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: listing paused queues: %w", err)
	}
	return out, nil
}

// Paused reports whether queue is paused: false, with no error, without a
// store.
func (e *Engine) Paused(ctx context.Context, queue string) (bool, error) {
	s, err := e.store()
	if errors.Is(err, driver.ErrNoStore) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, _, err = s.Get(ctx, queuePrefix+queue)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, driver.ErrKeyNotFound):
		return false, nil
	}
	return false, fmt.Errorf("asyncplatform: reading whether queue %q is paused: %w", queue, err)
}

// Start gives every worked queue its gate, its context a child of base,
// and reads the pauses once, so that a worker started while its queue is
// paused claims nothing. Without a store it does nothing.
func (e *Engine) Start(ctx, base context.Context) error {
	if e.cfg.Store == nil {
		return nil
	}
	e.gates = make(map[string]*health.Gate, len(e.cfg.Queues))
	for _, name := range e.cfg.Queues {
		g := &health.Gate{}
		g.Init(nil)
		g.Start(base)
		e.gates[name] = g
	}
	return e.poll(ctx)
}

// Gate returns the gate of a worked queue: held while the queue is paused.
// Nil before Start, without a store, or for a queue not worked here.
func (e *Engine) Gate(queue string) *health.Gate { return e.gates[queue] }

// Run reads the pauses every Poll until ctx ends, keeping the last known
// states when a read fails. It returns at once when Start gave no gates.
func (e *Engine) Run(ctx context.Context) {
	if e.gates == nil {
		return
	}
	tick := time.NewTicker(e.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, max(e.cfg.Poll, minPollTimeout))
		err := e.poll(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			e.cfg.Log.Warn("asyncplatform: reading paused queues failed; keeping the last known states", "error", err)
		}
	}
}

// poll reads the paused queues and groups, and holds or releases each
// worked queue's gate to match: a priority level with its queue. A queue
// that becomes paused hands back, uncounted, what it claimed ahead.
func (e *Engine) poll(ctx context.Context) error {
	names, err := e.Queues(ctx)
	if err != nil {
		return err
	}
	if err := e.pollGroups(ctx); err != nil {
		return err
	}
	now := make(map[string]bool, len(names))
	for _, n := range names {
		now[n] = true
	}
	for name, g := range e.gates {
		if base, ok := e.cfg.Levels[name]; ok && now[base] {
			now[name] = true
		}
		switch {
		case now[name] && g.OK():
			g.Hold()
			e.cfg.Log.Info("asyncplatform: queue paused; taking none of its jobs", "queue", name)
			e.release(ctx, name)
		case !now[name] && !g.OK():
			g.Release()
			e.cfg.Log.Info("asyncplatform: queue resumed", "queue", name)
			if e.cfg.Wake != nil {
				e.cfg.Wake()
			}
		}
	}
	return nil
}

// release hands back what a paused queue claimed ahead: what the backend
// buffered, then the platform's own (Hold). In that order a hand-back's
// copy cannot reach the consumer being released (RabbitMQ delivered it
// there, and one arriving after the consumer's cancel came back counted:
// Flow/Pause). The backend's Release waits for the queue's Receive to
// return (the held gate has cancelled it, or keeps a new one from
// starting): a Release beside a running Receive is no release
// (TestPauseReleasesAfterReceive). When ctx ends first, Release is called
// all the same.
func (e *Engine) release(ctx context.Context, queue string) {
	if e.cfg.Wake != nil {
		e.cfg.Wake()
	}
	e.waitReceive(ctx, queue)
	if r, ok := e.cfg.Backend.(driver.Releaser); ok {
		if err := r.Release(ctx, queue); err != nil {
			e.cfg.Log.Warn("asyncplatform: releasing a paused queue's buffered messages failed; they come back after their lease", "queue", queue, "error", err)
		}
	}
	if e.cfg.Hold != nil {
		e.cfg.Hold(queue)
	}
}

// receivePoll is how often a pause looks whether the queue's Receive has
// returned.
const receivePoll = 2 * time.Millisecond

// waitReceive waits until no Receive of queue runs here, or ctx ends.
func (e *Engine) waitReceive(ctx context.Context, queue string) {
	if e.cfg.Receiving == nil || !e.cfg.Receiving(queue) {
		return
	}
	tick := time.NewTicker(receivePoll)
	defer tick.Stop()
	for e.cfg.Receiving(queue) {
		select {
		case <-ctx.Done():
			e.cfg.Log.Warn("asyncplatform: a paused queue's Receive still runs; releasing the backend's buffered messages beside it", "queue", queue, "error", ctx.Err())
			return
		case <-tick.C:
		}
	}
}
