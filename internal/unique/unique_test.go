package unique_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/unique"
)

// newStore returns the unique namespace of a fresh in-process store.
func newStore(t *testing.T) *kv.Store {
	t.Helper()
	b, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return kv.Of(d, kv.Unique)
}

func newClaims(t *testing.T) (*unique.Claims, *kv.Store) {
	t.Helper()
	st := newStore(t)
	return unique.New(unique.Config{Store: st}), st
}

// holder returns the job holding key, or "" when it is free.
func holder(t *testing.T, st *kv.Store, key string) string {
	t.Helper()
	v, _, err := st.Get(context.Background(), key)
	if errors.Is(err, driver.ErrKeyNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return unique.Holder(v)
}

func take(t *testing.T, c *unique.Claims, key, id string, rel unique.Release) unique.Claim {
	t.Helper()
	claims, refused, err := c.Take(context.Background(), []unique.Request{{Key: key, JobID: id, Window: time.Hour, Release: rel}})
	if err != nil || refused != nil {
		t.Fatalf("Take(%q for %s) = %v, %v", key, id, refused, err)
	}
	return claims[0]
}

// A header written by earlier releases (key, revision, window in ms, policy
// number, URL-encoded) still reads, and Header writes the same bytes.
func TestParseStoredFormat(t *testing.T) {
	t.Parallel()
	const stored = "k=orders%2F42&p=1&r=17-0&w=86400000"
	want := unique.Claim{Key: "orders/42", Rev: "17-0", Window: 24 * time.Hour, Release: unique.OnSuccess}
	got, ok := unique.Parse(stored)
	if !ok || got != want {
		t.Fatalf("Parse(%q) = %+v, %v; want %+v, true", stored, got, ok, want)
	}
	if h := want.Header(); h != stored {
		t.Errorf("Header() = %q, want %q", h, stored)
	}
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, h := range []string{
		"",
		"%zz",
		"k=a&p=0&w=1000",                 // no revision
		"k=&p=0&r=1&w=1000",              // no key
		"k=a%2F%2Fb&p=0&r=1&w=1000",      // a key outside the grammar
		"k=a&p=0&r=1",                    // no window
		"k=a&p=0&r=1&w=0",                // a window that never ends
		"k=a&p=0&r=1&w=-5",               // nor does this one
		"k=a&p=0&r=1&w=x",                // not a number
		"k=a&r=1&w=1000",                 // no policy
		"k=a&p=256&r=1&w=1000",           // not a policy number
		"k=a&p=-1&r=1&w=1000",            // nor this
		"k=a&p=0&r=1&w=315360000001",     // a window past driver.MaxTTL
		"k=a&p=0&r=1&w=9223372036854776", // overflows to 192µs as a Duration
		"k=a&p=0&r=1&w=18446744073709",   // overflows to a negative Duration
		"k=a&p=0&r=1&t=short&w=1000",     // a token of the wrong length
	} {
		if c, ok := unique.Parse(h); ok {
			t.Errorf("Parse(%q) = %+v, true; want not a claim", h, c)
		}
	}
}

func TestReleasedBy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		release       unique.Release
		success, dead bool // released by a success, by a dead letter
	}{
		{unique.OnFinish, true, true},
		{unique.OnSuccess, true, false},
		{unique.OnWindow, false, false},
		{unique.Release(7), false, false}, // unknown: never early
	}
	for _, tt := range tests {
		c := unique.Claim{Release: tt.release}
		if got := c.ReleasedBy(false); got != tt.success {
			t.Errorf("policy %d: ReleasedBy(success) = %v, want %v", tt.release, got, tt.success)
		}
		if got := c.ReleasedBy(true); got != tt.dead {
			t.Errorf("policy %d: ReleasedBy(dead) = %v, want %v", tt.release, got, tt.dead)
		}
	}
}

