// Package unique is the engine of unique jobs: a job with a unique key claims
// the key in the platform's store before it is stored, holds it while it
// lives, and gives it up as its release policy says.
//
// A claim is one key of the store (the platform's kv.Unique namespace), named
// by the job's unique key and holding the ID of the job that holds it and a
// random token of the claim, with a TTL: the claim's window, the longest it
// is held whatever became of the job. A job carries its claim (key,
// revision, token, window, release policy) in a header (Claim.Header), so
// that whichever process settles it can release it.
//
// A header comes off the broker, where anyone who can write to it can put
// one: a release deletes the key only when the header's token is the one
// the store holds, and at the claim's revision only (a key taken since by
// another job, its window ended, is left alone). Revisions are guessable
// (sequential on Redis and PostgreSQL); the token is not. A claim written
// before tokens (its header has none, and the store holds the bare job ID)
// is released at its revision as before; a header without a token never
// releases a claim that has one.
package unique

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// Header is the header a unique job carries its claim in (Claim.Header),
// through every retry, hand-back and dead letter.
const Header = "asyncplatform-unique"

// Release says when a claim is given up before its window ends. Its number is
// stored in the header of every unique job (Claim.Header): never renumber one.
type Release uint8

// The release policies.
const (
	OnFinish  Release = iota // on success or dead letter, whichever comes first
	OnSuccess                // on success only
	OnWindow                 // never early: held for the whole window
)

// Claim is a job's hold on its key.
type Claim struct {
	Key     string        // the job's unique key
	Rev     string        // the revision the store gave the claim; empty: no claim
	Token   string        // the claim's random token; empty in a claim made before tokens
	Window  time.Duration // the claim's TTL
	Release Release       // when it is given up early
}

// tokenLen is the length of a token: 16 random bytes, unpadded base64url.
const tokenLen = 22

// newToken returns a random claim token.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// value is what the store holds for a claim: a NUL, the token, the job ID.
// A claim made before tokens holds the bare job ID.
func value(id, token string) []byte { return []byte("\x00" + token + id) }

// parseValue splits a stored claim into its job ID and token (empty for a
// claim made before tokens).
func parseValue(v []byte) (id, token string) {
	if len(v) > tokenLen && v[0] == 0 {
		return string(v[1+tokenLen:]), string(v[1 : 1+tokenLen])
	}
	return string(v), ""
}

// storedToken returns the token of a stored claim, without copying it:
// empty for a claim made before tokens.
func storedToken(v []byte) []byte {
	if len(v) > tokenLen && v[0] == 0 {
		return v[1 : 1+tokenLen]
	}
	return nil
}

// Holder returns the ID of the job a stored claim names.
func Holder(v []byte) string {
	id, _ := parseValue(v)
	return id
}

// Header encodes the claim as a job carries it: a URL query of its fields
// k, p, r, t (when it has a token) and w, in that order, as
// url.Values.Encode writes them.
func (c Claim) Header() string {
	k, r := url.QueryEscape(c.Key), url.QueryEscape(c.Rev)
	w, p := strconv.FormatInt(c.Window.Milliseconds(), 10), strconv.Itoa(int(c.Release))
	var b strings.Builder
	b.Grow(len("k=&p=&r=&t=&w=") + len(k) + len(p) + len(r) + len(c.Token) + len(w))
	b.WriteString("k=")
	b.WriteString(k)
	b.WriteString("&p=")
	b.WriteString(p)
	b.WriteString("&r=")
	b.WriteString(r)
	if c.Token != "" {
		b.WriteString("&t=")
		b.WriteString(url.QueryEscape(c.Token))
	}
	b.WriteString("&w=")
	b.WriteString(w)
	return b.String()
}

// headerFields reads the fields of a header written as Header writes it
// (each of k, p, r, t, w at most once, nothing else), in any order,
// without the allocations of url.ParseQuery; ok is false for any other
// header, which CheckHeader then reads with url.ParseQuery.
func headerFields(h string) (k, p, r, t, w string, ok bool) {
	if strings.IndexByte(h, ';') >= 0 {
		return "", "", "", "", "", false
	}
	var seen [5]bool
	for h != "" {
		var field string
		field, h, _ = strings.Cut(h, "&")
		name, v, found := strings.Cut(field, "=")
		if !found {
			return "", "", "", "", "", false
		}
		v, err := url.QueryUnescape(v)
		if err != nil {
			return "", "", "", "", "", false
		}
		var i int
		switch name {
		case "k":
			i, k = 0, v
		case "p":
			i, p = 1, v
		case "r":
			i, r = 2, v
		case "t":
			i, t = 3, v
		case "w":
			i, w = 4, v
		default:
			return "", "", "", "", "", false
		}
		if seen[i] {
			return "", "", "", "", "", false
		}
		seen[i] = true
	}
	return k, p, r, t, w, true
}

