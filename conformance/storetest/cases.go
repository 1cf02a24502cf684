package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// neverIssued is a revision no store hands out in a test's life. Not "1":
// a revision is the store's own, and on a new NATS bucket the delete marker
// that a Delete of an absent key writes is sequence 1, so a Delete at "1"
// matched it (a revision of a delete marker is never handed out; Delete
// of an absent key at a revision the store issued fails, as "Delete at a
// revision of an earlier life" shows).
const neverIssued = "4611686018427387904"

func testBasic(t *testing.T, e *env) {
	s, ctx := e.store, e.ctx()
	_, _, err := s.Get(ctx, "k")
	is(t, "Get of an absent key", err, ap.ErrKeyNotFound)
	_, err = s.Update(ctx, "k", []byte("x"), neverIssued, 0)
	is(t, "Update of an absent key", err, ap.ErrRevision)
	must(t, "Delete of an absent key without a revision", s.Delete(ctx, "k", ""))
	is(t, "Delete of an absent key at a revision", s.Delete(ctx, "k", neverIssued), ap.ErrRevision)

	r1, err := s.Create(ctx, "k", []byte("one"), 0)
	must(t, "Create", err)
	if r1 == "" || len(r1) > driver.MaxRevisionLen {
		t.Fatalf("Create returned the revision %q: want 1 to %d bytes", r1, driver.MaxRevisionLen)
	}
	v, rev, err := s.Get(ctx, "k")
	must(t, "Get", err)
	if string(v) != "one" || rev != r1 {
		t.Fatalf("Get = %q at %q, want %q at %q", v, rev, "one", r1)
	}
	_, err = s.Create(ctx, "k", []byte("two"), 0)
	is(t, "Create of a present key", err, ap.ErrKeyExists)

	r2, err := s.Update(ctx, "k", []byte("two"), r1, 0)
	must(t, "Update at the current revision", err)
	if r2 == r1 || r2 == "" {
		t.Fatalf("Update returned the revision %q after %q: want a new one", r2, r1)
	}
	_, err = s.Update(ctx, "k", []byte("three"), r1, 0)
	is(t, "Update at a stale revision", err, ap.ErrRevision)
	_, err = s.Update(ctx, "k", []byte("three"), "not-a-revision", 0)
	is(t, "Update at a made-up revision", err, ap.ErrRevision)
	is(t, "Delete at a stale revision", s.Delete(ctx, "k", r1), ap.ErrRevision)
	is(t, "Delete at a made-up revision", s.Delete(ctx, "k", "not-a-revision"), ap.ErrRevision)
	if v, rev, err := s.Get(ctx, "k"); err != nil || string(v) != "two" || rev != r2 {
		t.Fatalf("Get after the refused writes = %q at %q (%v), want %q at %q", v, rev, err, "two", r2)
	}

	// Another key's revision is not this key's.
	ro, err := s.Create(ctx, "other", []byte("o"), 0)
	must(t, "Create other", err)
	_, err = s.Update(ctx, "k", []byte("x"), ro, 0)
	is(t, "Update at another key's revision", err, ap.ErrRevision)

	must(t, "Delete at the current revision", s.Delete(ctx, "k", r2))
	_, _, err = s.Get(ctx, "k")
	is(t, "Get after Delete", err, ap.ErrKeyNotFound)
	must(t, "Delete without a revision", s.Delete(ctx, "other", ""))
	_, _, err = s.Get(ctx, "other")
	is(t, "Get after an unconditional Delete", err, ap.ErrKeyNotFound)

	// A second connection sees the same keys at once.
	s2 := e.in(e.connect())
	r3, err := s2.Create(ctx, "k", []byte("again"), 0)
	must(t, "Create on a second connection", err)
	if v, rev, err := s.Get(ctx, "k"); err != nil || string(v) != "again" || rev != r3 {
		t.Fatalf("Get on the first connection = %q at %q (%v), want %q at %q", v, rev, err, "again", r3)
	}
}

func testRevisionNeverReused(t *testing.T, e *env) {
	s, ctx := e.store, e.ctx()
	seen := map[string]string{}
	note := func(what, rev string) {
		t.Helper()
		if prev, ok := seen[rev]; ok {
			t.Fatalf("%s returned the revision %q, given before by %s", what, rev, prev)
		}
		seen[rev] = what
	}
	var old []string
	for i := range 3 {
		r, err := s.Create(ctx, "k", []byte("v"), 0)
		must(t, "Create", err)
		note(fmt.Sprintf("Create %d", i), r)
		r2, err := s.Update(ctx, "k", []byte("w"), r, 0)
		must(t, "Update", err)
		note(fmt.Sprintf("Update %d", i), r2)
		// Every revision of an earlier life of the key is refused.
		for _, o := range append(old, r) {
			_, err := s.Update(ctx, "k", []byte("x"), o, 0)
			is(t, "Update at a revision of an earlier life", err, ap.ErrRevision)
			is(t, "Delete at a revision of an earlier life", s.Delete(ctx, "k", o), ap.ErrRevision)
		}
		old = append(old, r, r2)
		must(t, "Delete", s.Delete(ctx, "k", r2))
	}
}

// testCreateRaceConnections races Creates of one key from independent
// connections, several rounds: exactly one wins each.
func testCreateRaceConnections(t *testing.T, e *env) {
	const conns, rounds = 6, 5
	stores := []*ap.Store{e.store}
	for len(stores) < conns {
		stores = append(stores, e.in(e.connect()))
	}
	ctx := e.ctx()
	for round := range rounds {
		key := fmt.Sprintf("race/%d", round)
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			errs  = make([]error, conns)
			revs  = make([]string, conns)
		)
		for i, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				revs[i], errs[i] = s.Create(ctx, key, []byte(strconv.Itoa(i)), 0)
			}()
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: connections %d and %d both created %s", round, winner, i, key)
			case err == nil:
				winner = i
			default:
				is(t, fmt.Sprintf("round %d: the Create of a loser", round), err, ap.ErrKeyExists)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no connection created %s: %v", round, key, errs)
		}
		v, rev, err := e.store.Get(ctx, key)
		must(t, "Get", err)
		if string(v) != strconv.Itoa(winner) || rev != revs[winner] {
			t.Fatalf("round %d: %s holds %q at %q, want the winner's %q at %q", round, key, v, rev, strconv.Itoa(winner), revs[winner])
		}
	}
}