// Take takes each key once: a key already held, or taken earlier in the same
// batch, refuses its job and names the holder; a request without a key is
// passed over.
func TestTake(t *testing.T) {
	t.Parallel()
	c, st := newClaims(t)
	ctx := context.Background()
	take(t, c, "a", "old", unique.OnFinish)
	reqs := []unique.Request{
		{Key: "a", JobID: "j0", Window: time.Hour},
		{JobID: "j1"},
		{Key: "b", JobID: "j2", Window: time.Hour, Release: unique.OnWindow},
		{Key: "b", JobID: "j3", Window: time.Hour},
	}
	claims, refused, err := c.Take(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	wantHolder := []string{"old", "", "", "j2"} // "" for the jobs not refused
	for i, r := range refused {
		switch {
		case (r != nil) != (wantHolder[i] != ""):
			t.Errorf("refused[%d] = %v, want a refusal: %v", i, r, wantHolder[i] != "")
		case r != nil && (r.Key != reqs[i].Key || r.JobID != reqs[i].JobID || r.Holder != wantHolder[i]):
			t.Errorf("refused[%d] = %+v, want key %q, job %s, holder %s", i, *r, reqs[i].Key, reqs[i].JobID, wantHolder[i])
		}
	}
	if len(refused) != len(reqs) {
		t.Fatalf("%d refusals, want one entry per request (%d)", len(refused), len(reqs))
	}
	if claims[0] != (unique.Claim{}) || claims[1] != (unique.Claim{}) || claims[3] != (unique.Claim{}) {
		t.Errorf("claims = %+v: want the zero Claim for requests refused or without a key", claims)
	}
	if c := claims[2]; c.Key != "b" || c.Rev == "" || c.Window != time.Hour || c.Release != unique.OnWindow {
		t.Errorf("claims[2] = %+v, want b's claim at a revision", c)
	}
	if h := holder(t, st, "a"); h != "old" {
		t.Errorf("a is held by %q, want the old job", h)
	}
	if h := holder(t, st, "b"); h != "j2" {
		t.Errorf("b is held by %q, want j2", h)
	}
	if _, refused, err := c.Take(ctx, []unique.Request{{Key: "c", JobID: "j4", Window: time.Hour}}); refused != nil || err != nil {
		t.Errorf("Take of a free key = %v, %v; want no refusal (nil), no error", refused, err)
	}
}

// Of many takers of one key at once, exactly one gets it.
func TestTakeConcurrent(t *testing.T) {
	t.Parallel()
	c, st := newClaims(t)
	var won atomic.Int32
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			claims, refused, err := c.Take(context.Background(), []unique.Request{{Key: "k", JobID: fmt.Sprint("j", i), Window: time.Hour}})
			switch {
			case err != nil:
				t.Error(err)
			case refused == nil && claims[0].Rev != "":
				won.Add(1)
			}
		}()
	}
	wg.Wait()
	if won.Load() != 1 || holder(t, st, "k") == "" {
		t.Fatalf("%d takers won, key held by %q; want exactly one", won.Load(), holder(t, st, "k"))
	}
}

// A failing request fails the whole batch and gives back the keys taken
// before it.
func TestTakeAllOrNothing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		bad  unique.Request
		want error // matched by errors.Is; nil: any error
	}{
		{"StoreRefusesKey", unique.Request{Key: "x//y", JobID: "j2", Window: time.Hour}, driver.ErrBadKey},
		{"StoreRefusesTTL", unique.Request{Key: "x", JobID: "j2", Window: driver.MaxTTL + time.Hour}, driver.ErrBadTTL},
		{"NoWindow", unique.Request{Key: "x", JobID: "j2"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, st := newClaims(t)
			reqs := []unique.Request{{Key: "a", JobID: "j0", Window: time.Hour}, {Key: "b", JobID: "j1", Window: time.Hour}, tt.bad}
			claims, _, err := c.Take(context.Background(), reqs)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("Take = %v; want an error matching %v", err, tt.want)
			}
			if claims != nil {
				t.Errorf("claims = %+v on error, want nil", claims)
			}
			for _, k := range []string{"a", "b", "x"} {
				if h := holder(t, st, k); h != "" {
					t.Errorf("key %q held by %s after a failed Take; want it given back", k, h)
				}
			}
		})
	}
}

// GiveBack deletes each claim at its revision only: a key taken since by
// another job stays its.
func TestGiveBack(t *testing.T) {
	t.Parallel()
	c, st := newClaims(t)
	ctx := context.Background()
	a := take(t, c, "a", "j0", unique.OnWindow)
	b := take(t, c, "b", "j1", unique.OnWindow)
	if err := st.Delete(ctx, "b", b.Rev); err != nil { // b's window ended...
		t.Fatal(err)
	}
	take(t, c, "b", "newer", unique.OnFinish) // ...and a newer job took it
	take(t, c, "c", "other", unique.OnFinish)
	// A claim without a revision was never taken: it is no licence to
	// delete whatever holds its key.
	c.GiveBack(ctx, []unique.Claim{a, {}, b, {Key: "c"}})
	if h := holder(t, st, "a"); h != "" {
		t.Errorf("a held by %s, want it given back whatever its policy", h)
	}
	if h := holder(t, st, "b"); h != "newer" {
		t.Errorf("b held by %q, want the newer job's claim left alone", h)
	}
	if h := holder(t, st, "c"); h != "other" {
		t.Errorf("c held by %q, want the other job's claim left alone", h)
	}
}

