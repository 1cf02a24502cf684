package driver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Store is an optional interface: a small key-value store with revisions and
// TTLs, kept in the broker's own durable state, that every worker process
// sees at once. It is the shared state of the platform's features (locks,
// counters, flags, records). A backend that keeps state implements it (or
// carries a companion store: see StoreProvider).
//
// # Valid input
//
// Like queue names, every argument is valid when it reaches a Store: the
// portable layer checks keys and prefixes (CheckKey, CheckKeyPrefix), values
// (CheckValue) and TTLs (CheckTTL) before it calls one, and prefixes the
// keys with a namespace of its own, so a key a Store is given is at most
// MaxStoreKeyLen bytes of the key grammar. A Store assumes valid input and
// never checks it again; it maps keys to names its broker accepts, keeping
// their byte order for List.
//
// # Revisions
//
// Every write (Create, Update) gives the key a new revision: an opaque,
// non-empty string of at most MaxRevisionLen bytes, never given to the key
// before, not even by an earlier life of the key that was deleted or
// expired. So a caller holding a revision can tell that nothing was written
// since it read it: Update and Delete at a revision are compare-and-swap
// operations with no ABA. A revision a caller made up (or one from another
// key) is simply not the key's revision: ErrRevision, never another error.
//
// # TTLs
//
// A TTL of zero means the key never expires. A positive TTL (a whole number
// of milliseconds between MinTTL and MaxTTL) counts from the write: the key
// is present for at least the TTL and absent as soon as it has passed. An
// expired key is absent for every method: Get does not find it, Create may
// take its place, Update and Delete at its revision fail with ErrRevision,
// and List leaves it out, whether or not the store has reclaimed its space.
// Each write sets the key's TTL anew (an Update with zero removes it). The
// clock that decides is the broker's where it has one a script or a query
// can read (Redis, PostgreSQL), else the clock of the process that wrote the
// key or reads it: the package documentation of each store says which.
//
// # Concurrency and errors
//
// Every method is safe for concurrent use and atomic: a Create race has one
// winner, and of concurrent Updates at one revision one succeeds. Methods
// return ErrKeyNotFound, ErrKeyExists and ErrRevision where they apply,
// ErrClosed after the backend is closed, and the broker's raw errors
// (wrapped with %w) otherwise; they never retry beyond what their own
// protocol needs.
type Store interface {
	// Get returns the value and revision of key, or ErrKeyNotFound when it
	// is absent or expired. The value is the caller's to keep.
	Get(ctx context.Context, key string) (value []byte, rev string, err error)

	// Create stores value under key only when the key is absent or expired,
	// with the given TTL (zero: none), and returns its revision. It returns
	// ErrKeyExists when the key is present.
	Create(ctx context.Context, key string, value []byte, ttl time.Duration) (rev string, err error)

	// Update replaces the value of key and its TTL only when the key is
	// present at revision rev, and returns the new revision. It returns
	// ErrRevision otherwise: the key was written since, deleted, or expired.
	Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (newRev string, err error)

	// Delete removes key. With rev empty it removes whatever is there, and
	// deleting an absent key is not an error. With rev set it removes the
	// key only when it is present at that revision, and returns ErrRevision
	// otherwise.
	//
	// A revision given to Update or Delete is one the store returned (from
	// Get, Create or Update); what a string it never returned matches is
	// the store's business.
	Delete(ctx context.Context, key, rev string) error

	// List returns, in byte order, up to limit present keys that start with
	// prefix (empty: every key) and sort after after (empty: from the
	// first). The portable layer pages with it: after is the last key of
	// the previous page. limit is at least 1. A key written or deleted
	// during a listing may or may not be in it; every key present
	// throughout is, once.
	List(ctx context.Context, prefix, after string, limit int) (keys []string, err error)
}

// StoreProvider is an optional interface for a backend that keeps no state
// of its own and carries a store given in its configuration (a companion
// store: RabbitMQ's is any Store, PostgreSQL's for one). Store returns it, or
// an error matching ErrNoStore that says so and names the choices.
type StoreProvider interface {
	Store() (Store, error)
}

// StoreOf returns the store of a backend: the backend itself when it
// implements Store, else the one its StoreProvider returns, else an error
// matching ErrNoStore.
func StoreOf(b Backend) (Store, error) {
	switch s := b.(type) {
	case Store:
		return s, nil
	case StoreProvider:
		return s.Store()
	case nil:
		return nil, fmt.Errorf("%w: the backend is nil", ErrNoStore)
	}
	return nil, fmt.Errorf("%w: the backend %T keeps no shared state", ErrNoStore, b)
}