// ErrBadClaim is wrapped by CheckHeader's errors.
var ErrBadClaim = errors.New("not a unique-key claim")

// CheckHeader decodes the claim a job's header carries, or says why h is
// not one: malformed, a key outside the store's grammar, no revision, a
// token of the wrong length, a window outside driver.MinTTL to
// driver.MaxTTL (whole milliseconds, checked before any arithmetic), or an
// unknown field value. The error wraps ErrBadClaim.
func CheckHeader(h string) (Claim, error) {
	k, p, r, t, w, ok := headerFields(h)
	if !ok {
		v, err := url.ParseQuery(h)
		if err != nil {
			return Claim{}, fmt.Errorf("%w: %w", ErrBadClaim, err)
		}
		k, p, r, t, w = v.Get("k"), v.Get("p"), v.Get("r"), v.Get("t"), v.Get("w")
	}
	ms, err := strconv.ParseInt(w, 10, 64)
	if err != nil || ms < driver.MinTTL.Milliseconds() || ms > driver.MaxTTL.Milliseconds() {
		return Claim{}, fmt.Errorf("%w: window %q: want %d to %d milliseconds", ErrBadClaim, w, driver.MinTTL.Milliseconds(), driver.MaxTTL.Milliseconds())
	}
	rel, err := strconv.ParseUint(p, 10, 8)
	if err != nil {
		return Claim{}, fmt.Errorf("%w: release policy %q: want 0 to 255", ErrBadClaim, p)
	}
	c := Claim{Key: k, Rev: r, Token: t, Window: time.Duration(ms) * time.Millisecond, Release: Release(rel)}
	switch {
	case driver.CheckKey(c.Key) != nil:
		return Claim{}, fmt.Errorf("%w: key: %w", ErrBadClaim, driver.CheckKey(c.Key))
	case c.Rev == "":
		return Claim{}, fmt.Errorf("%w: no revision", ErrBadClaim)
	case c.Rev == AnyRev && c.Token == "":
		return Claim{}, fmt.Errorf("%w: revision %s without a token", ErrBadClaim, AnyRev)
	case c.Token != "" && len(c.Token) != tokenLen:
		return Claim{}, fmt.Errorf("%w: a token of %d bytes, want %d", ErrBadClaim, len(c.Token), tokenLen)
	}
	return c, nil
}

// Parse decodes the claim a job's header carries; ok is false when h is not
// one (see CheckHeader).
func Parse(h string) (c Claim, ok bool) {
	c, err := CheckHeader(h)
	return c, err == nil
}

// ReleasedBy reports whether the claim ends with its job's outcome: a success
// (dead false) or a dead letter (dead true). An unknown policy never releases.
func (c Claim) ReleasedBy(dead bool) bool {
	switch c.Release {
	case OnFinish:
		return true
	case OnSuccess:
		return !dead
	}
	return false
}

// Request is one job's ask for its key.
type Request struct {
	Key     string        // the job's unique key; empty: the job has none
	JobID   string        // the job's ID, the claim's value
	Window  time.Duration // the claim's TTL; positive
	Release Release
}

// HeldError is the error for a job refused because another job holds its key.
type HeldError struct {
	Key    string // the refused job's unique key
	JobID  string // the refused job's ID
	Holder string // the ID of the job holding the key; empty if unknown
}

// Error names the job, the key and the holder.
func (e *HeldError) Error() string {
	held := ""
	if e.Holder != "" {
		held = " by job " + e.Holder
	}
	return fmt.Sprintf("job %s: unique key %q is held%s", e.JobID, e.Key, held)
}

