package flow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// DefaultMaxAttempts is RateConfig.MaxAttempts when it is zero.
const DefaultMaxAttempts = 16

// MaxHorizon bounds the horizon of Rate.Reserve: no process reserves an
// event due more than MaxHorizon after its now.
const MaxHorizon = time.Minute

// KeepState is the shortest TTL a Rate gives its key: a limit in use keeps
// its key from one write to the next, each one an Update at the revision
// the Rate knows (one round trip), instead of a Create over a key that
// lapsed between two batches (which a store may take several round trips
// to tell from a live one). A state whose TAT has passed admits what an
// absent key does, so the longer TTL changes no decision.
const KeepState = time.Second

// MaxClockSkew is how far apart the clocks of the processes sharing a Rate
// may be for the Rate to tell a state written by one of them from a
// corrupt one: a theoretical arrival time more than MaxHorizon, the burst's
// span, an interval and MaxClockSkew after now was written by no Rate.
const MaxClockSkew = time.Minute

// ErrContention is matched by a *ContentionError.
var ErrContention = errors.New("flow: rate limit contended")

// ContentionError is the error of Rate.Take when every one of its writes
// lost a race to another process's: more contention than MaxAttempts
// allows. Nothing was consumed; the caller may try again.
type ContentionError struct {
	Key      string // the rate limit's key
	Attempts int    // the writes Take tried
}

func (e *ContentionError) Error() string {
	return fmt.Sprintf("flow: rate %q: %d writes lost to other processes' in one Take", e.Key, e.Attempts)
}

// Is reports whether target is ErrContention.
func (e *ContentionError) Is(target error) bool { return target == ErrContention }

// RateConfig configures a Rate: Events per Period, with bursts of up to
// Burst events.
type RateConfig struct {
	// Key is the store key that holds the limit's state. Every process
	// sharing the limit uses the same Key and the same rate. Required:
	// defaults to "", which NewRate rejects.
	Key string

	// Events is how many events the limit admits per Period, on average: a
	// positive number, fractional allowed (0.5 per second is one every two
	// seconds). Required: defaults to 0, which NewRate rejects.
	Events float64

	// Period is the span Events are counted over. Defaults to time.Second.
	Period time.Duration

	// Burst is how many events the limit admits at once after an idle
	// spell: at least 1 (1: events are spaced evenly, one per
	// Period/Events). Defaults to 1.
	Burst int

	// MaxAttempts bounds the writes of one Take: each one lost to another
	// process's costs a read and another try, and a Take whose every write
	// lost returns a *ContentionError. Defaults to DefaultMaxAttempts (16).
	MaxAttempts int

	// Logger receives the warning of a corrupt state found in the store
	// (and replaced). Defaults to slog.Default().
	Logger *slog.Logger
}

