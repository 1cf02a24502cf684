package redis

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.QueueLister = (*Backend)(nil)

// registryKey is the set of declared queue names: Declare adds a queue to
// it, DeleteQueue removes it. It lives outside every queue's hash tag, in a
// Cluster slot of its own.
func (b *Backend) registryKey() string { return "{" + b.cfg.Prefix + "}:queues" }

// queueKeySuffixes are the key names after a queue's hash tag (see keys).
var queueKeySuffixes = map[string]bool{
	"ready": true, "sched": true, "inflight": true, "jobs": true, "signal": true,
	"seq": true, "dead": true, "held": true, "heldrec": true, "deadrm": true,
}

// scanCount is the COUNT hint of each SCAN step.
const scanCount = 1000

// Queues implements driver.QueueLister: the members of the registry set
// (every queue declared since it was last deleted), and every queue that
// has a key, found with SCAN over the keyspace (on every master of a
// Cluster), which finds queues written before the registry existed. The
// scan makes Queues cost one round trip per thousand keys in the database.
func (b *Backend) Queues(ctx context.Context) ([]string, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	found := map[string]bool{}
	var mu sync.Mutex
	add := func(q string) {
		if driver.CheckQueue(q) == nil {
			mu.Lock()
			found[q] = true
			mu.Unlock()
		}
	}
	members, err := b.rdb.SMembers(ctx, b.registryKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("redis: list queues: %w", err)
	}
	for _, q := range members {
		add(q)
	}
	head := "{" + b.cfg.Prefix + ":"
	scan := func(ctx context.Context, c goredis.Cmdable) error {
		iter := c.Scan(ctx, 0, head+"*}:*", scanCount).Iterator()
		for iter.Next(ctx) {
			if q, ok := b.queueOfKey(iter.Val()); ok {
				add(q)
			}
		}
		return iter.Err()
	}
	if cc, ok := b.rdb.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, b.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("redis: list queues: scan: %w", err)
	}
	names := make([]string, 0, len(found))
	for q := range found {
		names = append(names, q)
	}
	sort.Strings(names)
	return names, nil
}

// queueOfKey returns the queue whose key k is, if k is one of this prefix's
// queue keys: "{prefix:queue}:suffix" with a suffix keys makes. A key of
// another prefix that starts like this one ("{prefix:other:queue}:seq")
// yields a name with a ':', which Queues drops.
func (b *Backend) queueOfKey(k string) (string, bool) {
	rest, ok := strings.CutPrefix(k, "{"+b.cfg.Prefix+":")
	if !ok {
		return "", false
	}
	q, suffix, ok := strings.Cut(rest, "}:")
	if !ok || !queueKeySuffixes[suffix] {
		return "", false
	}
	return q, true
}