// Config is what Claims works with.
type Config struct {
	// Store holds the claims: the platform's kv.Unique namespace. Nil when
	// the backend keeps no store.
	Store *kv.Store

	// NoStore says why Store is nil; it matches driver.ErrNoStore. Every
	// call that needs the store returns it, wrapped.
	NoStore error

	// Log gets what no caller can be told: a release or a give-back that
	// failed, leaving a key held until its window ends. Nil: discarded.
	Log *slog.Logger

	// ReleaseTimeout bounds the store call of each Release, and
	// ReleaseLater's batch call; the releases one by one of a batch whose
	// call timed out share a second one. Zero or less:
	// DefaultReleaseTimeout.
	ReleaseTimeout time.Duration
}

// DefaultReleaseTimeout is the ReleaseTimeout of a Config without one.
const DefaultReleaseTimeout = 30 * time.Second

// Claims takes, gives back, releases and retakes unique keys. It is safe for
// concurrent use.
type Claims struct {
	cfg Config
	log *slog.Logger
	rel releases // ReleaseLater's writer
}

// New returns the Claims of cfg.
func New(cfg Config) *Claims {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.ReleaseTimeout <= 0 {
		cfg.ReleaseTimeout = DefaultReleaseTimeout
	}
	return &Claims{cfg: cfg, log: log}
}

// store returns the store of claims, or an error matching driver.ErrNoStore.
func (c *Claims) store() (*kv.Store, error) {
	if c.cfg.Store != nil {
		return c.cfg.Store, nil
	}
	err := c.cfg.NoStore
	if err == nil {
		err = driver.ErrNoStore
	}
	return nil, fmt.Errorf("unique jobs need the backend's store: %w", err)
}

// Take takes the key of each request that has one, in order, for its job:
// a key is taken only when no live claim holds it, and a key asked twice
// in one call is taken by the first request that asks (the later ones
// are refused, held by its job). The keys are created in batches of up
// to driver.MaxBatch (driver.CreateEach: one round trip on a store that
// batches); a single key with one Create. It returns one claim per
// request (the zero Claim for a request without a key or refused) and,
// when any was refused, one entry per request: a *HeldError for each
// refused, nil for the others. A request is all or nothing; a request
// without a window fails the whole call before anything is taken, and a
// store error fails it after the keys taken are given back (those whose
// write's outcome the error left unknown too, when the store then holds
// this call's token for them), within ReleaseTimeout.
func (c *Claims) Take(ctx context.Context, reqs []Request) (claims []Claim, refused []*HeldError, err error) {
	var st *kv.Store
	claims = make([]Claim, len(reqs))
	var (
		items []driver.BatchItem
		at    []int          // the request of each item
		first map[string]int // the first request of each key, when more than one asks
		dups  []int          // the requests whose key an earlier one asks
	)
	for i, r := range reqs {
		if r.Key == "" {
			continue
		}
		if st == nil {
			if st, err = c.store(); err != nil {
				return nil, nil, err // nothing taken yet
			}
		}
		if r.Window <= 0 { // a claim always ends
			return nil, nil, fmt.Errorf("unique key %q of job %s: window %v, want a positive one", r.Key, r.JobID, r.Window)
		}
		if len(reqs) > 1 {
			if first == nil {
				first = make(map[string]int, len(reqs))
			}
			if _, dup := first[r.Key]; dup {
				dups = append(dups, i)
				continue
			}
			first[r.Key] = i
		}
		tok := newToken()
		claims[i] = Claim{Key: r.Key, Token: tok, Window: r.Window, Release: r.Release}
		items = append(items, driver.BatchItem{Key: r.Key, Value: value(r.JobID, tok), TTL: r.Window})
		at = append(at, i)
	}
	var held []int // the requests refused by a claim in the store
	for lo := 0; lo < len(items); lo += driver.MaxBatch {
		hi := min(lo+driver.MaxBatch, len(items))
		rs, err := c.create(ctx, st, items[lo:hi])
		if err != nil {
			c.GiveBack(ctx, claims)
			c.giveBackUnknown(ctx, st, items[lo:hi])
			return nil, nil, fmt.Errorf("taking unique key %q of job %s: %w", reqs[at[lo]].Key, reqs[at[lo]].JobID, err)
		}
		for k, r := range rs {
			i := at[lo+k]
			if errors.Is(r.Err, driver.ErrKeyExists) {
				claims[i] = Claim{}
				held = append(held, i)
				continue
			}
			claims[i].Rev = r.Rev
		}
	}
	if held == nil && dups == nil {
		return claims, nil, nil
	}
	refused = make([]*HeldError, len(reqs))
	if len(held) > 0 {
		keys := make([]string, len(held))
		for k, i := range held {
			keys[k] = reqs[i].Key
		}
		holders, _ := st.GetEach(ctx, keys) // the holder only names it: best effort
		for k, i := range held {
			refused[i] = &HeldError{Key: reqs[i].Key, JobID: reqs[i].JobID}
			if k < len(holders) && holders[k].Err == nil {
				refused[i].Holder = Holder(holders[k].Value)
			}
		}
	}
	for _, i := range dups {
		j := first[reqs[i].Key]
		h := &HeldError{Key: reqs[i].Key, JobID: reqs[i].JobID, Holder: reqs[j].JobID}
		if refused[j] != nil { // the first was refused too: the same holder
			h.Holder = refused[j].Holder
		}
		refused[i] = h
	}
	return claims, refused, nil
}

