package flow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// DefaultLease is the lease of a Semaphore's slot when SemaphoreConfig.Lease
// is zero.
const DefaultLease = 30 * time.Second

// MaxSlots is the largest SemaphoreConfig.Slots: a semaphore costs up to one
// store round trip per slot when every slot is held.
const MaxSlots = 1000

// ErrSlotLost is matched by the error of Slot.Renew and Slot.Release when
// the slot is no longer the caller's: its lease lapsed (and another holder
// may have taken it), or it was released already (Renew only).
var ErrSlotLost = errors.New("flow: slot lost")

// SemaphoreConfig configures a Semaphore.
type SemaphoreConfig struct {
	// Prefix is the store key the slots live under: slot i is the key
	// Prefix/i. Every process sharing the limit uses the same Prefix and
	// Slots. Required: defaults to "", which NewSemaphore rejects.
	Prefix string

	// Slots is how many holders the semaphore admits at once, from 1 to
	// MaxSlots. Required: defaults to 0, which NewSemaphore rejects.
	Slots int

	// Lease is how long a slot stays held after it was taken or last
	// renewed: the TTL of its key, rounded up to whole milliseconds. A
	// holder renews well within it (every Lease/3, say); a crashed holder's
	// slot is free again once it lapses. Defaults to DefaultLease (30s).
	Lease time.Duration

	// Logger receives the warning of a slot key found without expiry
	// (and taken over). Defaults to slog.Default().
	Logger *slog.Logger
}

func (c SemaphoreConfig) withDefaults() SemaphoreConfig {
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c SemaphoreConfig) validate() error {
	if c.Slots < 1 || c.Slots > MaxSlots {
		return fmt.Errorf("flow: semaphore %q: Slots is %d, want 1 to %d", c.Prefix, c.Slots, MaxSlots)
	}
	if err := driver.CheckKey(c.Prefix); err != nil {
		return fmt.Errorf("flow: semaphore: Prefix: %w", err)
	}
	if err := driver.CheckKey(slotKey(c.Prefix, c.Slots-1)); err != nil {
		return fmt.Errorf("flow: semaphore: Prefix too long for %d slots: %w", c.Slots, err)
	}
	if c.Lease <= 0 || driver.CheckTTL(c.Lease) != nil {
		return fmt.Errorf("flow: semaphore %q: Lease %v: want %v to %v", c.Prefix, c.Lease, driver.MinTTL, driver.MaxTTL)
	}
	return nil
}

// Semaphore is a counting semaphore shared by every process that uses the
// same store and configuration: at most Slots holders at once, cluster-wide.
// Slot i is the store key Prefix/i, created by its holder with the lease as
// its TTL and deleted at its revision on release, so a slot is held exactly
// while its key is present: two holders can never hold one slot, and a
// crashed holder's slot comes back when its lease lapses.
//
// The bound holds for holders that renew in time. A holder that fails to
// renew within its lease (a long pause, a store it cannot reach) loses its
// slot to the next taker, and learns so from Renew (ErrSlotLost); until
// then it may still be working, and the semaphore cannot stop that.
//
// # Slots without expiry
//
// The store is untrusted: a slot key written without a TTL (by a writer to
// the store, not by a Semaphore) would hold its slot for ever. So a
// TryAcquire that finds every slot held reads them all, at most once per
// half lease, and remembers each one's revision and when it first saw
// it: a slot still at a revision seen more than StaleAfter ago has not
// been written for longer than any holder's lease, so its key has no
// expiry. It is taken over (an Update at that revision), with a warning.
// Processes sharing a limit must renew within StaleAfter: their leases
// must be at most six times this one's.
//
// A Semaphore is safe for concurrent use; one per limit per process is
// enough.
type Semaphore struct {
	kv  KV
	cfg SemaphoreConfig

	mu    sync.Mutex
	swept time.Time        // the last read of every slot
	seen  map[int]seenSlot // what that read found, by slot
}

// seenSlot is a held slot's revision and when it was first seen.
type seenSlot struct {
	rev   string
	since time.Time
}

// StaleAfter is how long a slot key may keep one revision before a
// Semaphore takes it for a key without expiry: two of its leases (its
// holder renews every third of its own lease).
func (s *Semaphore) StaleAfter() time.Duration { return 2 * s.cfg.Lease }

