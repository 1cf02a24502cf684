package executor

import (
	"context"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// isolate makes f's job, a suspect, the only delivery this platform holds:
// it closes the gate (no queue takes jobs), hands back uncounted the
// deliveries claimed ahead (the platform's and those a backend buffered:
// driver.Releaser), and waits for the running handlers to finish and
// settle. If the suspect then kills the process, the crash is charged to it
// alone. Only one suspect is isolated at a time: another is handed back and
// comes again. It returns false when f was handed back instead (another
// suspect is running alone, or the platform is stopping); on false, and on
// a panic, the isolation is undone here.
func (x *Executor[V]) isolate(f *Delivery[V]) (ok bool) {
	if !x.suspect.TryLock() {
		x.HandBack(f)
		return false
	}
	x.cfg.Health.Hold()
	defer func() {
		if !ok {
			x.endIsolation()
		}
	}()
	j := f.Job.Job
	since, warned := time.Now(), false
	// The backend releases its buffer first, once no Receive runs (the
	// gate keeps new ones from starting), and the claimed-ahead jobs are
	// handed back after: a hand-back's copy then cannot reach the consumer
	// being released (RabbitMQ delivered it there, and one arriving after
	// the consumer's cancel came back counted when the suspect killed the
	// process: an innocent job charged a crash, TestFaults/PoisonIsolation).
	released := false
	for {
		held, receiving := 0, false
		for _, q := range x.queues {
			h, r := q.Quiet()
			held, receiving = held+h, receiving || r
		}
		if !receiving && !released {
			x.release()
			released = true
		}
		if released {
			for _, q := range x.queues {
				q.HandBackQueued(x.HandBack)
			}
			held = 0
			for _, q := range x.queues {
				h, r := q.Quiet()
				held, receiving = held+h, receiving || r
			}
		}
		if released && held <= 1 && !receiving {
			break
		}
		if x.stopping.Load() {
			x.HandBack(f)
			return false
		}
		if !warned && time.Since(since) > x.cfg.Lease {
			warned = true
			x.cfg.Log.Warn("asyncplatform: a suspect waits for the handlers beside it to finish before it runs alone", "queue", j.Queue, "id", j.ID, "type", j.Type, "held", held-1)
		}
		time.Sleep(time.Millisecond)
	}
	x.cfg.Log.Warn("asyncplatform: running a suspect alone (a worker holding it died)", "queue", j.Queue, "id", j.ID, "type", j.Type, "crashes", j.Crashes)
	return true
}

// release asks the backend, when it buffers (driver.Releaser), to hand
// back what it buffered for every queue.
func (x *Executor[V]) release() {
	r, ok := x.cfg.Backend.(driver.Releaser)
	if !ok {
		return
	}
	for _, q := range x.queues {
		for _, name := range q.Names() {
			if err := r.Release(context.Background(), name); err != nil {
				x.cfg.Log.Warn("asyncplatform: releasing the backend's buffered messages before a suspect runs failed; they come back after their lease", "queue", name, "error", err)
			}
		}
	}
}

func (x *Executor[V]) endIsolation() {
	x.cfg.Health.Release()
	x.suspect.Unlock()
}
