package redis

import (
	"context"
	"errors"
	"strings"
	"sync"
	"weak"

	goredis "github.com/redis/go-redis/v9"
)

// followed holds the cluster clients that have a failoverHook, so a client
// shared by several Backends gets one.
var followed sync.Map // weak.Pointer[goredis.ClusterClient] -> struct{}

// followFailovers makes a Redis Cluster client follow a failover as soon as
// a command meets it. go-redis reloads its slot map after a MOVED or
// READONLY reply and otherwise only every ClusterStateReloadInterval (60s
// by default): a master that died and was replaced keeps being dialled, and
// every command on its slots fails, until that reload or its return. The
// hook asks for a reload (asynchronous, coalesced by go-redis) after every
// command that failed for a reason a new topology may cure. Other clients
// are left as they are: a Sentinel client follows the master itself.
func followFailovers(c goredis.UniversalClient) {
	cc, ok := c.(*goredis.ClusterClient)
	if !ok {
		return
	}
	if _, loaded := followed.LoadOrStore(weak.Make(cc), struct{}{}); loaded {
		return
	}
	// The hook holds the client weakly too, so the map entry is all that
	// outlives a client that is dropped.
	cc.AddHook(failoverHook{c: weak.Make(cc)})
}

// failoverHook reloads its cluster client's slot map after a failed command
// (see followFailovers).
type failoverHook struct {
	c weak.Pointer[goredis.ClusterClient]
}

func (h failoverHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h failoverHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		h.check(ctx, err)
		return err
	}
}

func (h failoverHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		h.check(ctx, err)
		return err
	}
}

func (h failoverHook) check(ctx context.Context, err error) {
	if !topologyError(err) {
		return
	}
	if c := h.c.Value(); c != nil {
		c.ReloadState(ctx)
	}
}

// topologyError reports whether err may be cured by a new slot map: a
// connection that failed (refused, reset, timed out), or a node saying the
// cluster or its master is down. An answer (nil, a script's error, a wrong
// type) and a cancelled or closed caller are not.
func topologyError(err error) bool {
	switch {
	case err == nil, errors.Is(err, goredis.Nil), errors.Is(err, context.Canceled), errors.Is(err, goredis.ErrClosed):
		return false
	}
	var re goredis.Error
	if errors.As(err, &re) {
		for _, p := range []string{"CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING"} {
			if strings.HasPrefix(re.Error(), p) {
				return true
			}
		}
		return false
	}
	return true
}
