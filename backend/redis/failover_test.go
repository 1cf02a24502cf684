package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestTopologyError: the errors after which a cluster client reloads its
// slot map (a failed connection, a node saying the cluster or its master is
// down), and those after which it does not (an answer, a cancelled caller).
func TestTopologyError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: realRedis(t)})
	defer c.Close()
	// Real replies of a server, for the Redis error types.
	wrongType := c.Do(ctx, "INCR", "{apt-topology}:nosuchkey:"+t.Name()).Err() // nil: an answer
	scriptErr := c.Eval(ctx, "return redis.error_reply('ERR boom')", nil).Err()
	syntax := c.Do(ctx, "NOSUCHCOMMAND").Err()
	if wrongType != nil || scriptErr == nil || syntax == nil {
		t.Fatalf("setup: %v, %v, %v", wrongType, scriptErr, syntax)
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{goredis.Nil, false},
		{context.Canceled, false},
		{fmt.Errorf("wrapped: %w", context.Canceled), false},
		{goredis.ErrClosed, false},
		{scriptErr, false},
		{syntax, false},
		{refused, true},
		{fmt.Errorf("redis: enqueue: %w", refused), true},
		{io.EOF, true},
		{context.DeadlineExceeded, true},
		{errors.New("i/o timeout"), true},
	} {
		if got := topologyError(tc.err); got != tc.want {
			t.Errorf("topologyError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	// Replies of a cluster node, as go-redis types them.
	for _, reply := range []string{"CLUSTERDOWN The cluster is down", "TRYAGAIN Multiple keys request during rehashing of slot", "MASTERDOWN Link with MASTER is down", "LOADING Redis is loading the dataset in memory"} {
		err := c.Eval(ctx, "return redis.error_reply(ARGV[1])", nil, reply).Err()
		if !topologyError(err) {
			t.Errorf("topologyError(%q) = false, want true", err)
		}
	}
}

// TestWaitReplicas: with Config.WaitReplicas, Enqueue sends WAIT and fails
// with ErrNotReplicated when fewer replicas confirm (the machine's Redis has
// none), having stored the job; without it Enqueue does not wait.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: realRedis(t)})
	defer c.Close()
	q := testQueue(t)
	for _, wait := range []int{0, 1} {
		b, err := New(ctx, Config{Client: c, Prefix: "apt", WaitReplicas: wait, WaitTimeout: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.DeleteQueue(ctx, q); b.Close() })
		err = b.Enqueue(ctx, q, []driver.Message{{ID: "j", Body: []byte("x")}})
		if wait == 0 && err != nil {
			t.Errorf("WaitReplicas 0: %v", err)
		}
		if wait == 1 && !errors.Is(err, ErrNotReplicated) {
			t.Errorf("WaitReplicas 1 without a replica: %v, want ErrNotReplicated", err)
		}
		st, err := b.Stats(ctx, q)
		if err != nil || st.Ready != int64(1+wait) {
			t.Errorf("WaitReplicas %d: stats %+v, %v; want the job stored", wait, st, err)
		}
	}
	ring := goredis.NewRing(&goredis.RingOptions{})
	defer ring.Close()
	if _, err := New(ctx, Config{Client: ring, WaitReplicas: 1}); err == nil {
		t.Error("WaitReplicas with a Ring client was accepted")
	}
}
