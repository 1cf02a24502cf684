package reference

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// StoreMutation names one rule of driver.Store that a Store breaks.
type StoreMutation string

// The store mutations. Each breaks one rule of driver.Store, as a store's
// author might by mistake, several of them only in part (for an unchanged
// value, for another key, late, at a page's edge); StoreMutations says
// which rule and which cases of conformance/storetest catch it.
const (
	SameValueABA       StoreMutation = "SameValueABA"       // an Update at a stale revision succeeds when it writes the value already there
	SameValueKeepsRev  StoreMutation = "SameValueKeepsRev"  // an Update writing the value already there keeps the revision
	RevisionPerKey     StoreMutation = "RevisionPerKey"     // revisions count per key, so another key's revision can match
	RevisionPerLife    StoreMutation = "RevisionPerLife"    // a key's revisions start again after a Delete
	CreateOverwrites   StoreMutation = "CreateOverwrites"   // Create replaces a present key
	CreateRace         StoreMutation = "CreateRace"         // Create checks, then writes, outside one atomic step
	UpdateRace         StoreMutation = "UpdateRace"         // Update compares, then writes, outside one atomic step
	DeleteIgnoresRev   StoreMutation = "DeleteIgnoresRev"   // Delete at a stale revision deletes
	DeleteAbsentFails  StoreMutation = "DeleteAbsentFails"  // Delete without a revision of an absent key returns ErrKeyNotFound
	TTLIgnored         StoreMutation = "TTLIgnored"         // keys never expire
	TTLHalf            StoreMutation = "TTLHalf"            // keys expire at half their TTL
	TTLLate            StoreMutation = "TTLLate"            // keys expire 250 ms after their TTL
	TTLWholeSeconds    StoreMutation = "TTLWholeSeconds"    // TTLs are cut to whole seconds (EX where PX was meant)
	UpdateKeepsTTL     StoreMutation = "UpdateKeepsTTL"     // an Update without a TTL leaves the old one
	UpdateKeepsExpiry  StoreMutation = "UpdateKeepsExpiry"  // an Update with a TTL of a key that has one keeps its old expiry
	ExpiredListed      StoreMutation = "ExpiredListed"      // List shows expired keys
	ExpiredUpdatable   StoreMutation = "ExpiredUpdatable"   // an Update at the revision of an expired key brings it back
	ListUnsorted       StoreMutation = "ListUnsorted"       // List returns keys in the order they were created
	ListIncludesAfter  StoreMutation = "ListIncludesAfter"  // List starts at after, not after it
	ListShortPage      StoreMutation = "ListShortPage"      // List returns one key fewer than limit when more remain
	KeysOverLimit      StoreMutation = "KeysOverLimit"      // List returns one key more than limit
	ListSegmentPrefix  StoreMutation = "ListSegmentPrefix"  // a prefix matches whole segments only ("a/b" misses "a/bc")
	ListPrefixAfterCut StoreMutation = "ListPrefixAfterCut" // with after set, List ignores the prefix
	ValueAliased       StoreMutation = "ValueAliased"       // Create keeps the caller's slice, and Get hands out the stored one
	ValueTruncated     StoreMutation = "ValueTruncated"     // values are cut to 32 KiB
)

// StoreEntry is one store mutation with the rule it breaks and the cases
// that must catch it.
type StoreEntry struct {
	Mutation StoreMutation
	Rule     string   // the rule broken, in driver.Store's words
	Cases    []string // the storetest cases expected to fail (at least one must)
}