// testCASContention runs increments of one counter from workers on
// independent connections: read, add one, Update at the revision read,
// again on ErrRevision. Every increment must count once.
func testCASContention(t *testing.T, e *env) {
	const conns, perConn, each = 4, 2, 6
	ctx := e.ctx()
	_, err := e.store.Create(ctx, "counter", []byte("0"), 0)
	must(t, "Create", err)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		revs    = map[string]int{} // revision written → the count it holds
		retries int
		fail    error
	)
	for c := range conns {
		s := e.store
		if c > 0 {
			s = e.in(e.connect())
		}
		for range perConn {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					for {
						v, rev, err := s.Get(ctx, "counter")
						if err == nil {
							var n int
							n, err = strconv.Atoi(string(v))
							if err == nil {
								var nr string
								nr, err = s.Update(ctx, "counter", []byte(strconv.Itoa(n+1)), rev, 0)
								if err == nil {
									mu.Lock()
									if prev, dup := revs[nr]; dup {
										fail = fmt.Errorf("revision %q was given to counts %d and %d", nr, prev, n+1)
									}
									revs[nr] = n + 1
									mu.Unlock()
									break
								}
							}
						}
						if !errors.Is(err, ap.ErrRevision) {
							mu.Lock()
							fail = err
							mu.Unlock()
							return
						}
						mu.Lock()
						retries++
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	if fail != nil {
		t.Fatal(fail)
	}
	want := conns * perConn * each
	v, _, err := e.store.Get(ctx, "counter")
	must(t, "Get", err)
	if string(v) != strconv.Itoa(want) {
		t.Fatalf("the counter is %s after %d increments, want %d", v, want, want)
	}
	if len(revs) != want {
		t.Fatalf("%d distinct revisions for %d increments", len(revs), want)
	}
	t.Logf("%d increments from %d workers on %d connections, %d retries on ErrRevision", want, conns*perConn, conns, retries)
}

// probe is one Get of a TTL case: when it began and ended, and whether it
// found the key.
type probe struct {
	start, end time.Time
	found      bool
}

// testTTLExpiry writes a key with a TTL and reads it until well after: every
// read that ended before the TTL (counted from before the write) found it,
// every read that began after it (counted from after the write) did not.
// On a machine too loaded to read in time it tries again with a longer TTL.
func testTTLExpiry(t *testing.T, e *env) {
	const guard = 5 * time.Millisecond // clock granularity: milliseconds, two clocks
	ttl := e.scaled(400 * time.Millisecond)
	for try := 1; ; try++ {
		ok := ttlOnce(t, e, ttl, guard, try)
		if ok || t.Failed() {
			return
		}
		if try == 3 {
			t.Fatalf("no read of the key ended within its TTL of %v in %d tries: the machine is too loaded (%s stretches the suite's timings)", ttl, try, scaleEnv)
		}
		t.Logf("try %d: no read ended within the TTL of %v (the machine is loaded); again with twice the TTL", try, ttl)
		ttl *= 2
	}
}

func ttlOnce(t *testing.T, e *env, ttl, guard time.Duration, try int) bool {
	s, ctx := e.store, e.ctx()
	key := fmt.Sprintf("ttl/%d", try)
	t0 := time.Now()
	rev, err := s.Create(ctx, key, []byte("v"), ttl)
	t1 := time.Now()
	must(t, "Create with a TTL", err)
	var probes []probe
	for time.Since(t1) < ttl+e.scaled(300*time.Millisecond) {
		g0 := time.Now()
		_, _, err := s.Get(ctx, key)
		g1 := time.Now()
		if err != nil && !errors.Is(err, ap.ErrKeyNotFound) {
			t.Fatalf("Get: %v", err)
		}
		probes = append(probes, probe{g0, g1, err == nil})
		time.Sleep(10 * time.Millisecond)
	}
	early, lateFound := 0, 0
	for _, p := range probes {
		switch {
		case p.end.Before(t0.Add(ttl-guard)) && !p.found:
			t.Errorf("the key was gone %v after the write began, before its TTL of %v", p.end.Sub(t0), ttl)
		case p.end.Before(t0.Add(ttl - guard)):
			early++
		case p.start.After(t1.Add(ttl+guard)) && p.found:
			lateFound++
			t.Errorf("the key was still there %v after the write ended, past its TTL of %v", p.start.Sub(t1), ttl)
		}
	}
	if early == 0 {
		return false
	}
	if lateFound == 0 && !probes[len(probes)-1].found {
		// Gone for every method, not only for Get.
		page, err := s.List(ctx, "ttl/", "", 10)
		must(t, "List", err)
		if slices.Contains(page.Keys, key) {
			t.Errorf("List shows the expired key %s", key)
		}
		_, err = s.Update(ctx, key, []byte("w"), rev, 0)
		is(t, "Update at the revision of an expired key", err, ap.ErrRevision)
		is(t, "Delete at the revision of an expired key", s.Delete(ctx, key, rev), ap.ErrRevision)
		r2, err := s.Create(ctx, key, []byte("new"), 0)
		must(t, "Create in place of an expired key", err)
		if r2 == rev {
			t.Errorf("the new key got the expired key's revision %q", rev)
		}
		if v, _, err := s.Get(ctx, key); err != nil || string(v) != "new" {
			t.Errorf("Get after the Create = %q, %v; want %q", v, err, "new")
		}
	}
	t.Logf("TTL %v: %d reads within it found the key; %d reads in all", ttl, early, len(probes))
	return true
}

// testTTLSetByEachWrite checks that every write sets the TTL anew: an
// Update with a TTL gives one to a key that had none, an Update without one
// takes it away, and an Update with a TTL renews it.
func testTTLSetByEachWrite(t *testing.T, e *env) {
	s, ctx := e.store, e.ctx()
	ttl := e.scaled(500 * time.Millisecond)
	rGain, err := s.Create(ctx, "gain", []byte("v"), 0)
	must(t, "Create gain", err)
	loseAt := time.Now() // its TTL runs from within the Create
	rLose, err := s.Create(ctx, "lose", []byte("v"), ttl)
	must(t, "Create lose", err)
	renewAt := time.Now() // renew's TTL runs from within its Create: it ends at renewAt+ttl or after
	rRenew, err := s.Create(ctx, "renew", []byte("v"), ttl)
	must(t, "Create renew", err)
	_, err = s.Create(ctx, "renew", []byte("x"), ttl)
	is(t, "Create of a present key with a TTL", err, ap.ErrKeyExists)
	_, err = s.Update(ctx, "gain", []byte("w"), rGain, ttl)
	must(t, "Update gain", err)
	_, err = s.Update(ctx, "lose", []byte("w"), rLose, 0)
	if errors.Is(err, ap.ErrRevision) && time.Since(loseAt) >= ttl {
		// The writes before it took longer than lose's TTL (a loaded
		// machine or a slow store): the key expired first.
		t.Logf("the Update of lose came %v after its Create, past its TTL of %v: not judged", time.Since(loseAt).Round(time.Millisecond), ttl)
		return
	}
	must(t, "Update lose", err)
	written := time.Now()
	time.Sleep(ttl / 2)
	renewSent := time.Now() // the renewed TTL runs from within the Update: it ends at renewSent+ttl or after
	_, err = s.Update(ctx, "renew", []byte("w"), rRenew, ttl)
	renewed, judge := time.Now(), true
	if errors.Is(err, ap.ErrRevision) && renewed.Sub(renewAt) >= ttl {
		// The renewal returned a TTL or more after the Create began (a
		// loaded machine, a slow store): the key may have expired before
		// the store took it.
		t.Logf("the renewal returned %v after renew's Create began, past its TTL of %v: not judged", renewed.Sub(renewAt).Round(time.Millisecond), ttl)
		judge = false
	} else {
		must(t, "Update renew", err)
	}
	time.Sleep(time.Until(written.Add(ttl + e.scaled(100*time.Millisecond))))
	// Expiry is decided when a key is read, by the reading store's clock:
	// one read after the TTL must miss, however loaded the machine.
	_, _, err = s.Get(ctx, "renew")
	switch since := time.Since(renewSent); {
	case !judge:
	case since < ttl-5*time.Millisecond && err != nil:
		t.Errorf("a key whose TTL Update renewed is gone %v after the renewal, before its TTL of %v: %v", since, ttl, err)
	case since >= ttl-5*time.Millisecond:
		t.Logf("the renewed key was read too late to judge (%v after the renewal)", since)
	}
	e.gone(t, s, "gain", written, ttl, "a key given a TTL by Update")
	if _, _, err := s.Get(ctx, "lose"); err != nil {
		t.Errorf("a key whose TTL Update took away is gone: %v", err)
	}
}

// listing is a set of keys with the order List must give them.
var listing = []string{
	"a", "a-b", "a.b", "a/b", "a/b/c", "a/b/c:d", "a/b=c", "a/b0", "a/bc", "a0", "a:b", "a=b",
	"A", "Z", "_", "-", "b", "b/a", "ba", "z/z/z",
}

func testListOrderAndPaging(t *testing.T, e *env) {
	s, ctx := e.store, e.ctx()
	shuffled := slices.Clone(listing)
	for i := range shuffled { // any order but the sorted one
		j := (i * 7) % len(shuffled)
		shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
	}
	for _, k := range shuffled {
		_, err := s.Create(ctx, k, []byte(k), 0)
		must(t, "Create "+k, err)
	}
	want := slices.Clone(listing)
	slices.Sort(want) // byte order
	for _, limit := range []int{1, 2, 3, 7, len(want) - 1, len(want), len(want) + 1, 0} {
		got := listAll(t, ctx, s, "", limit)
		if !slices.Equal(got, want) {
			t.Fatalf("List by pages of %d:\n got %q\nwant %q", limit, got, want)
		}
	}
	// A full page with nothing after it says so with an empty Next.
	page, err := s.List(ctx, "", "", len(want))
	must(t, "List", err)
	if page.Next != "" || len(page.Keys) != len(want) {
		t.Errorf("List of exactly every key: %d keys, Next %q; want %d and none", len(page.Keys), page.Next, len(want))
	}
	// Paging goes on when the cursor's key and a key not yet listed are
	// deleted between pages.
	page, err = s.List(ctx, "", "a/b", 3)
	must(t, "List", err)
	must(t, "Delete", s.Delete(ctx, page.Next, ""))
	must(t, "Delete", s.Delete(ctx, "z/z/z", ""))
	got := append(page.Keys, listAllFrom(t, ctx, s, "", page.Next, 3)...)
	wantAfter := slices.DeleteFunc(slices.Clone(want[slices.Index(want, "a/b")+1:]), func(k string) bool { return k == "z/z/z" })
	if !slices.Equal(got, wantAfter) {
		t.Fatalf("List after a/b, with keys deleted between pages:\n got %q\nwant %q", got, wantAfter)
	}
	// A cursor past every key.
	page, err = s.List(ctx, "", "zzz", 10)
	must(t, "List", err)
	if len(page.Keys) != 0 || page.Next != "" {
		t.Errorf("List after the last key: %q, Next %q; want nothing", page.Keys, page.Next)
	}
}

func testListPrefixes(t *testing.T, e *env) {
	s, ctx := e.store, e.ctx()
	for _, k := range listing {
		_, err := s.Create(ctx, k, nil, 0)
		must(t, "Create "+k, err)
	}
	sorted := slices.Clone(listing)
	slices.Sort(sorted)
	for _, prefix := range []string{"a", "a/", "a/b", "a/b/", "a/b/c", "a/b/c:", "b", "z/", "zz", "A", "q/"} {
		var want []string
		for _, k := range sorted {
			if strings.HasPrefix(k, prefix) {
				want = append(want, k)
			}
		}
		for _, limit := range []int{1, 2, 100} {
			got := listAll(t, ctx, s, prefix, limit)
			if !slices.Equal(got, want) {
				t.Errorf("List %q by pages of %d:\n got %q\nwant %q", prefix, limit, got, want)
			}
		}
	}
}

func listAll(t *testing.T, ctx context.Context, s *ap.Store, prefix string, limit int) []string {
	t.Helper()
	return listAllFrom(t, ctx, s, prefix, "", limit)
}

func listAllFrom(t *testing.T, ctx context.Context, s *ap.Store, prefix, cursor string, limit int) []string {
	t.Helper()
	var all []string
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatalf("List %q: more than 1000 pages", prefix)
		}
		page, err := s.List(ctx, prefix, cursor, limit)
		must(t, "List", err)
		if limit > 0 && len(page.Keys) > limit {
			t.Fatalf("List %q with limit %d returned %d keys", prefix, limit, len(page.Keys))
		}
		if page.Next != "" && len(page.Keys) == 0 {
			t.Fatalf("List %q returned an empty page with a next cursor %q", prefix, page.Next)
		}
		all = append(all, page.Keys...)
		if page.Next == "" {
			return all
		}
		cursor = page.Next
	}
}