// NewSemaphore returns the semaphore cfg describes over kv. It writes
// nothing: the store holds only the keys of held slots.
func NewSemaphore(kv KV, cfg SemaphoreConfig) (*Semaphore, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if kv == nil {
		return nil, fmt.Errorf("flow: semaphore %q: the KV is nil", cfg.Prefix)
	}
	cfg.Lease = ceilMillis(cfg.Lease)
	return &Semaphore{kv: kv, cfg: cfg, seen: map[int]seenSlot{}}, nil
}

// Slots returns how many holders the semaphore admits at once.
func (s *Semaphore) Slots() int { return s.cfg.Slots }

// Lease returns the lease of a slot, rounded up to whole milliseconds.
func (s *Semaphore) Lease() time.Duration { return s.cfg.Lease }

// TryAcquire takes a free slot for holder (a name for the logs and for
// Held; the store keeps it as the slot's value) and returns it with true,
// or returns false when every slot is held. It never waits for a slot.
//
// It tries the slots one Create each, starting at a random one so that
// concurrent callers spread over the slots: one store round trip when the
// first slot tried is free, Slots round trips to learn that all are held
// (and, at most once per half lease, Slots more to read them: see Slots
// without expiry). An error other than a held slot ends the attempt and is
// returned.
func (s *Semaphore) TryAcquire(ctx context.Context, holder string) (*Slot, bool, error) {
	value := []byte(holder)
	if err := driver.CheckValue(value); err != nil {
		return nil, false, fmt.Errorf("flow: semaphore %q: holder: %w", s.cfg.Prefix, err)
	}
	n := s.cfg.Slots
	start := rand.IntN(n)
	for j := range n {
		i := (start + j) % n
		key := slotKey(s.cfg.Prefix, i)
		t0 := time.Now()
		rev, err := s.kv.Create(ctx, key, value, s.cfg.Lease)
		switch {
		case err == nil:
			return &Slot{sem: s, index: i, key: key, holder: holder, rev: rev, deadline: t0.Add(s.cfg.Lease)}, true, nil
		case errors.Is(err, driver.ErrKeyExists):
			continue
		default:
			return nil, false, fmt.Errorf("flow: semaphore %q: acquire slot %d: %w", s.cfg.Prefix, i, err)
		}
	}
	return s.sweep(ctx, holder)
}

// sweep reads every slot, at most once per half lease, and takes over one
// whose key has kept a revision for longer than StaleAfter (see Slots
// without expiry). It returns that slot, or false.
func (s *Semaphore) sweep(ctx context.Context, holder string) (*Slot, bool, error) {
	now := time.Now()
	s.mu.Lock()
	due := now.Sub(s.swept) >= s.cfg.Lease/2
	if due {
		s.swept = now
	}
	s.mu.Unlock()
	if !due {
		return nil, false, nil
	}
	for i := range s.cfg.Slots {
		key := slotKey(s.cfg.Prefix, i)
		_, rev, err := s.kv.Get(ctx, key)
		switch {
		case errors.Is(err, driver.ErrKeyNotFound):
			s.forget(i)
			continue
		case err != nil:
			return nil, false, fmt.Errorf("flow: semaphore %q: read slot %d: %w", s.cfg.Prefix, i, err)
		}
		if !s.stale(i, rev, now) {
			continue
		}
		t0 := time.Now()
		nrev, err := s.kv.Update(ctx, key, []byte(holder), rev, s.cfg.Lease)
		switch {
		case err == nil:
			s.forget(i)
			s.cfg.Logger.Warn("asyncplatform: a cluster concurrency slot kept one revision for longer than any lease (a key without expiry, written by no process); it is taken over",
				"key", key, "unchanged_for", s.StaleAfter().String())
			return &Slot{sem: s, index: i, key: key, holder: holder, rev: nrev, deadline: t0.Add(s.cfg.Lease)}, true, nil
		case errors.Is(err, driver.ErrRevision):
			s.forget(i) // written since: alive
		default:
			return nil, false, fmt.Errorf("flow: semaphore %q: take over slot %d: %w", s.cfg.Prefix, i, err)
		}
	}
	return nil, false, nil
}

// stale records slot i's revision as read at now and reports whether the
// slot has kept it for longer than StaleAfter.
func (s *Semaphore) stale(i int, rev string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.seen[i]
	if !ok || old.rev != rev {
		s.seen[i] = seenSlot{rev: rev, since: now}
		return false
	}
	return now.Sub(old.since) > s.StaleAfter()
}

