package redis

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/driver"
)

// The cluster tests run on a Redis Cluster of their own (3 masters, 3
// replicas; scripts/cluster/redis.sh), only when asked:
//
//	ASYNCPLATFORM_CLUSTER=redis go test -run 'TestCluster' -count=1 -timeout 30m ./backend/redis
const (
	clusterEnv = "ASYNCPLATFORM_CLUSTER"
	// clusterURLEnv holds the redis+cluster:// URL of a running cluster:
	// set by the script's start (eval its output) or by the test for its
	// child processes.
	clusterURLEnv = "ASYNCPLATFORM_REDIS_CLUSTER_URL"
	// clusterBaseEnv is the base port of the cluster TestClusterConformance
	// starts (default 7100); TestClusterNodeKill starts its own at base+20.
	clusterBaseEnv = "ASYNCPLATFORM_REDIS_CLUSTER_BASE"
)

func needCluster(t testing.TB) {
	t.Helper()
	if os.Getenv(clusterEnv) != "redis" {
		t.Skipf("a Redis Cluster test: set %s=redis to run it (it starts a cluster with scripts/cluster/redis.sh)", clusterEnv)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("%s=redis, but: %v", clusterEnv, err)
	}
}

func clusterBase(t testing.TB) int {
	b, err := strconv.Atoi(cmpOr(os.Getenv(clusterBaseEnv), "7100"))
	if err != nil {
		t.Fatalf("%s: %v", clusterBaseEnv, err)
	}
	return b
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// redisCluster is a cluster started by scripts/cluster/redis.sh.
type redisCluster struct {
	t    testing.TB
	base int
	url  string
}

// script runs scripts/cluster/redis.sh with args and returns its output.
func (c *redisCluster) script(args ...string) string {
	c.t.Helper()
	cmd := exec.Command("../../scripts/cluster/redis.sh", args...)
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		c.t.Fatalf("redis.sh %s: %v: %s", strings.Join(args, " "), err, msg)
	}
	return string(out)
}

// startCluster starts a cluster on base..base+5, stopped when the test ends.
func startCluster(t testing.TB, base int) *redisCluster {
	c := &redisCluster{t: t, base: base}
	b := strconv.Itoa(base)
	c.script("stop", b) // what a killed run left behind
	out := c.script("start", b)
	t.Cleanup(func() { c.script("stop", b) })
	_, u, ok := strings.Cut(strings.TrimSpace(out), clusterURLEnv+"=")
	if !ok {
		t.Fatalf("redis.sh start printed %q", out)
	}
	c.url = strings.Trim(u, "'")
	return c
}

// clusterHarness opens each backend through the redis+cluster:// URL form,
// on a client of its own.
type clusterHarness struct {
	url    string
	mu     sync.Mutex
	opened []goredis.UniversalClient
}

func (h *clusterHarness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	u, err := url.Parse(h.url)
	if err != nil {
		return nil, err
	}
	o, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	c := o.client()
	b, err := New(ctx, Config{Client: c, Prefix: "aptc", DeadHold: time.Second, IdleWait: 500 * time.Millisecond})
	if err != nil {
		c.Close()
		return nil, err
	}
	h.mu.Lock()
	h.opened = append(h.opened, c)
	h.mu.Unlock()
	return clientClosing{b, c}, nil
}

func (h *clusterHarness) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.opened {
		c.Close()
	}
	h.opened = nil
}

// TestClusterConformance runs the conformance suite on a Redis Cluster,
// every backend opened from the cluster's redis+cluster:// URL. It starts
// the cluster unless ASYNCPLATFORM_REDIS_CLUSTER_URL names one; child
// processes get the URL through that variable.
func TestClusterConformance(t *testing.T) {
	needCluster(t)
	u := os.Getenv(clusterURLEnv)
	if u == "" {
		u = startCluster(t, clusterBase(t)).url
		os.Setenv(clusterURLEnv, u)
		t.Cleanup(func() { os.Unsetenv(clusterURLEnv) })
	}
	conformance.Run(t, func(ctx context.Context, t *testing.T) (conformance.Harness, error) {
		return &clusterHarness{url: u}, nil
	}, conformance.Options{Lease: time.Second})
}

// timedBackend notes when Enqueue and a Receive that handed out work
// succeeded, and when a Ping (the platform's health check) failed and
// passed.
type timedBackend struct {
	*urlBackend
	mu       sync.Mutex
	enqueued []time.Time
	received []time.Time
	pingFail []time.Time
	pingOK   []time.Time
}