// Release follows the claim's policy and the job's outcome.
func TestRelease(t *testing.T) {
	t.Parallel()
	tests := []struct {
		release unique.Release
		dead    bool
		freed   bool
	}{
		{unique.OnFinish, false, true},
		{unique.OnFinish, true, true},
		{unique.OnSuccess, false, true},
		{unique.OnSuccess, true, false},
		{unique.OnWindow, false, false},
		{unique.OnWindow, true, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d/dead=%v", tt.release, tt.dead), func(t *testing.T) {
			t.Parallel()
			c, st := newClaims(t)
			cl := take(t, c, "k", "j", tt.release)
			c.Release(context.Background(), "q", "j", cl.Header(), tt.dead)
			if freed := holder(t, st, "k") == ""; freed != tt.freed {
				t.Errorf("key freed: %v, want %v", freed, tt.freed)
			}
		})
	}
}

// Release leaves alone a key another job took since, and a header that is
// no claim.
func TestReleaseLeavesOthers(t *testing.T) {
	t.Parallel()
	c, st := newClaims(t)
	ctx := context.Background()
	old := take(t, c, "k", "old", unique.OnFinish)
	c.GiveBack(ctx, []unique.Claim{old})
	take(t, c, "k", "new", unique.OnFinish)
	c.Release(ctx, "q", "old", old.Header(), false)
	if h := holder(t, st, "k"); h != "new" {
		t.Errorf("k held by %q, want the new job's claim kept", h)
	}
	forged := old
	forged.Rev = ""
	c.Release(ctx, "q", "old", forged.Header(), false) // no revision: would delete whatever is there
	c.Release(ctx, "q", "old", "", false)
	if h := holder(t, st, "k"); h != "new" {
		t.Errorf("k held by %q after releasing non-claims, want the new job's claim kept", h)
	}
}

// Retake takes a free key anew, renews the letter's own claim at a new
// revision, and refuses a key a newer job holds.
func TestRetake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name   string
		setup  func(t *testing.T, c *unique.Claims, st *kv.Store) unique.Claim // the letter's claim
		holder string                                                          // the refusing holder; "" to retake
	}{
		{"Free", func(t *testing.T, c *unique.Claims, st *kv.Store) unique.Claim {
			cl := take(t, c, "k", "dl", unique.OnFinish)
			c.GiveBack(ctx, []unique.Claim{cl}) // released when dead-lettered
			return cl
		}, ""},
		{"OwnClaimKept", func(t *testing.T, c *unique.Claims, st *kv.Store) unique.Claim {
			return take(t, c, "k", "dl", unique.OnSuccess)
		}, ""},
		{"OwnClaimRetaken", func(t *testing.T, c *unique.Claims, st *kv.Store) unique.Claim {
			cl := take(t, c, "k", "dl", unique.OnSuccess)
			if _, err := c.Retake(ctx, cl, "dl"); err != nil {
				t.Fatal(err)
			}
			return cl
		}, "dl"}, // the letter's claim was retaken (redriven) since: a duplicate record takes nothing
		{"Legacy", func(t *testing.T, c *unique.Claims, st *kv.Store) unique.Claim {
			cl := take(t, c, "k", "dl", unique.OnSuccess)
			if _, err := st.Update(ctx, "k", []byte("dl"), cl.Rev, time.Hour); err != nil { // a claim made before tokens
				t.Fatal(err)
			}
			cl.Token = ""
			return cl
		}, ""},
		{"HeldByNewer", func(t *testing.T, c *unique.Claims, st *kv.Store) unique.Claim {
			cl := take(t, c, "k", "dl", unique.OnFinish)
			c.GiveBack(ctx, []unique.Claim{cl})
			take(t, c, "k", "newer", unique.OnFinish)
			return cl
		}, "newer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, st := newClaims(t)
			old := tt.setup(t, c, st)
			got, err := c.Retake(ctx, old, "dl")
			if tt.holder != "" {
				var held *unique.HeldError
				if !errors.As(err, &held) || held.Holder != tt.holder || held.JobID != "dl" || held.Key != "k" {
					t.Fatalf("Retake = %+v, %v; want a *HeldError naming %s", got, err, tt.holder)
				}
				if h := holder(t, st, "k"); h != tt.holder {
					t.Errorf("k held by %q, want %s's claim kept", h, tt.holder)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, rev, _ := st.Get(ctx, "k")
			if got.Rev != rev || got.Rev == old.Rev || got.Key != old.Key || got.Window != old.Window || got.Release != old.Release {
				t.Errorf("Retake = %+v (store at %s); want %+v at the store's new revision", got, rev, old)
			}
			if h := holder(t, st, "k"); h != "dl" {
				t.Errorf("k held by %q, want the letter's job", h)
			}
			c.Release(ctx, "q", "dl", got.Header(), false) // the new claim releases
			if h := holder(t, st, "k"); h != "" {
				t.Errorf("k held by %q after the retaken claim was released", h)
			}
		})
	}
}

