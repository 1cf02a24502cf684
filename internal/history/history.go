// Package history keeps the throughput history in the backend's store: how
// many attempts ended per minute, by queue and job type, for Retention.
//
// A worker counts its attempts in memory (Add: a map increment under a
// mutex, no I/O) and merges the counts into the store's buckets at every
// Flush, one compare-and-swap per minute bucket whatever the number of
// jobs. The store holds one key per minute ("m/" and the minute's Unix
// number, so keys sort by time), each living Retention after its last
// write, so at most Buckets of them exist; a bucket holds at most
// MaxSeries queue and type pairs, the rest counted under Other.
//
// Buckets are read as untrusted input: a read lists at most Buckets+1 keys,
// decodes each one into fixed fields, keeps at most MaxSeries+1 series and
// cuts every string to MaxText bytes; escaping is the reader's.
package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// Bounds of the history.
const (
	// Bucket is the span of one bucket.
	Bucket = time.Minute
	// Retention is how long a bucket is kept after its last write.
	Retention = 24 * time.Hour
	// Buckets is the most buckets kept: Retention of minutes.
	Buckets = int(Retention / Bucket)
	// MaxSeries is the most queue and type pairs a bucket keeps (and a
	// worker counts per minute); the rest are counted under Other.
	MaxSeries = 200
	// MaxText bounds the queue and type of a series, in bytes of their
	// JSON encoding: a bucket of MaxSeries+1 series then fits in a store
	// value.
	MaxText = 100
	// Other is the queue and type of the series that counts the pairs
	// past MaxSeries.
	Other = "(other)"
	// MaxCount bounds each count of a series read back: a forged bucket's
	// counts, summed over a day of buckets and series, cannot overflow.
	MaxCount = 1 << 40
)

// Outcome is how an attempt ended, as the history counts it.
type Outcome int

// The outcomes counted.
const (
	Succeeded    Outcome = iota // acknowledged
	Failed                      // failed, to be retried
	DeadLettered                // dead-lettered
)

// Series is the counts of one queue and job type in one bucket.
type Series struct {
	Queue     string `json:"q"`
	Type      string `json:"t"`
	Succeeded int64  `json:"ok,omitempty"`
	Failed    int64  `json:"f,omitempty"`
	Dead      int64  `json:"d,omitempty"`
}

func (s *Series) add(o *Series) {
	s.Succeeded += o.Succeeded
	s.Failed += o.Failed
	s.Dead += o.Dead
}

// Minute is one bucket: its start and its series, by queue then type.
type Minute struct {
	Start  time.Time
	Series []Series
}

// bucket is a bucket as the store keeps it.
type bucket struct {
	Series []Series `json:"s"`
}

// Config configures a Counter.
type Config struct {
	// Store is the namespace the buckets are kept in (kv.History); nil:
	// no store, and NoStore says why.
	Store   *kv.Store
	NoStore error
	Logger  *slog.Logger
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// MaxReadBytes bounds the bucket bytes one Read reads; zero or less:
	// DefaultMaxReadBytes.
	MaxReadBytes int
}

// DefaultMaxReadBytes is the MaxReadBytes of a Config without one: a day
// of buckets of a few dozen series each fits, a day of full buckets
// (Buckets of up to 64 KiB, about 94 MB) does not.
const DefaultMaxReadBytes = 8 << 20

type seriesKey struct {
	minute     int64
	queue, typ string
}

// Counter counts this process's attempts and merges them into the store.
type Counter struct {
	cfg Config

	mu      sync.Mutex
	pending map[seriesKey]*Series
	perMin  map[int64]int // series pending per minute
}

// New returns a Counter.
func New(cfg Config) *Counter {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxReadBytes <= 0 {
		cfg.MaxReadBytes = DefaultMaxReadBytes
	}
	return &Counter{cfg: cfg, pending: map[seriesKey]*Series{}, perMin: map[int64]int{}}
}

// Add counts one attempt of a job of type typ on queue that ended as o.
// It does nothing without a store.
func (c *Counter) Add(queue, typ string, o Outcome) {
	if c == nil || c.cfg.Store == nil {
		return
	}
	m := c.cfg.Now().Unix() / int64(Bucket/time.Second)
	k := seriesKey{m, clip(queue), clip(typ)}
	c.mu.Lock()
	s := c.pending[k]
	if s == nil {
		if c.perMin[m] >= MaxSeries {
			k.queue, k.typ = Other, Other
			s = c.pending[k]
		}
		if s == nil {
			s = &Series{Queue: k.queue, Type: k.typ}
			c.pending[k] = s
			c.perMin[m]++
		}
	}
	switch o {
	case Succeeded:
		s.Succeeded++
	case Failed:
		s.Failed++
	case DeadLettered:
		s.Dead++
	}
	c.mu.Unlock()
}