func (c RateConfig) withDefaults() RateConfig {
	if c.Period == 0 {
		c.Period = time.Second
	}
	if c.Burst == 0 {
		c.Burst = 1
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c RateConfig) validate() error {
	if err := driver.CheckKey(c.Key); err != nil {
		return fmt.Errorf("flow: rate: Key: %w", err)
	}
	switch {
	case !(c.Events > 0) || math.IsInf(c.Events, 0):
		return fmt.Errorf("flow: rate %q: Events is %v, want a positive number", c.Key, c.Events)
	case c.Period < 0:
		return fmt.Errorf("flow: rate %q: Period is %v, want a positive duration", c.Key, c.Period)
	case c.Burst < 1:
		return fmt.Errorf("flow: rate %q: Burst is %d, want at least 1", c.Key, c.Burst)
	case c.MaxAttempts < 1:
		return fmt.Errorf("flow: rate %q: MaxAttempts is %d, want at least 1", c.Key, c.MaxAttempts)
	}
	iv := float64(c.Period) / c.Events
	if iv < 1 || iv*float64(c.Burst) > float64(driver.MaxTTL) {
		return fmt.Errorf("flow: rate %q: %v per %v with a burst of %d: want an interval of 1ns or more, and Burst intervals within %v",
			c.Key, c.Events, c.Period, c.Burst, driver.MaxTTL)
	}
	return nil
}

// Rate is a rate limit shared by every process that uses the same store and
// configuration: Events per Period on average, Burst at once, cluster-wide.
//
// It is the generic cell rate algorithm (GCRA) over one store key, which
// holds the theoretical arrival time (TAT): when the next event would be due
// if events came exactly one interval (Period/Events) apart. An event at
// time now is admitted when now ≥ TAT − (Burst−1)·interval, and moves the TAT
// to max(TAT, now) + interval; otherwise it must wait for the difference.
// The TAT is written with Create (no key) or Update at the revision read
// (compare-and-swap), so of processes racing for the last token exactly one
// gets it. The key's TTL is the time until its TAT (at most Burst
// intervals, plus a horizon), and at least KeepState; after it an absent
// key and the stored one mean the same: an idle limit leaves nothing in
// the store.
//
// # Clocks
//
// Take judges by the now its caller gives (time.Now() in production), not
// the store's clock: the processes sharing a limit must have clocks that
// agree to well within an interval. A process whose clock runs δ ahead of
// the others' may take up to about δ/interval events early; one δ behind
// waits δ longer than it needs to. The same goes for a now read long
// before the Take (a goroutine paused between the two): read it just
// before. The store's clock only times the key's
// TTL, a span from the write, so its offset does not matter.
//
// # Cost
//
// A Rate remembers the state it last wrote or read. A Take that finds that
// state current costs one store round trip (the write), also after an idle
// spell shorter than KeepState (the key is still there); one whose state is
// stale (another process wrote since) costs a failed write, a read and a
// write. A Take that its remembered state already refuses costs no round
// trip at all: the TAT only ever grows, so a refusal by an old TAT is a
// refusal by the current one too (its wait may be short: the next Take
// reads afresh).
//
// Processes that Take within a round trip of each other contend: a
// process whose write lost pays a read and another write, and at
// saturation (processes Taking back to back, far beyond the limit's needs)
// one can lose MaxAttempts times in a row to others that write at once
// from a state they know, and get a *ContentionError.
//
// Keep one Rate per limit per process: Takes on one Rate
// run one at a time (they would only contend for the key), and a new Rate
// starts with nothing remembered.
//
// Deleting the key resets the limit; a process that remembers a refusing
// state sees the reset once that state's wait has run out.
//
// # Corrupt state
//
// The key's value is untrusted: a value that is no TAT is read as a TAT of
// zero (an idle limit), and a TAT further ahead than any Rate writes (more
// than MaxHorizon, the burst's span, one interval and MaxClockSkew after
// now) as corrupt: it is logged (Logger) and replaced by this Take's own
// write, as an idle limit's would be. So no wait Take or Reserve returns
// is longer than MaxHorizon plus the burst's span, an interval and
// MaxClockSkew.
type Rate struct {
	kv       KV
	cfg      RateConfig
	interval int64 // ns between events
	tau      int64 // ns of burst tolerance: (Burst-1) intervals

	lock  chan struct{} // held by the Take in progress
	state rateState     // guarded by lock
}

// rateState is what a Rate knows of its key.
type rateState struct {
	rev     string // "": nothing known
	tat     int64  // Unix ns
	expires int64  // Unix ns: the key is taken to be present before this
}

// NewRate returns the rate limit cfg describes over kv. It writes nothing.
func NewRate(kv KV, cfg RateConfig) (*Rate, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if kv == nil {
		return nil, fmt.Errorf("flow: rate %q: the KV is nil", cfg.Key)
	}
	iv := int64(math.Round(float64(cfg.Period) / cfg.Events))
	return &Rate{
		kv:       kv,
		cfg:      cfg,
		interval: iv,
		tau:      iv * int64(cfg.Burst-1),
		lock:     make(chan struct{}, 1),
	}, nil
}

// Interval returns the time between two events at the limit's steady rate.
func (r *Rate) Interval() time.Duration { return time.Duration(r.interval) }

// Burst returns how many events the limit admits at once.
func (r *Rate) Burst() int { return r.cfg.Burst }

// Key returns the store key of the limit.
func (r *Rate) Key() string { return r.cfg.Key }

// Take asks for one event at time now (the caller's clock; see Clocks in
// the type's documentation; the zero time means time.Now()). It returns
// wait == 0 when the event is admitted: one token is consumed. It returns
// wait > 0 when it is not: nothing is consumed, and no event will be
// admitted before wait has passed (one may not be then either, when other
// processes took the tokens meanwhile).
//
// Its error is the store's, wrapped (the event was then not admitted; if a
// write's outcome is unknown, a token may have been consumed for nothing),
// ctx.Err() when ctx ends while another Take holds the Rate, or a
// *ContentionError.
func (r *Rate) Take(ctx context.Context, now time.Time) (wait time.Duration, err error) {
	_, wait, err = r.Reserve(ctx, now, 1, 0)
	return wait, err
}

// Grant is the events one Reserve admitted: Count of them, the i-th (from
// 0) due at At(i), one interval after the one before. An event may happen at
// its time or later, never earlier.
type Grant struct {
	Count    int       // events admitted; 0: none
	First    time.Time // the first event's time (the past: at once)
	Interval time.Duration
}

// At returns the time of the grant's i-th event (from 0).
func (g Grant) At(i int) time.Time { return g.First.Add(time.Duration(i) * g.Interval) }

// Reserve asks for up to n events in one write, each due within horizon
// (at most MaxHorizon) of now: the events are due one interval apart from
// the first (Grant.At), some perhaps at once (what the burst has left), the
// rest later. So a process that starts many events pays one store round
// trip per batch, not per event, and processes asking at once do not
// contend for every single event. It returns a Grant of the n events, or
// of as many as are due within the horizon, or, when the first would be
// due after now+horizon, an empty Grant and how long until it is due. Take
// is Reserve of one event with no horizon.
//
// Events reserved are the process's: those it does not use are lost to
// every process (the limit then admits fewer than its rate), so ask for
// about as many as will be used. Its errors are Take's.
func (r *Rate) Reserve(ctx context.Context, now time.Time, n int, horizon time.Duration) (Grant, time.Duration, error) {
	if now.IsZero() {
		now = time.Now()
	}
	n = max(n, 1)
	horizon = min(max(horizon, 0), MaxHorizon)
	select {
	case r.lock <- struct{}{}:
	case <-ctx.Done():
		return Grant{}, 0, ctx.Err()
	}
	defer func() { <-r.lock }()

	t := now.UnixNano()
	st := r.state
	fresh := false // st was read from the store in this Reserve
	for attempts := 0; attempts < r.cfg.MaxAttempts; {
		present := st.rev != "" && (fresh || t < st.expires)
		tat := t
		if present && st.tat > t {
			tat = st.tat
		}
		if present && tat-t > r.reach() {
			r.cfg.Logger.Warn("asyncplatform: a rate limit's state in the store is further ahead than any process writes it; it is corrupt and is replaced",
				"key", r.cfg.Key, "tat", time.Unix(0, st.tat).UTC())
			tat = t
		}
		first := tat - r.tau // the first event's time
		if first > t+int64(horizon) {
			r.state = st
			return Grant{}, time.Duration(first - t), nil
		}
		// The events due within the horizon, n at most.
		k := min(int64(n), (t+int64(horizon)-first)/r.interval+1)
		newTAT := tat + k*r.interval
		// The TTL runs from the write, so it is reckoned from the real
		// clock when the caller's now is later (a batch timed from when it
		// is expected back): the key must last until its TAT, and at least
		// KeepState, so that the next write finds it where it was left.
		ttl := min(ceilMillis(max(time.Duration(newTAT-min(t, time.Now().UnixNano())), KeepState)), driver.MaxTTL)
		value := []byte(strconv.FormatInt(newTAT, 10))
		var rev string
		var err error
		if present {
			rev, err = r.kv.Update(ctx, r.cfg.Key, value, st.rev, ttl)
		} else {
			rev, err = r.kv.Create(ctx, r.cfg.Key, value, ttl)
		}
		attempts++
		switch {
		case err == nil:
			r.state = rateState{rev: rev, tat: newTAT, expires: t + int64(ttl)}
			return Grant{Count: int(k), First: time.Unix(0, first), Interval: time.Duration(r.interval)}, 0, nil
		case errors.Is(err, driver.ErrRevision), errors.Is(err, driver.ErrKeyExists):
			// Another process wrote first: read what it wrote.
		default:
			r.state = rateState{}
			return Grant{}, 0, fmt.Errorf("flow: rate %q: take: %w", r.cfg.Key, err)
		}
		if st, err = r.read(ctx); err != nil {
			r.state = rateState{}
			return Grant{}, 0, err
		}
		fresh = true
	}
	r.state = rateState{}
	return Grant{}, 0, &ContentionError{Key: r.cfg.Key, Attempts: r.cfg.MaxAttempts}
}

// reach is how far after now a TAT may be and have been written by a Rate:
// the last event of a grant is due within MaxHorizon of its writer's now,
// and the TAT is the burst's span and an interval after it; another
// process's clock may be MaxClockSkew ahead.
func (r *Rate) reach() int64 {
	return int64(MaxHorizon+MaxClockSkew) + r.tau + r.interval
}

// read returns the key's state in the store now: rev "" when it is absent.
// The state is present for the rest of the Take that read it, and is taken
// to be present until its TAT by later ones.
// A value that is no TAT (not written by a Rate) is read as a TAT of zero,
// so the next write replaces it.
func (r *Rate) read(ctx context.Context) (rateState, error) {
	v, rev, err := r.kv.Get(ctx, r.cfg.Key)
	switch {
	case errors.Is(err, driver.ErrKeyNotFound):
		return rateState{}, nil
	case err != nil:
		return rateState{}, fmt.Errorf("flow: rate %q: read: %w", r.cfg.Key, err)
	}
	tat, _ := strconv.ParseInt(string(v), 10, 64)
	// Its writer gave it a TTL reaching at least to its TAT.
	return rateState{rev: rev, tat: tat, expires: tat}, nil
}
