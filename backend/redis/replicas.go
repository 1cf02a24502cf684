package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// ErrNotReplicated is returned by Enqueue, with Config.WaitReplicas set,
// when fewer replicas than asked confirmed the write within
// Config.WaitTimeout. The jobs are stored on the master and may or may not
// survive its failover.
var ErrNotReplicated = errors.New("redis: the write reached fewer replicas than Config.WaitReplicas")

// enqueueReplicated runs the enqueue script, then WAIT, on one connection to
// the master of the queue's slot.
func (b *Backend) enqueueReplicated(ctx context.Context, queue string, keys []string, args []any) error {
	var node *goredis.Client
	cc, _ := b.rdb.(*goredis.ClusterClient)
	if cc != nil {
		var err error
		if node, err = cc.MasterForKey(ctx, keys[0]); err != nil {
			cc.ReloadState(ctx)
			return fmt.Errorf("redis: enqueue to %q: the master of its slot: %w", queue, err)
		}
	} else {
		node = b.rdb.(*goredis.Client) // validate made sure
	}
	cn := node.Conn()
	defer cn.Close()
	if err := enqueueScript.Run(ctx, cn, keys, args...).Err(); err != nil {
		// Past the cluster client: follow a moved slot or a dead master
		// here (see followFailovers).
		if cc != nil && (topologyError(err) || movedError(err)) {
			cc.ReloadState(ctx)
		}
		return fmt.Errorf("redis: enqueue to %q: %w", queue, err)
	}
	n, err := cn.Wait(ctx, b.cfg.WaitReplicas, b.cfg.WaitTimeout).Result()
	if err != nil {
		return fmt.Errorf("redis: enqueue to %q: wait for replicas: %w", queue, err)
	}
	if n < int64(b.cfg.WaitReplicas) {
		return fmt.Errorf("redis: enqueue to %q: %d of %d replicas within %v: %w", queue, n, b.cfg.WaitReplicas, b.cfg.WaitTimeout, ErrNotReplicated)
	}
	return nil
}

// movedError reports a MOVED or ASK redirection.
func movedError(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && (strings.HasPrefix(re.Error(), "MOVED ") || strings.HasPrefix(re.Error(), "ASK "))
}