func (s *Semaphore) forget(i int) {
	s.mu.Lock()
	delete(s.seen, i)
	s.mu.Unlock()
}

// Held returns how many slots are held now, one store round trip per slot.
// The slots are read one after another, not at one instant: the figure is
// for display, never for a decision.
func (s *Semaphore) Held(ctx context.Context) (int, error) {
	held := 0
	for i := range s.cfg.Slots {
		_, _, err := s.kv.Get(ctx, slotKey(s.cfg.Prefix, i))
		switch {
		case err == nil:
			held++
		case errors.Is(err, driver.ErrKeyNotFound):
		default:
			return 0, fmt.Errorf("flow: semaphore %q: read slot %d: %w", s.cfg.Prefix, i, err)
		}
	}
	return held, nil
}

func slotKey(prefix string, i int) string { return prefix + "/" + strconv.Itoa(i) }

// Slot is one held slot of a Semaphore. Its holder renews it while it works
// (Renew) and releases it when done (Release). A Slot is safe for
// concurrent use: a renewing goroutine and a releasing one may share it.
type Slot struct {
	sem    *Semaphore
	index  int
	key    string
	holder string

	mu       sync.Mutex
	rev      string    // the slot key's revision as we last wrote it
	deadline time.Time // our lease ends no earlier than this
	done     bool      // released, or found lost
}

// Index returns the slot's number, from 0 to Slots-1.
func (sl *Slot) Index() int { return sl.index }

// Key returns the store key of the slot.
func (sl *Slot) Key() string { return sl.key }

// Holder returns the holder the slot was taken for.
func (sl *Slot) Holder() string { return sl.holder }

// Deadline returns the time, by this process's clock, before which the
// lease cannot have lapsed: the start of the last successful Renew (or of
// the Create that took the slot) plus the lease.
func (sl *Slot) Deadline() time.Time {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return sl.deadline
}

// Renew extends the slot's lease to a full lease from now: an Update of its
// key at the revision this Slot last wrote, so a slot that lapsed and was
// taken by another holder is never taken back. When the slot is no longer
// this holder's (lapsed, taken, released) the error matches ErrSlotLost,
// and the holder should stop what the slot was guarding as soon as it can.
//
// Any other error (the store unreachable) leaves the outcome unknown: the
// lease runs on, and Renew may be called again; should the lost call have
// renewed the key after all, the next Renew reports ErrSlotLost (the key
// has a revision this Slot never saw) and the key lapses with its lease.
func (sl *Slot) Renew(ctx context.Context) error {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.done {
		return fmt.Errorf("flow: renew %s: %w (released or lost before)", sl.key, ErrSlotLost)
	}
	s := sl.sem
	t0 := time.Now()
	rev, err := s.kv.Update(ctx, sl.key, []byte(sl.holder), sl.rev, s.cfg.Lease)
	switch {
	case err == nil:
		sl.rev, sl.deadline = rev, t0.Add(s.cfg.Lease)
		return nil
	case errors.Is(err, driver.ErrRevision):
		sl.done = true
		return fmt.Errorf("flow: renew %s: %w: %w", sl.key, ErrSlotLost, err)
	default:
		return fmt.Errorf("flow: renew %s: %w", sl.key, err)
	}
}

// Release gives the slot back: a Delete of its key at the revision this
// Slot last wrote, so a slot that lapsed and was taken by another holder is
// left to that holder; the error then matches ErrSlotLost, and nothing was
// deleted. Releasing a slot that was released already, or that Renew found
// lost, does nothing and returns nil.
//
// Any other error (the store unreachable) leaves the slot held until its
// lease lapses, unless Release is called again and succeeds.
func (sl *Slot) Release(ctx context.Context) error {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.done {
		return nil
	}
	err := sl.sem.kv.Delete(ctx, sl.key, sl.rev)
	switch {
	case err == nil:
		sl.done = true
		return nil
	case errors.Is(err, driver.ErrRevision):
		sl.done = true
		return fmt.Errorf("flow: release %s: %w: %w", sl.key, ErrSlotLost, err)
	default:
		return fmt.Errorf("flow: release %s: %w", sl.key, err)
	}
}