// AnyRev is the revision a claim taken with its job's enqueue (Plan)
// carries: the job's message is written with the key, in one step, so it
// cannot carry the revision the store gives the key. Such a claim is
// identified by its token alone (a header with AnyRev and no token is not
// a claim) and released by a compare-and-delete of its value at whatever
// revision the key has.
const AnyRev = "*"

// Planned is what Plan prepares for a claiming enqueue.
type Planned struct {
	// Claims has one claim a request: at AnyRev, with a new token, for each
	// request whose key no earlier request asks; the zero Claim otherwise.
	Claims []Claim

	// Items has one entry a request: the store item that creates its claim
	// (its key in the store's namespace), nil where Claims[i] is zero.
	Items []*driver.BatchItem

	// Dups maps each request whose key an earlier one asks to that first
	// request; nil when none does.
	Dups map[int]int
}

// Plan prepares the claims of reqs for a backend that creates them with
// the enqueue of their jobs (driver.ClaimingEnqueuer), with the keys,
// values and windows Take would write. A request whose key an earlier
// request asks is refused, held by the first (Refused says so). A request
// without a window fails the whole call.
func (c *Claims) Plan(reqs []Request) (Planned, error) {
	st, err := c.store()
	if err != nil {
		return Planned{}, err
	}
	p := Planned{Claims: make([]Claim, len(reqs)), Items: make([]*driver.BatchItem, len(reqs))}
	backing := make([]driver.BatchItem, len(reqs)) // one allocation for every item
	var first map[string]int
	for i, r := range reqs {
		if r.Key == "" {
			continue
		}
		if r.Window <= 0 {
			return Planned{}, fmt.Errorf("unique key %q of job %s: window %v, want a positive one", r.Key, r.JobID, r.Window)
		}
		if len(reqs) > 1 {
			if first == nil {
				first = make(map[string]int, len(reqs))
			}
			if j, dup := first[r.Key]; dup {
				if p.Dups == nil {
					p.Dups = map[int]int{}
				}
				p.Dups[i] = j
				continue
			}
			first[r.Key] = i
		}
		tok := newToken()
		it, err := st.Item(r.Key, value(r.JobID, tok), r.Window)
		if err != nil {
			return Planned{}, fmt.Errorf("taking unique key %q of job %s: %w", r.Key, r.JobID, err)
		}
		p.Claims[i] = Claim{Key: r.Key, Rev: AnyRev, Token: tok, Window: r.Window, Release: r.Release}
		backing[i] = it
		p.Items[i] = &backing[i]
	}
	return p, nil
}

// Refused returns Take's refusals for a planned call: held has, for each
// request whose key the store held, the value holding it (nil for the
// others). It zeroes the claims of the refused requests and returns nil
// when none was refused.
func (p Planned) Refused(reqs []Request, held [][]byte) []*HeldError {
	var refused []*HeldError
	for i, v := range held {
		if v == nil {
			continue
		}
		if refused == nil {
			refused = make([]*HeldError, len(reqs))
		}
		p.Claims[i] = Claim{}
		refused[i] = &HeldError{Key: reqs[i].Key, JobID: reqs[i].JobID, Holder: Holder(v)}
	}
	for i, j := range p.Dups {
		if refused == nil {
			refused = make([]*HeldError, len(reqs))
		}
		h := &HeldError{Key: reqs[i].Key, JobID: reqs[i].JobID, Holder: reqs[j].JobID}
		if refused[j] != nil {
			h.Holder = refused[j].Holder
		}
		refused[i] = h
	}
	return refused
}

