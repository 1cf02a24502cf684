package asyncplatform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/health"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// PausePoll is how often a working platform reads which queues are paused:
// a Pause stops every worker process's claims within about this long, so a
// caller that must know every worker has stopped claiming (a deploy
// script, a test) waits twice this after Pause returns.
const PausePoll = 500 * time.Millisecond

// pauseRecord is the value of a pause key: who paused the queue, and when.
type pauseRecord struct {
	At time.Time `json:"at"`
	By string    `json:"by,omitempty"`
}

// pauses is the platform's view of the paused queues.
type pauses struct {
	store  *Store                          // nil: the backend keeps no state, nothing can be paused
	gates  map[string]*health.Gate         // per worked queue, held while it is paused; set by Start
	groups atomic.Pointer[map[string]bool] // "queue/group" of each paused group; nil: none
}

func (p *Platform) pauseStore() (*Store, error) {
	if p == nil || p.backend == nil {
		return nil, ErrNotNew
	}
	if p.pz.store == nil {
		_, err := driver.StoreOf(p.backend)
		return nil, fmt.Errorf("asyncplatform: pausing queues needs the backend's store: %w", err)
	}
	return p.pz.store, nil
}

// initPauseStore finds the store pauses live in, once, at New.
func (p *Platform) initPauseStore() {
	if d, err := driver.StoreOf(p.backend); err == nil {
		p.pz.store = &Store{s: kv.Of(d, kv.Flow)} // pause/<queue> and group/<queue>/<group>
	}
}

// Pause pauses a queue for every worker process of every platform over the
// backend, until Resume, surviving restarts: within about PausePoll each
// worker stops claiming the queue's jobs, hands back uncounted the jobs it
// claimed ahead, and lets its running handlers finish. Jobs keep being
// enqueued; none is lost, and no try is spent. Pausing a paused queue does
// nothing. The pause is kept in the backend's store: a backend without one
// (RabbitMQ without a companion store) gives an error matching ErrNoStore.
func (p *Platform) Pause(ctx context.Context, queue string) error {
	if err := validQueue(queue); err != nil {
		return err
	}
	s, err := p.pauseStore()
	if err != nil {
		return err
	}
	b, _ := json.Marshal(pauseRecord{At: time.Now().UTC(), By: p.cfg.WorkerName})
	_, err = s.Create(ctx, "pause/"+queue, b, 0)
	if err != nil && !errors.Is(err, ErrKeyExists) {
		return fmt.Errorf("asyncplatform: pausing queue %q: %w", queue, err)
	}
	p.log.InfoContext(ctx, "asyncplatform: queue paused", "queue", queue)
	return nil
}

// Resume undoes Pause: within about PausePoll every worker takes the
// queue's jobs again. Resuming a queue that is not paused does nothing.
func (p *Platform) Resume(ctx context.Context, queue string) error {
	if err := validQueue(queue); err != nil {
		return err
	}
	s, err := p.pauseStore()
	if err != nil {
		return err
	}
	if err := s.Delete(ctx, "pause/"+queue, ""); err != nil && !errors.Is(err, ErrKeyNotFound) {
		return fmt.Errorf("asyncplatform: resuming queue %q: %w", queue, err)
	}
	p.log.InfoContext(ctx, "asyncplatform: queue resumed", "queue", queue)
	return nil
}

// PausedQueues returns the names of the paused queues, sorted. A backend
// without a store has none.
func (p *Platform) PausedQueues(ctx context.Context) ([]string, error) {
	s, err := p.pauseStore()
	if errors.Is(err, ErrNoStore) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	cursor := ""
	for {
		page, err := s.List(ctx, "pause/", cursor, MaxListLimit)
		if err != nil {
			return nil, fmt.Errorf("asyncplatform: listing paused queues: %w", err)
		}
		for _, k := range page.Keys {
			if q := strings.TrimPrefix(k, "pause/"); validQueue(q) == nil {
				out = append(out, q)
			}
		}
		if page.Next == "" {
			return out, nil
		}
		cursor = page.Next
	}
}

// paused reports whether one queue is paused: false, with no error, on a
// backend without a store.
func (p *Platform) paused(ctx context.Context, queue string) (bool, error) {
	s, err := p.pauseStore()
	if errors.Is(err, ErrNoStore) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, _, err = s.Get(ctx, "pause/"+queue)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrKeyNotFound):
		return false, nil
	}
	return false, fmt.Errorf("asyncplatform: reading whether queue %q is paused: %w", queue, err)
}

// initPauses gives every worked queue its pause gate, when the backend has
// a store, and reads the pauses once so that a worker started while its
// queue is paused claims nothing.
func (p *Platform) initPauses(ctx context.Context, base context.Context) error {
	if _, err := p.pauseStore(); err != nil {
		if errors.Is(err, ErrNoStore) {
			return nil
		}
		return err
	}
	p.pz.gates = make(map[string]*health.Gate, len(p.cfg.Queues))
	for name := range p.cfg.Queues {
		g := &health.Gate{}
		g.Init(nil)
		g.Start(base)
		p.pz.gates[name] = g
	}
	return p.pollPauses(ctx)
}

// startPauses reads the pauses every PausePoll until ctx ends.
func (p *Platform) startPauses(ctx context.Context) {
	if p.pz.gates == nil {
		return
	}
	p.every(ctx, PausePoll, func(ctx context.Context) {
		pctx, cancel := context.WithTimeout(ctx, max(PausePoll, 2*time.Second))
		defer cancel()
		if err := p.pollPauses(pctx); err != nil && ctx.Err() == nil {
			p.log.Warn("asyncplatform: reading paused queues failed; keeping the last known states", "error", err)
		}
	})
}

// pollPauses reads the paused queues and holds or releases each worked
// queue's gate to match. A queue that becomes paused hands back, uncounted,
// what it claimed ahead.
func (p *Platform) pollPauses(ctx context.Context) error {
	names, err := p.PausedQueues(ctx)
	if err != nil {
		return err
	}
	if err := p.pollGroups(ctx); err != nil {
		return err
	}
	now := make(map[string]bool, len(names))
	for _, n := range names {
		now[n] = true
	}
	for name, g := range p.pz.gates {
		if lv, ok := p.cfg.levels[name]; ok && now[lv.base] { // a priority level pauses with its queue
			now[name] = true
		}
		switch {
		case now[name] && g.OK():
			g.Hold()
			p.log.Info("asyncplatform: queue paused; taking none of its jobs", "queue", name)
			p.releasePaused(ctx, name)
		case !now[name] && !g.OK():
			g.Release()
			p.log.Info("asyncplatform: queue resumed", "queue", name)
			for _, q := range p.queues {
				q.Wake()
			}
		}
	}
	return nil
}

// releasePaused hands back what a paused queue claimed ahead: the
// platform's own (those still waiting for a worker are handed back by
// process as a worker takes them) and what the backend buffered.
func (p *Platform) releasePaused(ctx context.Context, queue string) {
	for _, q := range p.queues {
		names := q.Names()
		if len(names) == 1 && names[0] == queue {
			q.HandBackQueued(p.handBack)
		}
		// A pool's claimed-ahead jobs of other queues stay: its workers
		// hand back the paused queue's as they take them (process).
		if len(names) > 1 && slices.Contains(names, queue) {
			q.Wake()
		}
	}
	if r, ok := p.backend.(driver.Releaser); ok {
		if err := r.Release(ctx, queue); err != nil {
			p.log.Warn("asyncplatform: releasing a paused queue's buffered messages failed; they come back after their lease", "queue", queue, "error", err)
		}
	}
}