func (b *timedBackend) Ping(ctx context.Context) error {
	err := b.urlBackend.Ping(ctx)
	b.mu.Lock()
	if err != nil {
		b.pingFail = append(b.pingFail, time.Now())
	} else {
		b.pingOK = append(b.pingOK, time.Now())
	}
	b.mu.Unlock()
	return err
}

func (b *timedBackend) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	err := b.urlBackend.Enqueue(ctx, queue, msgs)
	if err == nil {
		b.mu.Lock()
		b.enqueued = append(b.enqueued, time.Now())
		b.mu.Unlock()
	}
	return err
}

func (b *timedBackend) Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	ds, err := b.urlBackend.Receive(ctx, queue, max, lease)
	if err == nil && len(ds) > 0 {
		b.mu.Lock()
		b.received = append(b.received, time.Now())
		b.mu.Unlock()
	}
	return ds, err
}

// firstAfter returns how long after t0 the first time in ts came, or -1.
func firstAfter(mu *sync.Mutex, ts *[]time.Time, t0 time.Time) time.Duration {
	mu.Lock()
	defer mu.Unlock()
	for _, t := range *ts {
		if t.After(t0) {
			return t.Sub(t0)
		}
	}
	return -1
}

// longestGap returns the longest time without a success in ts between t0
// and t1 (from t0 to the first success, between two, to t1 from the last).
func longestGap(mu *sync.Mutex, ts *[]time.Time, t0, t1 time.Time) time.Duration {
	mu.Lock()
	defer mu.Unlock()
	var gap time.Duration
	last := t0
	for _, t := range *ts {
		if t.Before(t0) || t.After(t1) {
			continue
		}
		gap = max(gap, t.Sub(last))
		last = t
	}
	return max(gap, t1.Sub(last))
}

// TestClusterNodeKill: 2,000 jobs at concurrency 10 on a Redis Cluster of
// its own, opened from its URL, while the master of the queue's slot is
// SIGKILLed (its replica takes over) and restarted, then another master
// (one the queue's commands never go to) is SIGKILLed and restarted. It
// reports lost, duplicated, and for each kill the time to the first
// successful enqueue and claim after it. It runs twice: as Open makes the
// backend, and with wait_replicas=1 (Config.WaitReplicas), whose enqueues
// cannot be lost to the failover; a loss without it is Redis's asynchronous
// replication (reported, not failed).
func TestClusterNodeKill(t *testing.T) {
	needCluster(t)
	for i, wait := range []int{0, 1} {
		t.Run(fmt.Sprintf("wait_replicas=%d", wait), func(t *testing.T) {
			c := startCluster(t, clusterBase(t)+20+10*i)
			nodeKill(t, c, wait)
		})
	}
}

