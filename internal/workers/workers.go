// Package workers keeps the registry of running platforms in the backend's
// store: each running platform writes a record of itself (host, pid,
// queues, concurrency, running jobs, start, version) at every heartbeat,
// under a key of its own that expires a few heartbeats after the last
// write, so a process that dies without a word ages out.
//
// Records are read as untrusted input: any process that reaches the store
// can write one. A listing reads a bounded number of records, decodes each
// one (at most driver.MaxValueLen bytes) into fixed fields, and cuts every
// string and list to a bound; escaping is the reader's (the dashboard and
// asyncctl escape what they print).
package workers

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// Bounds of the registry.
const (
	// Expiry is how many heartbeats a record outlives its last write by.
	Expiry = 3
	// MaxListed is the most records a listing reads; past it the listing
	// says it is partial.
	MaxListed = 1000
	// MaxText bounds each string field of a record read, in bytes.
	MaxText = 200
	// MaxQueues bounds the queues of a record read.
	MaxQueues = 100
)

// Info is one running platform, as its record says.
type Info struct {
	ID          string    `json:"id"` // random, made at start: the record's key
	Name        string    `json:"name"`
	Host        string    `json:"host"`
	PID         int       `json:"pid"`
	Queues      []string  `json:"queues"`
	Concurrency int       `json:"concurrency"`
	Running     int       `json:"running"`
	StartedAt   time.Time `json:"started_at"`
	BeatAt      time.Time `json:"beat_at"`
	Version     string    `json:"version"`
	// Interval is the writer's heartbeat: the record expires Expiry of
	// them after BeatAt.
	Interval time.Duration `json:"interval"`
}

// Config configures a Registry.
type Config struct {
	// Store is the namespace the records are kept in (kv.Workers); nil:
	// no store, and NoStore says why.
	Store   *kv.Store
	NoStore error
	// Interval is the heartbeat. Must be positive.
	Interval time.Duration
	// Self returns this process's record at each beat (ID, BeatAt and
	// Interval are set by the Registry).
	Self   func() Info
	Logger *slog.Logger
	// Now is the clock; nil: time.Now.
	Now func() time.Time
}

// Registry writes this process's record and lists everyone's.
type Registry struct {
	cfg Config
	id  string
}

// New returns a Registry with a random ID of its own.
func New(cfg Config) *Registry {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Registry{cfg: cfg, id: "w-" + strings.ToLower(rand.Text())}
}

// ID is the key of this process's record.
func (r *Registry) ID() string { return r.id }

func (r *Registry) store() (*kv.Store, error) {
	if r.cfg.Store == nil {
		if r.cfg.NoStore != nil {
			return nil, r.cfg.NoStore
		}
		return nil, driver.ErrNoStore
	}
	return r.cfg.Store, nil
}

func (r *Registry) ttl() time.Duration { return Expiry * r.cfg.Interval }

// Beat writes this process's record, whatever the key holds, with a TTL of
// Expiry heartbeats.
func (r *Registry) Beat(ctx context.Context) error {
	s, err := r.store()
	if err != nil {
		return err
	}
	at := r.cfg.Now().UTC() // before Self: the record holds what was held at BeatAt or later
	in := r.cfg.Self()
	in.ID, in.BeatAt, in.Interval = r.id, at, r.cfg.Interval
	v, err := json.Marshal(in)
	if err != nil {
		return err
	}
	if len(v) > driver.MaxValueLen { // a process with very many queues: keep the rest
		in.Queues = in.Queues[:min(len(in.Queues), MaxQueues)]
		if v, err = json.Marshal(in); err != nil {
			return err
		}
	}
	return kv.Retry(ctx, func() error {
		_, rev, err := s.Get(ctx, r.id)
		switch {
		case errors.Is(err, driver.ErrKeyNotFound):
			_, err = s.Create(ctx, r.id, v, r.ttl())
			if errors.Is(err, driver.ErrKeyExists) {
				return kv.ErrRetry
			}
		case err == nil:
			_, err = s.Update(ctx, r.id, v, rev, r.ttl())
			if errors.Is(err, driver.ErrRevision) {
				return kv.ErrRetry
			}
		}
		return err
	})
}

// Run beats at once, then every Interval until ctx ends, and then deletes
// the record (a stopped process leaves the list at once). A failed beat is
// logged; the next one tries again.
func (r *Registry) Run(ctx context.Context) {
	if _, err := r.store(); err != nil {
		return
	}
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if err := r.Beat(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("asyncplatform: writing this worker's heartbeat failed", "error", err)
		}
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := r.cfg.Store.Delete(dctx, r.id, ""); err != nil {
				r.cfg.Logger.Warn("asyncplatform: removing this worker's record failed; it ages out", "error", err)
			}
			return
		case <-t.C:
		}
	}
}

// List is the records read by a listing.
type List struct {
	Workers []Info
	// Unreadable is how many records did not parse (skipped); Partial:
	// there were more than MaxListed records, the rest were not read.
	Unreadable int
	Partial    bool
}

// List reads the records of the running platforms, in key order, at most
// MaxListed. A record whose heartbeat is older than Expiry of its own
// intervals (or than Expiry of this registry's, when it gives none) is
// left out even when the store has not expired it yet. A forged interval
// keeps a record no longer than the TTL its writer gave it.
func (r *Registry) List(ctx context.Context) (List, error) {
	s, err := r.store()
	if err != nil {
		return List{}, err
	}
	var keys []string
	err = s.ListAll(ctx, "", func(k string) (bool, error) {
		if len(keys) == MaxListed {
			return false, nil
		}
		keys = append(keys, k)
		return true, nil
	})
	if err != nil {
		return List{}, fmt.Errorf("listing workers: %w", err)
	}
	var out List
	if len(keys) == MaxListed {
		more, _, err := s.List(ctx, "", keys[len(keys)-1], 1)
		out.Partial = err == nil && len(more) > 0
	}
	now := r.cfg.Now()
	for i := 0; i < len(keys); i += driver.MaxBatch {
		rs, err := s.GetEach(ctx, keys[i:min(i+driver.MaxBatch, len(keys))])
		if err != nil {
			return List{}, fmt.Errorf("reading workers: %w", err)
		}
		for j, res := range rs {
			if res.Err != nil {
				continue // expired since the listing
			}
			in, ok := decode(res.Value)
			if !ok {
				out.Unreadable++
				continue
			}
			in.ID = clip(keys[i+j])
			iv := in.Interval // the writer's: workers may beat at different rates
			if iv <= 0 {
				iv = r.cfg.Interval
			}
			if now.Sub(in.BeatAt) > Expiry*iv {
				continue
			}
			out.Workers = append(out.Workers, in)
		}
	}
	return out, nil
}

// decode parses a record and cuts it to the bounds.
func decode(v []byte) (Info, bool) {
	var in Info
	if len(v) > driver.MaxValueLen || json.Unmarshal(v, &in) != nil {
		return Info{}, false
	}
	in.Name, in.Host, in.Version = clip(in.Name), clip(in.Host), clip(in.Version)
	if len(in.Queues) > MaxQueues {
		in.Queues = in.Queues[:MaxQueues]
	}
	for i, q := range in.Queues {
		in.Queues[i] = clip(q)
	}
	in.PID = max(in.PID, 0)
	in.Concurrency = max(in.Concurrency, 0)
	in.Running = max(in.Running, 0)
	return in, true
}

// clip cuts s to MaxText bytes, on a rune boundary.
func clip(s string) string {
	if len(s) <= MaxText {
		return s
	}
	return strings.ToValidUTF8(s[:MaxText], "") + "…"
}