func key(minute int64) string { return "m/" + fmt.Sprintf("%012d", minute) }

// Flush merges the counts taken since the last Flush into the store's
// buckets. Counts it could not write are kept for the next Flush, as long
// as their bucket is within Retention.
func (c *Counter) Flush(ctx context.Context) error {
	if c == nil || c.cfg.Store == nil {
		return nil
	}
	c.mu.Lock()
	pending := c.pending
	c.pending, c.perMin = map[seriesKey]*Series{}, map[int64]int{}
	c.mu.Unlock()
	byMin := map[int64][]*Series{}
	for k, s := range pending {
		byMin[k.minute] = append(byMin[k.minute], s)
	}
	var errs []error
	for _, m := range slices.Sorted(maps.Keys(byMin)) {
		if err := c.merge(ctx, m, byMin[m]); err != nil {
			errs = append(errs, err)
			if time.Unix(m*int64(Bucket/time.Second), 0).Add(Retention).After(c.cfg.Now()) {
				for _, s := range byMin[m] {
					c.putBack(m, s)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func (c *Counter) putBack(m int64, s *Series) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := seriesKey{m, s.Queue, s.Type}
	if cur := c.pending[k]; cur != nil {
		cur.add(s)
		return
	}
	c.pending[k] = s
	c.perMin[m]++
}

// merge adds the series to the bucket of minute m, by compare-and-swap.
func (c *Counter) merge(ctx context.Context, m int64, add []*Series) error {
	st := c.cfg.Store
	k := key(m)
	return kv.Retry(ctx, func() error {
		v, rev, err := st.Get(ctx, k)
		var b bucket
		switch {
		case errors.Is(err, driver.ErrKeyNotFound):
		case err != nil:
			return err
		default:
			b, _ = decode(v) // a bucket that does not parse is replaced
		}
		b.merge(add)
		nv, err := json.Marshal(b)
		if err == nil && len(nv) > driver.MaxValueLen { // cannot happen with the bounds; never write what the store refuses
			b = bucket{}
			b.merge(add)
			nv, err = json.Marshal(b)
		}
		if err != nil {
			return err
		}
		if rev == "" {
			_, err = st.Create(ctx, k, nv, Retention)
			if errors.Is(err, driver.ErrKeyExists) {
				return kv.ErrRetry
			}
			return err
		}
		_, err = st.Update(ctx, k, nv, rev, Retention)
		if errors.Is(err, driver.ErrRevision) {
			return kv.ErrRetry
		}
		return err
	})
}

// merge adds series to b, keeping at most MaxSeries pairs and Other.
func (b *bucket) merge(add []*Series) {
	idx := make(map[[2]string]int, len(b.Series))
	for i, s := range b.Series {
		idx[[2]string{s.Queue, s.Type}] = i
	}
	for _, s := range add {
		k := [2]string{s.Queue, s.Type}
		i, ok := idx[k]
		if !ok && len(b.Series) >= MaxSeries {
			k = [2]string{Other, Other}
			i, ok = idx[k]
		}
		if !ok {
			b.Series = append(b.Series, Series{Queue: k[0], Type: k[1]})
			i = len(b.Series) - 1
			idx[k] = i
		}
		b.Series[i].add(s)
	}
	slices.SortFunc(b.Series, func(x, y Series) int {
		return strings.Compare(x.Queue+"\x00"+x.Type, y.Queue+"\x00"+y.Type)
	})
}

// decode parses a bucket and cuts it to the bounds: at most MaxSeries+1
// series, strings of at most MaxText bytes, counts within [0, MaxCount].
func decode(v []byte) (bucket, bool) {
	var b bucket
	if len(v) > driver.MaxValueLen || json.Unmarshal(v, &b) != nil {
		return bucket{}, false
	}
	if len(b.Series) > MaxSeries+1 {
		b.Series = b.Series[:MaxSeries+1]
	}
	for i := range b.Series {
		s := &b.Series[i]
		s.Queue, s.Type = clip(s.Queue), clip(s.Type)
		s.Succeeded, s.Failed, s.Dead = bound(s.Succeeded), bound(s.Failed), bound(s.Dead)
	}
	return b, true
}

// bound clamps a count read back to [0, MaxCount].
func bound(n int64) int64 { return min(max(n, 0), MaxCount) }

// clip cuts s so that its JSON encoding (quotes aside) takes at most
// MaxText bytes, on a rune boundary: a character that JSON escapes takes
// up to six, so a bucket of MaxSeries+1 series fits in a store value
// whatever the names.
func clip(s string) string {
	n := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		w := size
		switch {
		case r == utf8.RuneError && size == 1, r < 0x20, r == '<', r == '>', r == '&', r == '\u2028', r == '\u2029':
			w = 6 // \ufffd, \u00XX
		case r == '"', r == '\\':
			w = 2
		}
		if n+w > MaxText {
			return strings.ToValidUTF8(s[:i], "") + "…"
		}
		n += w
		i += size
	}
	return s
}

// Run flushes every interval until ctx ends, then once more (with a
// context of its own, bounded by 5 s), so a stopping process writes what
// it counted.
func (c *Counter) Run(ctx context.Context, interval time.Duration) {
	if c == nil || c.cfg.Store == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.Flush(fctx); err != nil {
				c.cfg.Logger.Warn("asyncplatform: writing the throughput history failed; the last counts are lost", "error", err)
			}
			return
		case <-t.C:
			if err := c.Flush(ctx); err != nil && ctx.Err() == nil {
				c.cfg.Logger.Warn("asyncplatform: writing the throughput history failed; trying again at the next flush", "error", err)
			}
		}
	}
}

// Read is what a read of the history found.
type Read struct {
	// Minutes are the buckets since the start asked, oldest first; a
	// minute with no attempts has no bucket.
	Minutes []Minute
	// Unreadable is how many buckets did not parse (skipped).
	Unreadable int
	// Cut says that the read stopped at Config.MaxReadBytes: the buckets
	// from since to the first of Minutes were not read.
	Cut bool
}

// Read returns the buckets from the one holding since to now (and the
// next minute's, written by a clock ahead), at most Buckets of them. It reads the newest first and stops once the buckets
// read hold Config.MaxReadBytes, so it reads at most that plus one
// bucket's driver.MaxValueLen.
func (c *Counter) Read(ctx context.Context, since time.Time) (Read, error) {
	st := c.cfg.Store
	if st == nil {
		if c.cfg.NoStore != nil {
			return Read{}, c.cfg.NoStore
		}
		return Read{}, driver.ErrNoStore
	}
	from := since.Unix() / int64(Bucket/time.Second)
	after := key(from - 1)
	// A bucket after the next minute is no worker's (a clock a minute
	// ahead writes the next): it is not read, so that forged buckets from
	// the future cannot take the read's byte budget.
	last := key(c.cfg.Now().Unix()/int64(Bucket/time.Second) + 1)
	var keys []string
list:
	for len(keys) < Buckets+1 {
		ks, next, err := st.List(ctx, "m/", after, kv.MaxListLimit)
		if err != nil {
			return Read{}, fmt.Errorf("reading the history: %w", err)
		}
		for _, k := range ks {
			if k > last {
				break list
			}
			keys = append(keys, k)
		}
		if next == "" {
			break
		}
		after = next
	}
	keys = keys[:min(len(keys), Buckets+1)]
	var out Read
	read, end := 0, len(keys)
	for end > 0 && read < c.cfg.MaxReadBytes {
		n := min(driver.MaxBatch, end, max(1, (c.cfg.MaxReadBytes-read+driver.MaxValueLen-1)/driver.MaxValueLen))
		part := keys[end-n : end]
		rs, err := st.GetEach(ctx, part)
		if err != nil {
			return Read{}, fmt.Errorf("reading the history: %w", err)
		}
		var mins []Minute
		for j, r := range rs {
			if r.Err != nil {
				continue
			}
			read += len(r.Value)
			m, err := strconv.ParseInt(strings.TrimPrefix(part[j], "m/"), 10, 64)
			b, ok := decode(r.Value)
			if err != nil || !ok {
				out.Unreadable++
				continue
			}
			mins = append(mins, Minute{Start: time.Unix(m*int64(Bucket/time.Second), 0).UTC(), Series: b.Series})
		}
		out.Minutes = append(mins, out.Minutes...)
		end -= n
	}
	out.Cut = end > 0
	return out, nil
}