func nodeKill(t *testing.T, c *redisCluster, wait int) {
	ctx := context.Background()
	u, err := url.Parse(c.url + "?prefix=kill&wait_replicas=" + strconv.Itoa(wait))
	if err != nil {
		t.Fatal(err)
	}
	ob, err := openURL(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	b := &timedBackend{urlBackend: ob.(*urlBackend)}
	t.Cleanup(func() { b.Close() })
	cc := b.rdb.(*goredis.ClusterClient)
	q := testQueue(t)
	l := startKillLoad(t, b, q, 0)

	key := b.keys(q)[0]
	// promoted waits until the queue's slot has a master other than port.
	promoted := func(port int) time.Time {
		t.Helper()
		l.waitUntil("a new master for the queue's slot", 60*time.Second, func() bool {
			cc.ReloadState(ctx)
			m, err := cc.MasterForKey(ctx, key)
			return err == nil && portOf(t, m.Options().Addr) != port
		})
		return time.Now()
	}
	// killAndFollow SIGKILLs the node on port, reports the time to the
	// first enqueue and claim after it, then restarts the node and waits
	// for the cluster to be whole again. With wait_replicas, the killed
	// node is restarted as soon as its replica took over (see below).
	// The longest stall is taken over the 15 s after the kill: a kill of a
	// master the queue does not use still stops the whole cluster between
	// its failure detection and its replica's promotion.
	killAndFollow := func(what string, port int, slotMaster bool) (enq, claim time.Duration) {
		t.Helper()
		at := l.handled()
		c.script("kill", strconv.Itoa(port)) // returns once the process is gone
		t0 := time.Now()
		if slotMaster && wait > 0 {
			// The promoted replica has no replica of its own until the
			// killed node is back: every WAIT 1 on it fails, so no
			// enqueue succeeds until then. Restart at once.
			tp := promoted(port)
			t.Logf("replica promoted %v after the kill; restarting the killed node", tp.Sub(t0).Round(time.Millisecond))
			c.script("restart", strconv.Itoa(port))
		}
		enq, claim = l.follow(what, port, at, t0)
		if !(slotMaster && wait > 0) {
			c.script("restart", strconv.Itoa(port))
		}
		c.script("wait", strconv.Itoa(c.base))
		return enq, claim
	}

	l.waitUntil("300 jobs handled", 60*time.Second, func() bool { return l.handled() >= 300 })
	master, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	connected := portOf(t, master.Options().Addr)
	enq1, claim1 := killAndFollow("the master of the queue's slot", connected, true)

	// Another master: one the queue's commands do not go to (the registry
	// key of Declare may live there; it is written at start only).
	cc.ReloadState(ctx)
	time.Sleep(500 * time.Millisecond)
	master, err = cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	now := portOf(t, master.Options().Addr)
	var omu sync.Mutex
	other := -1
	_ = cc.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
		if p := portOf(t, m.Options().Addr); p != now {
			omu.Lock()
			other = p
			omu.Unlock()
		}
		return nil
	})
	if other < 0 {
		t.Fatal("no other master")
	}
	enq2, claim2 := killAndFollow("another master", other, false)

	acked, lost, dup, failures, st := l.finish()
	t.Logf("wait_replicas=%d: %d jobs, lost %d, duplicated %d, enqueue failures retried %d, queue at the end %+v; "+
		"kill of the slot's master: enqueue %v, claim %v; kill of another master: enqueue %v, claim %v",
		wait, acked, lost, dup, failures, st,
		enq1.Round(time.Millisecond), claim1.Round(time.Millisecond), enq2.Round(time.Millisecond), claim2.Round(time.Millisecond))
	if lost > 0 && wait > 0 {
		t.Errorf("%d acknowledged jobs lost with wait_replicas=%d", lost, wait)
	}
	if lost > 0 && wait == 0 {
		t.Logf("%d acknowledged jobs lost to the failover: Redis's asynchronous replication (wait_replicas bounds it)", lost)
	}
	if st.Ready+st.Scheduled+st.InFlight+st.Dead != 0 {
		t.Errorf("the queue is not empty at the end: %+v", st)
	}
	for _, d := range []time.Duration{enq1, claim1, enq2, claim2} {
		if d > 30*time.Second {
			t.Errorf("a kill stopped the queue for %v (enqueue %v/%v, claim %v/%v)", d, enq1, enq2, claim1, claim2)
			break
		}
	}
}

func portOf(t testing.TB, addr string) int {
	_, p, ok := strings.Cut(addr, ":")
	n, err := strconv.Atoi(p)
	if !ok || err != nil {
		t.Fatalf("address %q has no port", addr)
	}
	return n
}

// BenchmarkClusterEnqueue times one Enqueue of one job on a Redis Cluster
// of its own (base port + 50), as Open makes the backend and with
// wait_replicas=1 (Config.WaitReplicas):
//
//	ASYNCPLATFORM_CLUSTER=redis go test -run '^$' -bench ClusterEnqueue -benchtime 3000x -count 5 ./backend/redis
func BenchmarkClusterEnqueue(b *testing.B) {
	needCluster(b)
	c := startCluster(b, clusterBase(b)+50)
	for _, wait := range []int{0, 1} {
		b.Run(fmt.Sprintf("wait_replicas=%d", wait), func(b *testing.B) {
			ctx := context.Background()
			u, err := url.Parse(c.url + "?prefix=bench&wait_replicas=" + strconv.Itoa(wait))
			if err != nil {
				b.Fatal(err)
			}
			be, err := openURL(ctx, u)
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			q := testQueue(b)
			defer be.(*urlBackend).DeleteQueue(ctx, q)
			msg := []driver.Message{{ID: "j", Body: make([]byte, benchPayload)}}
			b.ResetTimer()
			for range b.N {
				if err := be.Enqueue(ctx, q, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
