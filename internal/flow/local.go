package flow

import (
	"context"
	"fmt"
)

// Local is a counting limit within one process: at most Limit holders at
// once. It costs no store round trip; combine it with a Semaphore (take the
// Local first, then a Slot) to bound a job type both per process and
// cluster-wide. A Local is safe for concurrent use.
type Local struct {
	held chan struct{} // one element per holder
}

// NewLocal returns a Local that admits limit holders at once; limit is at
// least 1.
func NewLocal(limit int) (*Local, error) {
	if limit < 1 {
		return nil, fmt.Errorf("flow: local limit %d: want at least 1", limit)
	}
	return &Local{held: make(chan struct{}, limit)}, nil
}

// TryAcquire takes a place and returns true, or returns false at once when
// all Limit places are held.
func (l *Local) TryAcquire() bool {
	select {
	case l.held <- struct{}{}:
		return true
	default:
		return false
	}
}

// Acquire takes a place, waiting until one is free or ctx ends (then it
// returns ctx.Err() and holds nothing).
func (l *Local) Acquire(ctx context.Context) error {
	select {
	case l.held <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release gives a place back. It panics when no place is held: a Release
// without its TryAcquire or Acquire is a bug, as unlocking an unlocked
// mutex is.
func (l *Local) Release() {
	select {
	case <-l.held:
	default:
		panic("flow: Local.Release without a held place")
	}
}

// Held returns how many places are held now.
func (l *Local) Held() int { return len(l.held) }

// Limit returns how many holders the Local admits at once.
func (l *Local) Limit() int { return cap(l.held) }