func testValueSizes(t *testing.T, e *env) {
	s, ctx := e.store, e.ctx()
	every := make([]byte, 512)
	for i := range every {
		every[i] = byte(i)
	}
	largest := make([]byte, ap.MaxStoreValue)
	_, _ = rand.Read(largest)
	for _, c := range []struct {
		name  string
		value []byte
	}{
		{"nil", nil}, {"empty", []byte{}}, {"zero", []byte{0}}, {"every-byte", every},
		{"not-utf8", []byte{0xff, 0xfe, 0xc3, 0x28}}, {"largest", largest},
	} {
		rev, err := s.Create(ctx, c.name, c.value, 0)
		must(t, "Create "+c.name, err)
		v, _, err := s.Get(ctx, c.name)
		must(t, "Get "+c.name, err)
		if !bytes.Equal(v, c.value) {
			t.Errorf("%s: Get returned %d bytes that differ from the %d written", c.name, len(v), len(c.value))
		}
		flipped := slices.Clone(c.value)
		for i := range flipped {
			flipped[i] ^= 0x5a
		}
		_, err = s.Update(ctx, c.name, flipped, rev, 0)
		must(t, "Update "+c.name, err)
		v, _, err = s.Get(ctx, c.name)
		must(t, "Get "+c.name, err)
		if !bytes.Equal(v, flipped) {
			t.Errorf("%s: Get after Update returned %d bytes that differ from the %d written", c.name, len(v), len(flipped))
		}
	}
	// The value Get returned is the caller's.
	v, _, err := s.Get(ctx, "every-byte")
	must(t, "Get", err)
	clear(v)
	if v2, _, _ := s.Get(ctx, "every-byte"); bytes.Equal(v2, v) {
		t.Errorf("changing the value Get returned changed the store")
	}
	_, err = s.Create(ctx, "too-large", make([]byte, ap.MaxStoreValue+1), 0)
	is(t, "Create of a value one byte over the limit", err, ap.ErrValueTooLarge)
}