// create creates items: with one Create for a single item, one
// CreateEach otherwise.
func (c *Claims) create(ctx context.Context, st *kv.Store, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if len(items) != 1 {
		return st.CreateEach(ctx, items)
	}
	rev, err := st.Create(ctx, items[0].Key, items[0].Value, items[0].TTL)
	switch {
	case errors.Is(err, driver.ErrKeyExists):
		return []driver.BatchResult{{Err: driver.ErrKeyExists}}, nil
	case err != nil:
		return nil, err
	}
	return []driver.BatchResult{{Rev: rev}}, nil
}

// giveBackUnknown gives back the claims of items whose writes failed with
// an outcome unknown: each key the store holds with the item's value (its
// token, this call's) is deleted at the revision read. It runs to the end
// even when ctx is cancelled; a failure is logged.
func (c *Claims) giveBackUnknown(ctx context.Context, st *kv.Store, items []driver.BatchItem) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ReleaseTimeout)
	defer cancel()
	for _, it := range items {
		v, rev, err := st.Get(ctx, it.Key)
		if errors.Is(err, driver.ErrKeyNotFound) {
			continue
		}
		if err == nil && subtle.ConstantTimeCompare(v, it.Value) == 1 {
			err = st.Delete(ctx, it.Key, rev)
		}
		if err != nil && !errors.Is(err, driver.ErrRevision) {
			c.log.WarnContext(ctx, "asyncplatform: giving back a unique key failed; it is held until its window ends", "key", it.Key, "error", err)
		}
	}
}

// GiveBackPlanned releases the claims of a planned call (Plan) whose
// enqueue failed, whatever their policy: each key still holding its
// request's claim is deleted, whatever its revision. It runs to the end
// even when ctx is cancelled; a failure is logged.
func (c *Claims) GiveBackPlanned(ctx context.Context, reqs []Request, claims []Claim) {
	st := c.cfg.Store
	if st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ReleaseTimeout)
	defer cancel()
	for i, cl := range claims {
		if cl.Rev != AnyRev {
			continue
		}
		if err := st.DeleteValue(ctx, cl.Key, "", value(reqs[i].JobID, cl.Token)); err != nil && !errors.Is(err, driver.ErrRevision) {
			c.log.WarnContext(ctx, "asyncplatform: giving back a unique key failed; it is held until its window ends", "key", cl.Key, "error", err)
		}
	}
}

// GiveBack releases the claims (taken by Take) of jobs that were not stored,
// whatever their policy; zero claims are skipped. It runs to the end even
// when ctx is cancelled: a claim not given back is held until its window
// ends.
func (c *Claims) GiveBack(ctx context.Context, claims []Claim) {
	st := c.cfg.Store
	if st == nil {
		return // nothing was taken
	}
	for _, cl := range claims {
		if cl.Rev == "" {
			continue
		}
		if err := st.Delete(context.WithoutCancel(ctx), cl.Key, cl.Rev); err != nil && !errors.Is(err, driver.ErrRevision) {
			c.log.WarnContext(ctx, "asyncplatform: giving back a unique key failed; it is held until its window ends", "key", cl.Key, "error", err)
		}
	}
}

// Release gives up the claim carried in header by the job id of queue, which
// succeeded (dead false) or was dead-lettered (dead true), when its policy
// says so and the store still holds that claim: the header's token (none,
// for a claim made before tokens) is the stored one, at the header's
// revision. A header that carries no claim, or another claim's, is
// ignored (logged at Warn when it names a live claim: a forged header,
// most likely). A failure is logged: the key is then held until its window
// ends.
func (c *Claims) Release(ctx context.Context, queue, id, header string, dead bool) {
	if header == "" { // no unique key: the common case, without a parse
		return
	}
	cl, ok := Parse(header)
	if !ok || !cl.ReleasedBy(dead) {
		return
	}
	c.releaseOne(ctx, queue, id, cl)
}