// A retaken claim holds the key for its window, not longer.
func TestRetakeWindow(t *testing.T) {
	t.Parallel()
	c, st := newClaims(t)
	cl := unique.Claim{Key: "k", Rev: "gone", Window: 50 * time.Millisecond}
	if _, err := c.Retake(context.Background(), cl, "dl"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(120 * time.Millisecond)
	if h := holder(t, st, "k"); h != "" {
		t.Errorf("k still held by %s after the claim's window", h)
	}
}

// Without a store, every call that needs one says why, matching
// driver.ErrNoStore, and a batch without keys needs none.
func TestNoStore(t *testing.T) {
	t.Parallel()
	why := fmt.Errorf("%w: this backend keeps none", driver.ErrNoStore)
	var logged bytes.Buffer
	c := unique.New(unique.Config{NoStore: why, Log: slog.New(slog.NewTextHandler(&logged, nil))})
	ctx := context.Background()
	if _, _, err := c.Take(ctx, []unique.Request{{JobID: "j"}}); err != nil {
		t.Errorf("Take without keys = %v, want nil", err)
	}
	if _, _, err := c.Take(ctx, []unique.Request{{Key: "k", JobID: "j", Window: time.Hour}}); !errors.Is(err, why) {
		t.Errorf("Take = %v, want %v wrapped", err, why)
	}
	cl := unique.Claim{Key: "k", Rev: "1", Window: time.Hour}
	if _, err := c.Retake(ctx, cl, "j"); !errors.Is(err, driver.ErrNoStore) {
		t.Errorf("Retake = %v, want ErrNoStore", err)
	}
	c.GiveBack(ctx, []unique.Claim{cl})
	c.Release(ctx, "q", "j", cl.Header(), false)
	if !bytes.Contains(logged.Bytes(), []byte("releasing a unique key failed")) {
		t.Errorf("a release that could not reach the store was not logged: %q", logged.String())
	}
}

// A job without a unique key, the common case, costs its end nothing.
func TestReleaseWithoutKeyIsFree(t *testing.T) {
	c, _ := newClaims(t)
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { c.Release(ctx, "q", "id", "", false) }); n != 0 {
		t.Errorf("Release of a job without a key: %v allocations, want 0", n)
	}
}

// A header comes off the broker: a forged one that names a live claim's key
// and revision (revisions are sequential on Redis and PostgreSQL) but not
// its token releases nothing, nor does one without a token; the real
// header still releases it.
func TestReleaseNeedsToken(t *testing.T) {
	t.Parallel()
	c, st := newClaims(t)
	ctx := context.Background()
	real := take(t, c, "invoice-42", "victim", unique.OnFinish)
	for _, tok := range []string{"", "AAAAAAAAAAAAAAAAAAAAAA"} {
		forged := real
		forged.Token = tok
		c.Release(ctx, "q", "forger", forged.Header(), true)
		if h := holder(t, st, "invoice-42"); h != "victim" {
			t.Fatalf("a forged header with token %q released the key (held by %q)", tok, h)
		}
	}
	c.Release(ctx, "q", "victim", real.Header(), false)
	if h := holder(t, st, "invoice-42"); h != "" {
		t.Fatalf("the real header did not release the key (held by %q)", h)
	}
}

// A claim made before tokens (a bare job ID in the store, no token in the
// header) is still released by its header; a tokenless header never
// releases a claim that has a token (TestReleaseNeedsToken).
func TestReleaseLegacyClaim(t *testing.T) {
	t.Parallel()
	c, st := newClaims(t)
	ctx := context.Background()
	rev, err := st.Create(ctx, "k", []byte("old"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cl := unique.Claim{Key: "k", Rev: rev, Window: time.Hour}
	if h := holder(t, st, "k"); h != "old" {
		t.Fatalf("a legacy claim reads as held by %q", h)
	}
	c.Release(ctx, "q", "old", cl.Header(), false)
	if h := holder(t, st, "k"); h != "" {
		t.Fatalf("a legacy claim was not released by its header (held by %q)", h)
	}
}

// Retake refuses a window the store would refuse (or never end) with
// ErrBadClaim, before touching the store.
func TestRetakeBadWindow(t *testing.T) {
	t.Parallel()
	c, st := newClaims(t)
	for _, w := range []time.Duration{0, -time.Millisecond, time.Microsecond * 192, driver.MaxTTL + time.Millisecond} {
		_, err := c.Retake(context.Background(), unique.Claim{Key: "k", Rev: "1", Window: w}, "dl")
		if !errors.Is(err, unique.ErrBadClaim) {
			t.Errorf("Retake with window %v = %v; want ErrBadClaim", w, err)
		}
	}
	if h := holder(t, st, "k"); h != "" {
		t.Errorf("k held by %q after refused retakes", h)
	}
}
