package flow

import (
	"context"
	"time"
)

// KV is the shared store the limits live in: a key-value store with
// revisions and TTLs that every worker process sees at once. The root
// package's *Store satisfies it, and so does a driver.Store.
//
// Its methods behave as driver.Store's: Get returns an error matching
// driver.ErrKeyNotFound for an absent or expired key; Create writes only an
// absent key (else driver.ErrKeyExists); Update and Delete at a revision act
// only when the key is present at that revision (else driver.ErrRevision);
// a TTL (zero: none) makes a key absent once it has passed, and every write
// sets it anew. Keys are segments of [A-Za-z0-9._:=-] separated by '/', at
// most driver.MaxKeyLen bytes; TTLs given by this package are whole
// milliseconds from driver.MinTTL to driver.MaxTTL.
type KV interface {
	Get(ctx context.Context, key string) (value []byte, rev string, err error)
	Create(ctx context.Context, key string, value []byte, ttl time.Duration) (rev string, err error)
	Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (newRev string, err error)
	Delete(ctx context.Context, key, rev string) error
}

// ceilMillis rounds d up to whole milliseconds, and to at least one.
func ceilMillis(d time.Duration) time.Duration {
	if d <= time.Millisecond {
		return time.Millisecond
	}
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}