// releaseOne releases cl, the claim of the job id of queue, as Release
// says, logs what it could not do, and reports whether it ended with its
// deadline (the store did not answer in time).
func (c *Claims) releaseOne(ctx context.Context, queue, id string, cl Claim) (late bool) {
	st, err := c.store()
	if err == nil {
		dctx, cancel := context.WithTimeout(ctx, c.cfg.ReleaseTimeout)
		err = c.release(dctx, st, cl, id)
		late = err != nil && errors.Is(dctx.Err(), context.DeadlineExceeded)
		cancel()
	}
	switch {
	case errors.Is(err, errNotHolder):
		c.log.WarnContext(ctx, "asyncplatform: a job's unique claim is not the one the store holds; the key is left held", "queue", queue, "id", id, "key", cl.Key)
	case err != nil && !errors.Is(err, driver.ErrRevision) && !errors.Is(err, driver.ErrKeyNotFound):
		c.log.WarnContext(ctx, "asyncplatform: releasing a unique key failed; it is held until its window ends", "queue", queue, "id", id, "key", cl.Key, "error", err)
	}
	return late
}

// errNotHolder is release's error for a claim whose token is not the
// stored one.
var errNotHolder = errors.New("the claim's token is not the stored one")

// release deletes cl's key when the store holds cl: its token, at its
// revision. A claim with a token, released by the job id that took it, is
// deleted in one compare-and-delete of the value the claim wrote (one
// round trip on a store with driver.StoreValueDeleter); when that finds
// another value or revision, the key is read to say why.
func (c *Claims) release(ctx context.Context, st *kv.Store, cl Claim, id string) error {
	if cl.Rev == AnyRev { // identified by its token alone
		if id == "" {
			return driver.ErrRevision
		}
		return st.DeleteValue(ctx, cl.Key, "", value(id, cl.Token))
	}
	if cl.Token != "" && id != "" {
		err := st.DeleteValue(ctx, cl.Key, cl.Rev, value(id, cl.Token))
		if !errors.Is(err, driver.ErrRevision) {
			return err
		}
	}
	v, rev, err := st.Get(ctx, cl.Key)
	if err != nil {
		return err
	}
	if rev != cl.Rev {
		return driver.ErrRevision // taken since by another claim, or renewed by a redrive
	}
	if !tokenEqual(storedToken(v), cl.Token) {
		return errNotHolder
	}
	return st.Delete(ctx, cl.Key, cl.Rev)
}

// tokenEqual compares a stored token with a claim's in constant time.
func tokenEqual[T string | []byte](stored T, tok string) bool {
	return len(stored) == len(tok) && subtle.ConstantTimeCompare([]byte(stored), []byte(tok)) == 1
}

// Retake has the job id, a dead letter being redriven, take the key of its
// claim cl again, for the claim's window: anew when the key is free, at a new
// revision when cl's job still holds it with cl's token (its policy kept
// it). It returns the claim at its new revision with a new token, a
// *HeldError when another job or claim holds the key, or an error wrapping
// ErrBadClaim for a window outside driver.MinTTL to driver.MaxTTL.
func (c *Claims) Retake(ctx context.Context, cl Claim, id string) (Claim, error) {
	st, err := c.store()
	if err != nil {
		return Claim{}, err
	}
	if cl.Window < driver.MinTTL || cl.Window > driver.MaxTTL {
		return Claim{}, fmt.Errorf("retaking unique key %q of job %s: %w: window %v, want %v to %v", cl.Key, id, ErrBadClaim, cl.Window, driver.MinTTL, driver.MaxTTL)
	}
	var held *HeldError
	tok := newToken()
	err = kv.Retry(ctx, func() error {
		rev, err := st.Create(ctx, cl.Key, value(id, tok), cl.Window)
		if err == nil {
			cl.Rev, cl.Token = rev, tok
			return nil
		}
		if !errors.Is(err, driver.ErrKeyExists) {
			return err
		}
		stored, cur, err := st.Get(ctx, cl.Key)
		holder, holderTok := parseValue(stored)
		switch {
		case errors.Is(err, driver.ErrKeyNotFound): // expired between Create and Get
			return kv.ErrRetry
		case err != nil:
			return err
		case holder != id || !tokenEqual(holderTok, cl.Token):
			held = &HeldError{Key: cl.Key, JobID: id, Holder: holder}
			return nil
		}
		rev, err = st.Update(ctx, cl.Key, value(id, tok), cur, cl.Window)
		switch {
		case errors.Is(err, driver.ErrRevision):
			return kv.ErrRetry
		case err != nil:
			return err
		}
		cl.Rev, cl.Token = rev, tok
		return nil
	})
	switch {
	case err != nil:
		return Claim{}, fmt.Errorf("retaking unique key %q of job %s: %w", cl.Key, id, err)
	case held != nil:
		return Claim{}, held
	}
	return cl, nil
}