// Errors of a Store, matched with errors.Is.
var (
	// ErrKeyNotFound is returned by Get for a key that is absent or expired.
	ErrKeyNotFound = errors.New("key not found")

	// ErrKeyExists is returned by Create for a key that is present.
	ErrKeyExists = errors.New("key exists")

	// ErrRevision is returned by Update, and by Delete at a revision, when
	// the key is not present at that revision.
	ErrRevision = errors.New("key not at that revision")

	// ErrNoStore is returned by StoreOf for a backend that keeps no shared
	// state, or carries no companion store.
	ErrNoStore = errors.New("no store")

	// ErrBadKey is matched by the errors of CheckKey and CheckKeyPrefix.
	ErrBadKey = errors.New("bad store key")

	// ErrValueTooLarge is matched by the errors of CheckValue.
	ErrValueTooLarge = errors.New("store value too large")

	// ErrBadTTL is matched by the errors of CheckTTL.
	ErrBadTTL = errors.New("bad store TTL")
)

// Limits of a Store, the same on every backend. CheckKey, CheckKeyPrefix,
// CheckValue and CheckTTL are their one definition.
const (
	// MaxKeyLen is the longest key a user gives, in bytes.
	MaxKeyLen = 256

	// MaxStoreKeyLen is the longest key a Store is given, in bytes: the
	// portable layer puts a namespace (a queue name: at most MaxQueueLen
	// bytes) and a '/' before the user's key, and a backend carrying a
	// companion store may put its own prefix (at most MaxQueueLen bytes)
	// and a '/' before that.
	MaxStoreKeyLen = 512

	// MaxValueLen is the largest value, in bytes. Empty values are allowed.
	MaxValueLen = 64 << 10

	// MaxRevisionLen is the longest revision a Store returns, in bytes.
	MaxRevisionLen = 128

	// MinTTL and MaxTTL bound a positive TTL. TTLs are whole milliseconds:
	// the portable layer rounds a TTL up to the next one.
	MinTTL = time.Millisecond
	MaxTTL = 10 * 365 * 24 * time.Hour
)

// inputError is an error of the Check functions: its text names the problem,
// and it matches its sentinel.
type inputError struct {
	msg      string
	sentinel error
}

func (e *inputError) Error() string        { return e.msg }
func (e *inputError) Is(target error) bool { return target == e.sentinel }

func badKey(format string, args ...any) error {
	return &inputError{fmt.Sprintf(format, args...), ErrBadKey}
}

// keyByte reports whether c may appear in a key segment.
func keyByte(c byte) bool {
	return queueByte(c) || c == ':' || c == '='
}

// CheckKey reports whether key is a valid store key: 1 to MaxKeyLen bytes
// of segments separated by '/', each segment one or more of
// [A-Za-z0-9._:=-] (so no '/' at either end, and no "//"). The error
// matches ErrBadKey and names the problem and its offset.
func CheckKey(key string) error {
	if key == "" {
		return badKey("store key is empty")
	}
	return checkSegments("store key", key, false)
}

// CheckKeyPrefix reports whether prefix is a valid prefix for List: empty,
// or what CheckKey accepts, optionally ending with '/'. The error matches
// ErrBadKey.
func CheckKeyPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return checkSegments("store key prefix", prefix, true)
}

func checkSegments(what, s string, trailingSlash bool) error {
	if len(s) > MaxKeyLen {
		return badKey("%s %.20q... is %d bytes, the limit is %d", what, s, len(s), MaxKeyLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case keyByte(c):
		case c != '/':
			return badKey("%s %q has %s at byte %d; use letters, digits, '.', '_', ':', '=', '-' and '/' between segments", what, s, quoteByte(c), i)
		case i == 0:
			return badKey("%s %q starts with '/'", what, s)
		case s[i-1] == '/':
			return badKey("%s %q has an empty segment (\"//\") at byte %d", what, s, i-1)
		case i == len(s)-1 && !trailingSlash:
			return badKey("%s %q ends with '/'", what, s)
		}
	}
	return nil
}

// CheckValue reports whether value is small enough for a store: at most
// MaxValueLen bytes. The error matches ErrValueTooLarge.
func CheckValue(value []byte) error {
	if len(value) > MaxValueLen {
		return &inputError{fmt.Sprintf("store value is %d bytes, the limit is %d", len(value), MaxValueLen), ErrValueTooLarge}
	}
	return nil
}

// CheckTTL reports whether ttl is a valid TTL: zero (no expiry), or between
// MinTTL and MaxTTL. The error matches ErrBadTTL.
func CheckTTL(ttl time.Duration) error {
	if ttl == 0 || MinTTL <= ttl && ttl <= MaxTTL {
		return nil
	}
	return &inputError{fmt.Sprintf("store TTL %v: want 0 (no expiry) or %v to %v", ttl, MinTTL, MaxTTL), ErrBadTTL}
}