// StoreMutations lists every store mutation.
var StoreMutations = []StoreEntry{
	{SameValueABA, "Update at a revision is compare-and-swap with no ABA: a stale revision fails, whatever the value written",
		[]string{"Revision/CompareAndSwap"}},
	{SameValueKeepsRev, "every write gives the key a new revision, an unchanged value's too",
		[]string{"Revision/CompareAndSwap"}},
	{RevisionPerKey, "a revision from another key is not the key's revision: ErrRevision",
		[]string{"Revision/CompareAndSwap"}},
	{RevisionPerLife, "a revision is never given to the key before, not even by an earlier life of the key",
		[]string{"Revision/NeverReused"}},
	{CreateOverwrites, "Create returns ErrKeyExists when the key is present",
		[]string{"Basic/CreateGetUpdateDelete"}},
	{CreateRace, "a Create race has one winner",
		[]string{"Create/RaceConnections"}},
	{UpdateRace, "of concurrent Updates at one revision one succeeds",
		[]string{"CAS/Contention"}},
	{DeleteIgnoresRev, "Delete at a revision removes the key only when it is present at that revision",
		[]string{"Basic/CreateGetUpdateDelete"}},
	{DeleteAbsentFails, "deleting an absent key without a revision is not an error",
		[]string{"Basic/CreateGetUpdateDelete"}},
	{TTLIgnored, "a key is absent as soon as its TTL has passed",
		[]string{"TTL/Expiry"}},
	{TTLHalf, "a key is present for at least its TTL",
		[]string{"TTL/Expiry"}},
	{TTLLate, "a key is absent as soon as its TTL has passed, not a moment later",
		[]string{"TTL/Expiry"}},
	{TTLWholeSeconds, "a TTL is a whole number of milliseconds",
		[]string{"TTL/Expiry"}},
	{UpdateKeepsTTL, "each write sets the key's TTL anew: an Update with zero removes it",
		[]string{"TTL/SetByEachWrite"}},
	{UpdateKeepsExpiry, "each write sets the key's TTL anew: an Update with a TTL renews it",
		[]string{"TTL/SetByEachWrite"}},
	{ExpiredListed, "an expired key is absent for every method: List leaves it out",
		[]string{"TTL/Expiry"}},
	{ExpiredUpdatable, "an expired key is absent for every method: Update at its revision fails",
		[]string{"TTL/Expiry"}},
	{ListUnsorted, "List returns keys in byte order",
		[]string{"List/OrderAndPaging"}},
	{ListIncludesAfter, "List returns the keys that sort after after",
		[]string{"List/OrderAndPaging"}},
	{ListShortPage, "List returns up to limit keys: limit of them when that many remain",
		[]string{"List/OrderAndPaging"}},
	{KeysOverLimit, "List returns at most limit keys",
		[]string{"Revision/CompareAndSwap"}},
	{ListSegmentPrefix, "List returns the keys that start with prefix, byte for byte",
		[]string{"List/Prefixes"}},
	{ListPrefixAfterCut, "List returns only keys that start with prefix, on every page",
		[]string{"List/Prefixes"}},
	{ValueAliased, "the value Get returns is the caller's to keep, and so is the one given to a write",
		[]string{"Revision/CompareAndSwap", "Value/Sizes"}},
	{ValueTruncated, "a value of up to MaxValueLen bytes comes back whole",
		[]string{"Value/Sizes"}},
}

// Store is a small in-memory driver.Store, correct by default, and with a
// StoreMutation that breaks exactly one rule. Its connections (Connect)
// share its keys.
type Store struct {
	mut StoreMutation

	mu      sync.Mutex
	entries map[string]*storeEntry
	created []string          // keys in the order they were first created (ListUnsorted)
	rev     uint64            // the last revision given
	revs    map[string]uint64 // per key (RevisionPerKey) or per life (RevisionPerLife)
}

type storeEntry struct {
	value   []byte
	rev     uint64
	expires time.Time // zero: never
}

// NewStore returns an empty store broken by m ("" for none).
func NewStore(m StoreMutation) *Store {
	return &Store{mut: m, entries: map[string]*storeEntry{}, revs: map[string]uint64{}}
}

// Connect opens a connection to the store.
func (s *Store) Connect() driver.Store { return &storeConn{s: s} }

type storeConn struct{ s *Store }

func (s *Store) is(m StoreMutation) bool { return s.mut == m }

// live returns the entry of key when it is present at now.
func (s *Store) live(key string, now time.Time) *storeEntry {
	e := s.entries[key]
	if e == nil {
		return nil
	}
	expires := e.expires
	if !expires.IsZero() && s.is(TTLLate) {
		expires = expires.Add(250 * time.Millisecond)
	}
	if !expires.IsZero() && !now.Before(expires) && !s.is(TTLIgnored) {
		return nil
	}
	return e
}

// nextRev gives key a new revision.
func (s *Store) nextRev(key string) uint64 {
	switch {
	case s.is(RevisionPerKey), s.is(RevisionPerLife):
		s.revs[key]++
		return s.revs[key]
	}
	s.rev++
	return s.rev
}

func (s *Store) expiry(ttl time.Duration, now time.Time) time.Time {
	switch {
	case s.is(TTLWholeSeconds):
		ttl = ttl.Truncate(time.Second)
	case s.is(TTLHalf):
		ttl /= 2
	}
	if ttl <= 0 {
		return time.Time{}
	}
	return now.Add(ttl)
}

