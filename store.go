package asyncplatform

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// Errors of a Store, matched with errors.Is. Every error a Store returns is a
// *StoreError that wraps one of them or the backend's own error.
var (
	// ErrKeyNotFound is returned by Store.Get for a key that is absent or
	// expired.
	ErrKeyNotFound = driver.ErrKeyNotFound

	// ErrKeyExists is returned by Store.Create for a key that is present.
	ErrKeyExists = driver.ErrKeyExists

	// ErrRevision is returned by Store.Update, and by Store.Delete at a
	// revision, when the key is not present at that revision (it was
	// written since, deleted, or expired).
	ErrRevision = driver.ErrRevision

	// ErrNoStore is returned by Platform.Store when the backend keeps no
	// shared state (RabbitMQ without a companion store).
	ErrNoStore = driver.ErrNoStore

	// ErrBadKey is returned for a key, prefix or cursor outside the key
	// grammar (see Store), before the backend is called.
	ErrBadKey = driver.ErrBadKey

	// ErrValueTooLarge is returned for a value over MaxStoreValue bytes,
	// before the backend is called.
	ErrValueTooLarge = driver.ErrValueTooLarge

	// ErrBadTTL is returned for a TTL that is negative or outside
	// MinStoreTTL to MaxStoreTTL, before the backend is called.
	ErrBadTTL = driver.ErrBadTTL
)

// Limits of a Store, the same on every backend.
const (
	MaxStoreKey   = driver.MaxKeyLen   // the longest key, in bytes
	MaxStoreValue = driver.MaxValueLen // the largest value, in bytes
	MinStoreTTL   = driver.MinTTL      // the shortest positive TTL
	MaxStoreTTL   = driver.MaxTTL      // the longest TTL

	// DefaultStoreNamespace is the namespace of the Store that
	// Platform.Store returns.
	DefaultStoreNamespace = "app"

	// DefaultListLimit is the page size of Store.List when its limit is
	// zero or negative; MaxListLimit is the largest.
	DefaultListLimit = kv.DefaultListLimit
	MaxListLimit     = kv.MaxListLimit
)

// Store is shared state for every worker process of a platform: a small
// key-value store with revisions and TTLs, kept in the broker itself (a
// Redis hash, a JetStream KV bucket, Azure blobs, the in-process broker) or,
// for RabbitMQ, in a companion store such as PostgreSQL. It is enough for
// locks, counters, flags and records, and it behaves the same on every
// backend; the store suite (conformance/storetest) proves it.
//
//   - Get returns a key's value and its revision.
//   - Create writes a key only when it is absent (or expired): of processes
//     racing to create one key, exactly one wins, the others get
//     ErrKeyExists.
//   - Update writes a key only when it is still at the revision the caller
//     read (compare-and-swap), else ErrRevision: read, change, write back,
//     and start again on ErrRevision.
//   - Delete removes a key, optionally only at a revision.
//   - List pages through the keys under a prefix, in byte order.
//
// A revision is an opaque string that changes with every write and is never
// given to a key twice, even across a delete or an expiry. A TTL (zero: none)
// makes a key absent once it has passed, and never before; every write sets
// it anew.
//
// Limits, checked here before anything reaches the backend: a key is 1 to
// MaxStoreKey bytes of segments separated by '/', each made of letters,
// digits, '.', '_', ':', '=' and '-' (ErrBadKey); a value is at most
// MaxStoreValue bytes, empty allowed (ErrValueTooLarge); a TTL is zero or
// from MinStoreTTL to MaxStoreTTL, rounded up to whole milliseconds
// (ErrBadTTL).
//
// Keys live in a namespace: two Stores over one backend with different
// namespaces never see each other's keys. The backend keeps its store under
// its own prefix (a Redis prefix, a NATS stream name, ...), so two
// applications sharing a server never collide either.
//
// A Store is safe for concurrent use. Its errors are *StoreError values
// naming the operation and the key.
type Store struct {
	s *kv.Store
}