// spy counts the calls that reach a store.
type spy struct {
	driver.Store
	mu    sync.Mutex
	calls []string
}

func (s *spy) note(op string) {
	s.mu.Lock()
	s.calls = append(s.calls, op)
	s.mu.Unlock()
}

func (s *spy) Get(ctx context.Context, key string) ([]byte, string, error) {
	s.note("Get " + key)
	return s.Store.Get(ctx, key)
}

func (s *spy) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	s.note("Create " + key)
	return s.Store.Create(ctx, key, value, ttl)
}

func (s *spy) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	s.note("Update " + key)
	return s.Store.Update(ctx, key, value, rev, ttl)
}

func (s *spy) Delete(ctx context.Context, key, rev string) error {
	s.note("Delete " + key)
	return s.Store.Delete(ctx, key, rev)
}

func (s *spy) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	s.note("List " + prefix)
	return s.Store.List(ctx, prefix, after, limit)
}

func testLimitsRefused(t *testing.T, e *env) {
	sp := &spy{Store: e.raw}
	s, ctx := e.in(sp), e.ctx()
	longest := strings.Repeat("k", ap.MaxStoreKey)
	badKeys := []string{"", "/a", "a/", "a//b", "a b", "a\x00", "é", "a*", "a?b", "a\\b", "a%2F", longest + "k", "a\nb"}
	for _, k := range badKeys {
		_, _, err := s.Get(ctx, k)
		is(t, fmt.Sprintf("Get %q", k), err, ap.ErrBadKey)
		_, err = s.Create(ctx, k, nil, 0)
		is(t, fmt.Sprintf("Create %q", k), err, ap.ErrBadKey)
		_, err = s.Update(ctx, k, nil, "1", 0)
		is(t, fmt.Sprintf("Update %q", k), err, ap.ErrBadKey)
		is(t, fmt.Sprintf("Delete %q", k), s.Delete(ctx, k, ""), ap.ErrBadKey)
		if k != "" {
			_, err = s.List(ctx, "", k, 10)
			is(t, fmt.Sprintf("List after the cursor %q", k), err, ap.ErrBadKey)
		}
	}
	for _, p := range []string{"/", "/a", "a//", "a b", "a*", longest + "/"} {
		_, err := s.List(ctx, p, "", 10)
		is(t, fmt.Sprintf("List %q", p), err, ap.ErrBadKey)
	}
	for _, ttl := range []time.Duration{-1, -time.Hour, time.Nanosecond, ap.MinStoreTTL - 1, ap.MaxStoreTTL + 1} {
		_, err := s.Create(ctx, "k", nil, ttl)
		is(t, fmt.Sprintf("Create with the TTL %v", ttl), err, ap.ErrBadTTL)
		_, err = s.Update(ctx, "k", nil, "1", ttl)
		is(t, fmt.Sprintf("Update with the TTL %v", ttl), err, ap.ErrBadTTL)
	}
	_, err := s.Create(ctx, "k", make([]byte, ap.MaxStoreValue+1), 0)
	is(t, "Create of a value over the limit", err, ap.ErrValueTooLarge)
	_, err = s.Update(ctx, "k", make([]byte, ap.MaxStoreValue+1), "1", 0)
	is(t, "Update of a value over the limit", err, ap.ErrValueTooLarge)
	_, err = s.Update(ctx, "k", nil, "", 0)
	is(t, "Update at an empty revision", err, ap.ErrRevision)
	_, err = s.Update(ctx, "k", nil, strings.Repeat("1", driver.MaxRevisionLen+1), 0)
	is(t, "Update at a revision longer than any", err, ap.ErrRevision)
	sp.mu.Lock()
	calls := sp.calls
	sp.mu.Unlock()
	if len(calls) > 0 {
		t.Errorf("refused input reached the store: %q", calls)
	}

	// Right at the limits, everything goes through.
	rev, err := s.Create(ctx, longest, nil, ap.MaxStoreTTL)
	must(t, "Create of the longest key with the longest TTL", err)
	_, err = s.Update(ctx, longest, nil, rev, ap.MinStoreTTL)
	must(t, "Update with the shortest TTL", err)
	_, err = s.Create(ctx, "ttl/rounded", nil, time.Nanosecond+ap.MinStoreTTL) // rounded up to 2ms
	must(t, "Create with a TTL that is not whole milliseconds", err)
	if _, err := ap.NewStore(e.raw, "_platform"); !errors.Is(err, ap.ErrBadKey) {
		t.Errorf("NewStore with a namespace starting with '_': %v, want ErrBadKey", err)
	}
	if _, err := ap.NewStore(e.raw, "a/b"); !errors.Is(err, ap.ErrBadKey) {
		t.Errorf("NewStore with the namespace \"a/b\": %v, want ErrBadKey", err)
	}
	var zero ap.Store
	if _, _, err := zero.Get(ctx, "k"); err == nil {
		t.Errorf("Get on the zero Store succeeded")
	}
}