func (s *Store) keep(value []byte) []byte {
	if s.is(ValueAliased) {
		return value
	}
	if s.is(ValueTruncated) && len(value) > 32<<10 {
		value = value[:32<<10]
	}
	v := slices.Clone(value)
	if v == nil {
		v = []byte{}
	}
	return v
}

func (s *Store) put(key string, value []byte, expires time.Time) string {
	if _, ok := s.entries[key]; !ok && !slices.Contains(s.created, key) {
		s.created = append(s.created, key)
	}
	e := &storeEntry{value: s.keep(value), rev: s.nextRev(key), expires: expires}
	s.entries[key] = e
	return strconv.FormatUint(e.rev, 10)
}

// race gives another goroutine the chance to run between a check and the
// write that depends on it (CreateRace, UpdateRace).
func (s *Store) race() {
	s.mu.Unlock()
	time.Sleep(time.Millisecond)
	s.mu.Lock()
}

func (c *storeConn) Get(_ context.Context, key string) ([]byte, string, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(key, time.Now())
	if e == nil {
		return nil, "", driver.ErrKeyNotFound
	}
	v := e.value
	if !s.is(ValueAliased) {
		v = slices.Clone(v)
	}
	return v, strconv.FormatUint(e.rev, 10), nil
}

func (c *storeConn) Create(_ context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.live(key, now) != nil && !s.is(CreateOverwrites) {
		return "", driver.ErrKeyExists
	}
	if s.is(CreateRace) {
		s.race()
	}
	return s.put(key, value, s.expiry(ttl, now)), nil
}

func (c *storeConn) Update(_ context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	e := s.live(key, now)
	if e == nil && s.is(ExpiredUpdatable) {
		e = s.entries[key]
	}
	if e == nil {
		return "", driver.ErrRevision
	}
	same := string(e.value) == string(value)
	if strconv.FormatUint(e.rev, 10) != rev && !(s.is(SameValueABA) && same) {
		return "", driver.ErrRevision
	}
	if s.is(UpdateRace) {
		s.race()
	}
	if s.is(SameValueKeepsRev) && same && e.expires.IsZero() && ttl == 0 {
		return strconv.FormatUint(e.rev, 10), nil // nothing to write
	}
	expires := s.expiry(ttl, now)
	switch {
	case s.is(UpdateKeepsTTL) && ttl == 0, s.is(UpdateKeepsExpiry) && ttl > 0 && !e.expires.IsZero():
		expires = e.expires
	}
	return s.put(key, value, expires), nil
}

func (c *storeConn) Delete(_ context.Context, key, rev string) error {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(key, time.Now())
	switch {
	case rev != "" && !s.is(DeleteIgnoresRev) && (e == nil || strconv.FormatUint(e.rev, 10) != rev):
		return driver.ErrRevision
	case e == nil && s.is(DeleteAbsentFails):
		return driver.ErrKeyNotFound
	}
	delete(s.entries, key)
	if s.is(RevisionPerLife) {
		delete(s.revs, key)
	}
	return nil
}

func (c *storeConn) List(_ context.Context, prefix, after string, limit int) ([]string, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var keys []string
	if s.is(ListUnsorted) {
		keys = slices.Clone(s.created)
	} else {
		for k := range s.entries {
			keys = append(keys, k)
		}
		slices.Sort(keys)
	}
	switch {
	case s.is(ListShortPage) && limit > 1:
		limit--
	case s.is(KeysOverLimit):
		limit++
	}
	var out []string
	for _, k := range keys {
		if len(out) == limit {
			break
		}
		e := s.entries[k]
		switch {
		case e == nil:
		case !s.prefixed(k, prefix, after):
		case after != "" && (k < after || k == after && !s.is(ListIncludesAfter)):
		case s.live(k, now) == nil && !s.is(ExpiredListed):
		default:
			out = append(out, k)
		}
	}
	return out, nil
}

// prefixed reports whether List counts key under prefix.
func (s *Store) prefixed(key, prefix, after string) bool {
	switch {
	case s.is(ListPrefixAfterCut) && after != "":
		return true
	case s.is(ListSegmentPrefix) && prefix != "" && !strings.HasSuffix(prefix, "/"):
		return key == prefix || strings.HasPrefix(key, prefix+"/")
	}
	return strings.HasPrefix(key, prefix)
}