// NewStore returns a Store over a backend's store (or a companion store such
// as a PostgreSQL one) in the given namespace: 1 to 100 bytes of
// [A-Za-z0-9._-], as a queue name; names starting with '_' are kept for the
// platform's own state. An error matches ErrBadKey.
func NewStore(d driver.Store, namespace string) (*Store, error) {
	if d == nil {
		return nil, fmt.Errorf("asyncplatform: NewStore: %w: the store is nil", ErrNoStore)
	}
	if err := driver.CheckQueue(namespace); err != nil {
		return nil, fmt.Errorf("asyncplatform: NewStore: %w: namespace: %v", ErrBadKey, err)
	}
	if strings.HasPrefix(namespace, "_") {
		return nil, fmt.Errorf("asyncplatform: NewStore: %w: namespace %q: names starting with '_' are the platform's", ErrBadKey, namespace)
	}
	return &Store{s: kv.New(d, namespace)}, nil
}

// Store returns the platform's shared state: the store its backend keeps
// (driver.StoreOf), in the namespace DefaultStoreNamespace. A backend with
// no state of its own (RabbitMQ without Config.Store) gives an error
// matching ErrNoStore that names the choices.
func (p *Platform) Store() (*Store, error) {
	if p == nil || p.backend == nil {
		return nil, ErrNotNew
	}
	d, err := driver.StoreOf(p.backend)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: %w", err)
	}
	return &Store{s: kv.New(d, DefaultStoreNamespace)}, nil
}

// StoreError is the error of a Store operation, and of every store call
// the platform makes for its own state (Status, Cancel, Pause, schedules,
// unique keys, ...): its fields are Op, the operation ("get", "create",
// "update", "delete", "list"); Key, the key (or prefix) as the caller gave
// it; and Err, the cause, which errors.Is and errors.As reach: a sentinel
// (ErrKeyNotFound, ErrRevision, ErrBadKey, ...) or the backend's own error.
type StoreError = kv.Error

// inner is the store under s; the zero Store has none and refuses every call.
func (s *Store) inner() *kv.Store {
	if s == nil {
		return nil
	}
	return s.s
}

// Get returns the value of key and its revision, or an error matching
// ErrKeyNotFound when the key is absent or expired.
func (s *Store) Get(ctx context.Context, key string) (value []byte, rev string, err error) {
	return s.inner().Get(ctx, key)
}

// Create writes key only when it is absent or expired, with a TTL (zero:
// none), and returns its revision. When the key is present it returns an
// error matching ErrKeyExists.
func (s *Store) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (rev string, err error) {
	return s.inner().Create(ctx, key, value, ttl)
}

// Update writes key only when it is present at revision rev, with a new TTL
// (zero: none), and returns the new revision. Otherwise (the key was
// written since, deleted, or expired) it returns an error matching
// ErrRevision.
func (s *Store) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (newRev string, err error) {
	return s.inner().Update(ctx, key, value, rev, ttl)
}

// Delete removes key. With rev empty it removes whatever is there, and an
// absent key is not an error. With rev set it removes the key only when it
// is present at that revision, and otherwise returns an error matching
// ErrRevision.
func (s *Store) Delete(ctx context.Context, key, rev string) error {
	return s.inner().Delete(ctx, key, rev)
}

// KeyPage is one page of Store.List.
type KeyPage struct {
	// Keys are the keys of the page, in byte order.
	Keys []string
	// Next is the cursor of the next page; empty on the last page.
	Next string
}

// List returns the keys that start with prefix (empty: all), in byte order,
// limit at a time (at most MaxListLimit; zero means DefaultListLimit),
// starting after cursor (empty for the first page; then the page's Next).
// Expired keys are left out. A prefix is empty or a key, optionally ending
// with '/'; a cursor is empty or a key.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) (KeyPage, error) {
	keys, next, err := s.inner().List(ctx, prefix, cursor, limit)
	if err != nil {
		return KeyPage{}, err
	}
	return KeyPage{Keys: keys, Next: next}, nil
}