// testLongestKey gives the store keys of MaxStoreKeyLen bytes, the longest
// the portable layer and a companion's prefix can make.
func testLongestKey(t *testing.T, e *env) {
	ctx := e.ctx()
	base := e.ns + "/" + strings.Repeat("a/", 40)
	keys := []string{
		base + strings.Repeat("x", driver.MaxStoreKeyLen-len(base)),
		base + strings.Repeat("y", driver.MaxStoreKeyLen-len(base)-1),
		base + strings.Repeat(".", driver.MaxStoreKeyLen-len(base)),
	}
	for _, k := range keys {
		if err := driver.CheckKey(strings.TrimPrefix(k, e.ns+"/")[:ap.MaxStoreKey]); err != nil {
			t.Fatalf("test key: %v", err)
		}
		rev, err := e.raw.Create(ctx, k, []byte("v"), 0)
		must(t, fmt.Sprintf("Create of a %d-byte key", len(k)), err)
		v, r, err := e.raw.Get(ctx, k)
		if err != nil || string(v) != "v" || r != rev {
			t.Fatalf("Get of a %d-byte key = %q at %q, %v", len(k), v, r, err)
		}
	}
	got, err := e.raw.List(ctx, base, "", 10)
	must(t, "List", err)
	want := slices.Clone(keys)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("List of the longest keys:\n got %q\nwant %q", got, want)
	}
	for _, k := range keys {
		must(t, "Delete", e.raw.Delete(ctx, k, ""))
	}
}

func testNamespaces(t *testing.T, e *env) {
	ctx := e.ctx()
	other, err := ap.NewStore(e.raw, e.ns+"-other")
	must(t, "NewStore", err)
	t.Cleanup(func() { e.clean(other) })
	_, err = e.store.Create(ctx, "k", []byte("mine"), 0)
	must(t, "Create", err)
	if _, _, err := other.Get(ctx, "k"); !errors.Is(err, ap.ErrKeyNotFound) {
		t.Fatalf("another namespace sees the key: %v", err)
	}
	_, err = other.Create(ctx, "k", []byte("theirs"), 0)
	must(t, "Create in another namespace", err)
	page, err := e.store.List(ctx, "", "", 10)
	must(t, "List", err)
	if !slices.Equal(page.Keys, []string{"k"}) {
		t.Fatalf("List shows %q, want only this namespace's [k]", page.Keys)
	}
	if v, _, err := e.store.Get(ctx, "k"); err != nil || string(v) != "mine" {
		t.Fatalf("Get = %q, %v; want this namespace's value", v, err)
	}
}

