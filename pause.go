package asyncplatform

import (
	"context"
	"slices"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/pause"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// PausePoll is how often a working platform reads which queues are paused:
// a Pause stops every worker process's claims within about this long, so a
// caller that must know every worker has stopped claiming (a deploy
// script, a test) waits twice this after Pause returns.
const PausePoll = 500 * time.Millisecond

// newPauses wires the pause engine of p: its store (pause/<queue> and
// group/<queue>/<group>), the queues p works, and p's runners and
// encoding.
func newPauses(p *Platform) *pause.Engine {
	cfg := pause.Config{
		Backend: p.backend, Declare: p.enq.Declare, Log: p.log,
		Poll: PausePoll, Lease: p.cfg.Lease, Worker: p.cfg.WorkerName,
		Levels: make(map[string]string, len(p.cfg.levels)),
		Hold: func(queue string) {
			for _, q := range p.queues {
				names := q.Names()
				if len(names) == 1 && names[0] == queue {
					q.HandBackQueued(p.exec.HandBack)
				}
				// A pool's claimed-ahead jobs of other queues stay: its
				// workers hand back the paused queue's as they take them
				// (process).
				if len(names) > 1 && slices.Contains(names, queue) {
					q.Wake()
				}
			}
		},
		Wake: func() {
			for _, q := range p.queues {
				q.Wake()
			}
		},
		Receiving: func(queue string) bool {
			for _, q := range p.queues {
				if q.Receiving(queue) {
					return true
				}
			}
			return false
		},
		LevelQueues: func(queue string) []string {
			qs := make([]string, 0, MaxPriority+1)
			for l := range MaxPriority + 1 {
				qs = append(qs, PriorityQueue(queue, l))
			}
			return qs
		},
		MoveBack: func(d *driver.Delivery) (string, driver.Message) {
			id, msg, err := p.exec.HeldCopy(d)
			if err != nil {
				return "", driver.Message{ID: wire.NewID(time.Now()), Body: d.Body} // not a job: the queue's worker dead-letters it
			}
			return id, msg
		},
	}
	if d, err := driver.StoreOf(p.backend); err == nil {
		cfg.Store = kv.Of(d, kv.Flow)
	} else {
		cfg.NoStore = err
	}
	for name := range p.cfg.Queues {
		cfg.Queues = append(cfg.Queues, name)
	}
	for name, lv := range p.cfg.levels {
		cfg.Levels[name] = lv.base
	}
	return pause.New(cfg)
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
	if p == nil || p.pz == nil {
		return ErrNotNew
	}
	return p.pz.Pause(ctx, queue)
}

// Resume undoes Pause: within about PausePoll every worker takes the
// queue's jobs again. Resuming a queue that is not paused does nothing.
func (p *Platform) Resume(ctx context.Context, queue string) error {
	if err := validQueue(queue); err != nil {
		return err
	}
	if p == nil || p.pz == nil {
		return ErrNotNew
	}
	return p.pz.Resume(ctx, queue)
}

// PausedQueues returns the names of the paused queues, sorted. A backend
// without a store has none.
func (p *Platform) PausedQueues(ctx context.Context) ([]string, error) {
	if p == nil || p.pz == nil {
		return nil, ErrNotNew
	}
	return p.pz.Queues(ctx)
}