// testRestart writes keys to a server of the test's own, restarts it, and
// requires them back as they were.
func testRestart(t *testing.T, e *env) {
	if e.opts.Restart == nil {
		if e.opts.NoRestart == "" {
			t.Fatal("the store declares neither Options.Restart nor, with a reason, Options.NoRestart")
		}
		t.Skipf("not run on this store: %s", e.opts.NoRestart)
	}
	mk, restart := e.opts.Restart(t)
	e.make = mk
	s := e.in(e.connect())
	ctx := e.ctx()
	long := e.scaled(time.Minute)
	short := e.scaled(1500 * time.Millisecond)
	rPlain, err := s.Create(ctx, "plain", []byte("p"), 0)
	must(t, "Create plain", err)
	rLong, err := s.Create(ctx, "long", []byte("l"), long)
	must(t, "Create long", err)
	rShort, err := s.Create(ctx, "short", []byte("s"), short)
	must(t, "Create short", err)
	written := time.Now()
	rGone, err := s.Create(ctx, "gone", []byte("g"), 0)
	must(t, "Create gone", err)
	must(t, "Delete gone", s.Delete(ctx, "gone", rGone))
	before := map[string]string{rPlain: "plain", rLong: "long", rShort: "short", rGone: "gone"}

	restart(t)

	s = e.in(e.connect())
	deadline := time.Now().Add(e.opts.Wait)
	for { // the server may take a moment to take requests
		actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _, err = s.Get(actx, "plain")
		cancel()
		if err == nil || errors.Is(err, ap.ErrKeyNotFound) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx = e.ctx()
	for _, c := range []struct{ key, value, rev string }{{"plain", "p", rPlain}, {"long", "l", rLong}} {
		v, rev, err := s.Get(ctx, c.key)
		if err != nil || string(v) != c.value || rev != c.rev {
			t.Errorf("after the restart, %s = %q at %q (%v); want %q at %q", c.key, v, rev, err, c.value, c.rev)
		}
	}
	if _, _, err := s.Get(ctx, "gone"); !errors.Is(err, ap.ErrKeyNotFound) {
		t.Errorf("after the restart, the deleted key: %v, want ErrKeyNotFound", err)
	}
	// Revisions given after the restart are new: a store that counts them
	// in memory, or in a counter the restart lost, gives old ones again.
	rPlain2, err := s.Update(ctx, "plain", []byte("p2"), rPlain, 0)
	must(t, "Update at the revision from before the restart", err)
	rFresh, err := s.Create(ctx, "fresh", []byte("f"), 0)
	must(t, "Create after the restart", err)
	for what, rev := range map[string]string{"Update of plain": rPlain2, "Create of a new key": rFresh} {
		if k, dup := before[rev]; dup {
			t.Errorf("after the restart, the %s returned the revision %q, given to %s before it", what, rev, k)
		}
	}
	_, err = s.Update(ctx, "plain", []byte("p3"), rPlain, 0)
	is(t, "Update at the revision from before the restart, after a newer write", err, ap.ErrRevision)
	_, err = s.Create(ctx, "plain", nil, 0)
	is(t, "Create of a key from before the restart", err, ap.ErrKeyExists)
	e.gone(t, s, "short", written, short, "after the restart, a key past its TTL")
	e.clean(s)
}

// gone checks that key, written at written with a TTL of ttl, is gone once
// the TTL has passed: one read, which must miss (a store decides expiry
// when a key is read, by its own clock, so no load makes that read early).
// A key still there is a failure; the check then also says how much later
// it went, if it went within a few seconds.
func (e *env) gone(t *testing.T, s *ap.Store, key string, written time.Time, ttl time.Duration, what string) {
	t.Helper()
	ctx := e.ctx()
	time.Sleep(time.Until(written.Add(ttl + e.scaled(100*time.Millisecond))))
	_, _, err := s.Get(ctx, key)
	if errors.Is(err, ap.ErrKeyNotFound) {
		return
	}
	read := time.Since(written)
	for err == nil && time.Since(written) < ttl+e.scaled(5*time.Second) {
		time.Sleep(e.scaled(20 * time.Millisecond))
		_, _, err = s.Get(ctx, key)
	}
	later := "it was still there 5 s later"
	if errors.Is(err, ap.ErrKeyNotFound) {
		later = fmt.Sprintf("it went %v after its write", time.Since(written).Round(time.Millisecond))
	}
	t.Errorf("%s (TTL %v) was still there when read %v after its write (%v): %s", what, ttl, read.Round(time.Millisecond), err, later)
}

// testCompareAndSwap pins down the parts of compare-and-swap a store can get
// half right: an Update writing the value already there still gives a new
// revision, and a stale revision fails whatever the value written (no ABA);
// another key's revision never matches, even at the same count of writes;
// and, on the driver itself (the portable layer hides both), a value is
// the caller's to keep, and List returns no more than limit keys.
func testCompareAndSwap(t *testing.T, e *env) {
	s, ctx := e.store, e.ctx()
	r1, err := s.Create(ctx, "same", []byte("v"), 0)
	must(t, "Create", err)
	r2, err := s.Update(ctx, "same", []byte("v"), r1, 0)
	must(t, "Update writing the unchanged value", err)
	if r2 == r1 {
		t.Errorf("an Update writing the unchanged value returned the revision it was given (%q): every write gives the key a new revision", r1)
	}
	_, err = s.Update(ctx, "same", []byte("v"), r1, 0)
	is(t, "Update at a stale revision writing the unchanged value", err, ap.ErrRevision)
	is(t, "Delete at a stale revision of a key whose value is unchanged", s.Delete(ctx, "same", r1), ap.ErrRevision)
	// A → B → A: the first A's revision is stale.
	r3, err := s.Update(ctx, "same", []byte("w"), r2, 0)
	must(t, "Update", err)
	_, err = s.Update(ctx, "same", []byte("v"), r3, 0)
	must(t, "Update back to the first value", err)
	_, err = s.Update(ctx, "same", []byte("x"), r2, 0)
	is(t, "Update at the revision of an earlier write of the same value (A, B, A again)", err, ap.ErrRevision)
	if v, _, err := s.Get(ctx, "same"); err != nil || string(v) != "v" {
		t.Errorf("after the refused writes Get = %q, %v; want %q", v, err, "v")
	}

	// Keys written as often as each other: one's revision is not the other's.
	for i := range 3 {
		a, b := fmt.Sprintf("a/%d", i), fmt.Sprintf("b/%d", i)
		ra, err := s.Create(ctx, a, []byte("v"), 0)
		must(t, "Create "+a, err)
		rb, err := s.Create(ctx, b, []byte("v"), 0)
		must(t, "Create "+b, err)
		_, err = s.Update(ctx, a, []byte("x"), rb, 0)
		is(t, fmt.Sprintf("Update of %s at the revision of %s, written as often", a, b), err, ap.ErrRevision)
		is(t, fmt.Sprintf("Delete of %s at the revision of %s, written as often", b, a), s.Delete(ctx, b, ra), ap.ErrRevision)
	}

	// The driver itself: values are the caller's to keep.
	raw, key := e.raw, e.ns+"/owned"
	t.Cleanup(func() { _ = raw.Delete(context.Background(), key, "") })
	buf := []byte("mine")
	_, err = raw.Create(ctx, key, buf, 0)
	must(t, "Create", err)
	buf[0] = 'X'
	v, _, err := raw.Get(ctx, key)
	must(t, "Get", err)
	if string(v) != "mine" {
		t.Errorf("a caller changed the slice it gave Create afterwards, and Get returned %q: the store must keep a copy", v)
	}
	if len(v) > 0 {
		v[0] = 'Y'
	}
	if again, _, err := raw.Get(ctx, key); err != nil || string(again) != "mine" {
		t.Errorf("a caller changed the value Get returned, and the next Get returned %q (%v): the value Get returns is the caller's to keep", again, err)
	}

	// The driver itself: List returns at most limit keys.
	var lim []string
	for i := range 4 {
		k := fmt.Sprintf("%s/lim/%d", e.ns, i)
		_, err := raw.Create(ctx, k, nil, 0)
		must(t, "Create", err)
		lim = append(lim, k)
	}
	t.Cleanup(func() {
		for _, k := range lim {
			_ = raw.Delete(context.Background(), k, "")
		}
	})
	for _, limit := range []int{1, 2, 3} {
		got, err := raw.List(ctx, e.ns+"/lim/", "", limit)
		must(t, "List", err)
		if !slices.Equal(got, lim[:limit]) {
			t.Errorf("driver List with limit %d of 4 keys returned %q, want %q", limit, got, lim[:limit])
		}
	}
}

// testBatch drives the batch helpers of the driver package (GetEach,
// CreateEach, DeleteEach, ListEach, CountKeys) on the raw store: through its
// StoreBatcher and StoreCounter when it has them, else through their
// fallback. Each item must behave as its single call: a Create of a
// present key refused and the others made, a Delete at a stale revision
// refused and the others done, a Get of an absent key not found; and a
// count must be the number of keys a listing finds.
func testBatch(t *testing.T, e *env) {
	s, ctx := e.raw, e.ctx()
	key := func(i int) string { return e.ns + "/b/" + strconv.Itoa(i) }
	must(t, "Create", func() error { _, err := s.Create(ctx, key(0), []byte("old"), 0); return err }())
	items := make([]driver.BatchItem, 5)
	for i := range items {
		items[i] = driver.BatchItem{Key: key(i), Value: []byte("v" + strconv.Itoa(i))}
	}
	items[4].TTL = e.scaled(time.Hour)
	made, err := driver.CreateEach(ctx, s, items)
	must(t, "CreateEach", err)
	if len(made) != len(items) {
		t.Fatalf("CreateEach gave %d results for %d items", len(made), len(items))
	}
	if !errors.Is(made[0].Err, driver.ErrKeyExists) {
		t.Errorf("CreateEach of a present key: got %v, want ErrKeyExists", made[0].Err)
	}
	for i, r := range made[1:] {
		if r.Err != nil || r.Rev == "" {
			t.Errorf("CreateEach item %d: rev %q, error %v; want a revision", i+1, r.Rev, r.Err)
		}
	}
	keys := []string{key(0), key(1), key(4), key(9)}
	got, err := driver.GetEach(ctx, s, keys)
	must(t, "GetEach", err)
	want := []string{"old", "v1", "v4", ""}
	for i, r := range got {
		if i == 3 {
			if !errors.Is(r.Err, driver.ErrKeyNotFound) {
				t.Errorf("GetEach of an absent key: got %v, want ErrKeyNotFound", r.Err)
			}
			continue
		}
		v, rev, gerr := s.Get(ctx, keys[i])
		if r.Err != nil || string(r.Value) != want[i] || gerr != nil || r.Rev != rev || string(v) != want[i] {
			t.Errorf("GetEach of %s = %q at %q (%v); Get = %q at %q (%v); want %q", keys[i], r.Value, r.Rev, r.Err, v, rev, gerr, want[i])
		}
	}
	lists, err := driver.ListEach(ctx, s, []string{e.ns + "/b/", e.ns + "/none/", e.ns + "/b/4"}, 3)
	must(t, "ListEach", err)
	if len(lists) != 3 || !slices.Equal(lists[0], []string{key(0), key(1), key(2)}) || len(lists[1]) != 0 || !slices.Equal(lists[2], []string{key(4)}) {
		t.Errorf("ListEach of three prefixes, 3 keys each = %q; want the first 3 keys, none, and %s", lists, key(4))
	}
	n, err := driver.CountKeys(ctx, s, e.ns+"/b/")
	must(t, "CountKeys", err)
	if n != 5 {
		t.Errorf("CountKeys = %d, want 5", n)
	}
	r1, err := s.Update(ctx, key(1), []byte("new"), made[1].Rev, 0)
	must(t, "Update", err)
	dels := []driver.BatchItem{
		{Key: key(1), Rev: made[1].Rev}, // stale
		{Key: key(2), Rev: made[2].Rev},
		{Key: key(3)},
		{Key: key(8)},                   // absent, no revision
		{Key: key(9), Rev: neverIssued}, // absent, at a revision
	}
	res, err := driver.DeleteEach(ctx, s, dels)
	must(t, "DeleteEach", err)
	for i, r := range res {
		stale := i == 0 || i == 4
		if stale != errors.Is(r.Err, driver.ErrRevision) || !stale && r.Err != nil {
			t.Errorf("DeleteEach of %s at %q: got %v, want ErrRevision: %v", dels[i].Key, dels[i].Rev, r.Err, stale)
		}
	}
	for i, k := range []string{key(1), key(2), key(3)} {
		_, rev, err := s.Get(ctx, k)
		if i == 0 && (err != nil || rev != r1) || i > 0 && !errors.Is(err, driver.ErrKeyNotFound) {
			t.Errorf("Get of %s after DeleteEach: rev %q, error %v", k, rev, err)
		}
	}
	n, err = driver.CountKeys(ctx, s, e.ns+"/b/")
	must(t, "CountKeys", err)
	if n != 3 {
		t.Errorf("CountKeys after DeleteEach = %d, want 3", n)
	}
	if _, err := driver.CreateEach(ctx, s, []driver.BatchItem{{Key: key(5)}, {Key: key(5)}}); err == nil {
		t.Errorf("CreateEach with a key twice: no error")
	}
}

// testUpdateEach drives driver.UpdateEach on the raw store: through its
// StoreBatchUpdater when it has one, else through the fallback. Each item
// behaves as its single Update: written, with a new revision that Get
// then gives, when the key is at the item's revision; ErrRevision and the
// key left as it was when it was written since, or is absent. Each write
// sets its item's TTL; the helper refuses an item without a revision and a
// key twice before calling the store.
func testUpdateEach(t *testing.T, e *env) {
	s, ctx := e.raw, e.ctx()
	key := func(i int) string { return e.ns + "/ue/" + strconv.Itoa(i) }
	revs := make([]string, 4)
	for i := range revs {
		var err error
		revs[i], err = s.Create(ctx, key(i), []byte("old"+strconv.Itoa(i)), 0)
		must(t, "Create", err)
	}
	moved, err := s.Update(ctx, key(1), []byte("moved"), revs[1], 0)
	must(t, "Update", err)
	ttl := e.scaled(300 * time.Millisecond)
	items := []driver.BatchItem{
		{Key: key(0), Value: []byte("new0"), Rev: revs[0]},
		{Key: key(1), Value: []byte("new1"), Rev: revs[1]}, // stale
		{Key: key(2), Value: []byte("new2"), Rev: revs[2], TTL: ttl},
		{Key: key(9), Value: []byte("new9"), Rev: neverIssued}, // absent
	}
	res, err := driver.UpdateEach(ctx, s, items)
	must(t, "UpdateEach", err)
	if len(res) != len(items) {
		t.Fatalf("UpdateEach gave %d results for %d items", len(res), len(items))
	}
	for i, r := range res {
		stale := i == 1 || i == 3
		if stale != errors.Is(r.Err, driver.ErrRevision) || !stale && (r.Err != nil || r.Rev == "" || r.Rev == items[i].Rev) {
			t.Errorf("UpdateEach of %s at %q: rev %q, error %v; want ErrRevision: %v, else a new revision", items[i].Key, items[i].Rev, r.Rev, r.Err, stale)
		}
	}
	want := []struct{ value, rev string }{{"new0", res[0].Rev}, {"moved", moved}, {"new2", res[2].Rev}, {"old3", revs[3]}}
	for i, w := range want {
		v, rev, err := s.Get(ctx, key(i))
		if err != nil || string(v) != w.value || rev != w.rev {
			t.Errorf("Get of %s after UpdateEach = %q at %q (%v); want %q at %q", key(i), v, rev, err, w.value, w.rev)
		}
	}
	if _, _, err := s.Get(ctx, key(9)); !errors.Is(err, driver.ErrKeyNotFound) {
		t.Errorf("Get of %s, absent, after an UpdateEach of it: %v, want ErrKeyNotFound", key(9), err)
	}
	if again, err := driver.UpdateEach(ctx, s, []driver.BatchItem{{Key: key(0), Value: []byte("x"), Rev: revs[0]}}); err != nil || !errors.Is(again[0].Err, driver.ErrRevision) {
		t.Errorf("UpdateEach at the revision it replaced: %v, %v; want ErrRevision", again, err)
	}
	if _, err := driver.UpdateEach(ctx, s, []driver.BatchItem{{Key: key(3), Value: []byte("x")}}); err == nil {
		t.Error("UpdateEach of an item without a revision: no error")
	}
	if _, err := driver.UpdateEach(ctx, s, []driver.BatchItem{{Key: key(3), Rev: revs[3]}, {Key: key(3), Rev: revs[3]}}); err == nil {
		t.Error("UpdateEach with a key twice: no error")
	}
	deadline := time.Now().Add(e.scaled(30 * time.Second))
	for {
		_, _, err := s.Get(ctx, key(2))
		if errors.Is(err, driver.ErrKeyNotFound) {
			break
		}
		must(t, "Get", err)
		if time.Now().After(deadline) {
			t.Fatalf("%s, written by UpdateEach with a TTL of %v, still present 30s later", key(2), ttl)
		}
		time.Sleep(e.scaled(20 * time.Millisecond))
	}
	if _, _, err := s.Get(ctx, key(0)); err != nil {
		t.Errorf("Get of %s, written by UpdateEach without a TTL: %v", key(0), err)
	}
}

// testDeleteValue drives driver.DeleteValue on the raw store: through its
// StoreValueDeleter when it has one, else through the fallback. A key is
// removed only at its revision with exactly the value given: another
// value (one byte more, one byte less, one byte changed), a stale
// revision, an absent key each give ErrRevision and leave the store as it
// was.
func testDeleteValue(t *testing.T, e *env) {
	s, ctx := e.raw, e.ctx()
	key := e.ns + "/dv/k"
	val := []byte("\x00token-of-22-bytes-xxxjob-1")
	rev, err := s.Create(ctx, key, val, e.scaled(time.Hour))
	must(t, "Create", err)
	for name, v := range map[string][]byte{
		"longer":  append(slices.Clone(val), 'x'),
		"shorter": val[:len(val)-1],
		"changed": append(slices.Clone(val[:len(val)-1]), 'X'),
	} {
		if err := driver.DeleteValue(ctx, s, key, rev, v); !errors.Is(err, driver.ErrRevision) {
			t.Errorf("DeleteValue with a %s value: %v, want ErrRevision", name, err)
		}
	}
	if err := driver.DeleteValue(ctx, s, key, neverIssued, val); !errors.Is(err, driver.ErrRevision) {
		t.Errorf("DeleteValue at another revision: %v, want ErrRevision", err)
	}
	if err := driver.DeleteValue(ctx, s, e.ns+"/dv/absent", rev, val); !errors.Is(err, driver.ErrRevision) {
		t.Errorf("DeleteValue of an absent key: %v, want ErrRevision", err)
	}
	if v, cur, err := s.Get(ctx, key); err != nil || cur != rev || !bytes.Equal(v, val) {
		t.Fatalf("after refused DeleteValues: %q at %q (%v); want the key untouched", v, cur, err)
	}
	must(t, "DeleteValue", driver.DeleteValue(ctx, s, key, rev, val))
	if _, _, err := s.Get(ctx, key); !errors.Is(err, driver.ErrKeyNotFound) {
		t.Errorf("Get after DeleteValue: %v, want ErrKeyNotFound", err)
	}
}

// testDeleteValueAnyRev: DeleteValue with an empty revision removes a key
// at whatever revision it is, only when it holds exactly the value given.
func testDeleteValueAnyRev(t *testing.T, e *env) {
	s, ctx := e.raw, e.ctx()
	key := e.ns + "/dva/k"
	val := []byte("\x00token-of-22-bytes-yyyjob-2")
	rev, err := s.Create(ctx, key, val, e.scaled(time.Hour))
	must(t, "Create", err)
	rev, err = s.Update(ctx, key, val, rev, e.scaled(time.Hour)) // a revision of its own, not the first
	must(t, "Update", err)
	if err := driver.DeleteValue(ctx, s, key, "", append(slices.Clone(val[:len(val)-1]), 'X')); !errors.Is(err, driver.ErrRevision) {
		t.Errorf("DeleteValue at any revision with another value: %v, want ErrRevision", err)
	}
	if err := driver.DeleteValue(ctx, s, e.ns+"/dva/absent", "", val); !errors.Is(err, driver.ErrRevision) {
		t.Errorf("DeleteValue at any revision of an absent key: %v, want ErrRevision", err)
	}
	if v, cur, err := s.Get(ctx, key); err != nil || cur != rev || !bytes.Equal(v, val) {
		t.Fatalf("after refused DeleteValues: %q at %q (%v); want the key untouched", v, cur, err)
	}
	must(t, "DeleteValue at any revision", driver.DeleteValue(ctx, s, key, "", val))
	if _, _, err := s.Get(ctx, key); !errors.Is(err, driver.ErrKeyNotFound) {
		t.Errorf("Get after DeleteValue at any revision: %v, want ErrKeyNotFound", err)
	}
}

// testDeleteValueEach drives driver.DeleteValueEach on the raw store:
// through its StoreBatchValueDeleter when it has one, else through the
// fallback. Each item behaves as its single DeleteValue: the key removed
// when it holds exactly the item's value at the item's revision (any,
// when empty); ErrRevision and the key untouched for another value, a
// stale revision or an absent key. A key twice is refused before the
// store is called.
func testDeleteValueEach(t *testing.T, e *env) {
	s, ctx := e.raw, e.ctx()
	key := func(i int) string { return e.ns + "/dve/" + strconv.Itoa(i) }
	val := func(i int) []byte { return []byte("\x00token-of-22-bytes-zzzjob-" + strconv.Itoa(i)) }
	revs := make([]string, 4)
	for i := range revs {
		var err error
		revs[i], err = s.Create(ctx, key(i), val(i), e.scaled(time.Hour))
		must(t, "Create", err)
	}
	moved, err := s.Update(ctx, key(1), val(1), revs[1], e.scaled(time.Hour)) // a revision of its own
	must(t, "Update", err)
	items := []driver.BatchItem{
		{Key: key(0), Value: val(0), Rev: revs[0]},                            // removed
		{Key: key(1), Value: val(1)},                                          // removed, at any revision
		{Key: key(2), Value: append(slices.Clone(val(2)), 'x'), Rev: revs[2]}, // another value
		{Key: key(3), Value: val(3), Rev: neverIssued},                        // another revision
		{Key: key(9), Value: val(9)},                                          // absent
	}
	res, err := driver.DeleteValueEach(ctx, s, items)
	must(t, "DeleteValueEach", err)
	if len(res) != len(items) {
		t.Fatalf("DeleteValueEach gave %d results for %d items", len(res), len(items))
	}
	for i, r := range res {
		refused := i >= 2
		if refused != errors.Is(r.Err, driver.ErrRevision) || !refused && r.Err != nil {
			t.Errorf("DeleteValueEach of %s at %q: %v; want ErrRevision: %v, else nil", items[i].Key, items[i].Rev, r.Err, refused)
		}
	}
	for i := range 2 {
		if _, _, err := s.Get(ctx, key(i)); !errors.Is(err, driver.ErrKeyNotFound) {
			t.Errorf("Get of %s after DeleteValueEach removed it: %v, want ErrKeyNotFound", key(i), err)
		}
	}
	for i := 2; i < 4; i++ {
		if v, cur, err := s.Get(ctx, key(i)); err != nil || cur != revs[i] || !bytes.Equal(v, val(i)) {
			t.Errorf("Get of %s after a refused DeleteValueEach = %q at %q (%v); want it untouched", key(i), v, cur, err)
		}
	}
	if again, err := driver.DeleteValueEach(ctx, s, []driver.BatchItem{{Key: key(1), Value: val(1), Rev: moved}}); err != nil || !errors.Is(again[0].Err, driver.ErrRevision) {
		t.Errorf("DeleteValueEach of a key removed: %v, %v; want ErrRevision", again, err)
	}
	if _, err := driver.DeleteValueEach(ctx, s, []driver.BatchItem{{Key: key(2), Value: val(2)}, {Key: key(2), Value: val(2)}}); err == nil {
		t.Error("DeleteValueEach with a key twice: no error")
	}
}
