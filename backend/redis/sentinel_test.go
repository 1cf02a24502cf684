package redis

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// sentinelBaseEnv is the base port of the master, replica and three
// Sentinels TestSentinelFailover starts (default 7170: BASE..BASE+4).
const sentinelBaseEnv = "ASYNCPLATFORM_REDIS_SENTINEL_BASE"

// sentinelSet is a master, a replica and three Sentinels started by
// scripts/cluster/redis-sentinel.sh.
type sentinelSet struct {
	t    testing.TB
	base int
	url  string // redis+sentinel://s1,s2,s3/mymaster
}

func (s *sentinelSet) script(args ...string) string {
	s.t.Helper()
	out, err := exec.Command("../../scripts/cluster/redis-sentinel.sh", args...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		s.t.Fatalf("redis-sentinel.sh %s: %v: %s", strings.Join(args, " "), err, msg)
	}
	return strings.TrimSpace(string(out))
}

// master is the port of the master the Sentinels name.
func (s *sentinelSet) master() int {
	s.t.Helper()
	p, err := strconv.Atoi(s.script("master", strconv.Itoa(s.base)))
	if err != nil {
		s.t.Fatalf("redis-sentinel.sh master: %v", err)
	}
	return p
}

// startSentinels starts a set on base..base+4, stopped when the test ends.
func startSentinels(t testing.TB, base int) *sentinelSet {
	s := &sentinelSet{t: t, base: base}
	b := strconv.Itoa(base)
	s.script("stop", b) // what a killed run left behind
	out := s.script("start", b)
	t.Cleanup(func() { s.script("stop", b) })
	_, u, ok := strings.Cut(out, "ASYNCPLATFORM_REDIS_SENTINEL_URL=")
	if !ok {
		t.Fatalf("redis-sentinel.sh start printed %q", out)
	}
	s.url = strings.Trim(u, "'")
	return s
}

// TestSentinelFailover: 2,000 jobs at concurrency 10 on a master and a
// replica watched by three Sentinels (scripts/cluster/redis-sentinel.sh),
// the Backend opened from the redis+sentinel:// URL, while the master is
// SIGKILLed (the Sentinels promote the replica) and restarted (they make
// it a replica of the new master), then the new master is SIGKILLed and
// restarted too (the first one is promoted back). It reports lost and
// duplicated jobs and, for each kill, the time to the first successful
// enqueue and claim after it. A loss is Redis's asynchronous replication
// (reported, not failed); a queue that does not move again is a failure.
// It runs twice, on sets of its own: with the platform's default
// HealthInterval, and with a 1 s one (a health check that fails during
// the failover stops claims until the next one passes). It runs with the
// cluster tests:
//
//	ASYNCPLATFORM_CLUSTER=redis go test -count=1 -v -run TestSentinelFailover -timeout 10m ./backend/redis
func TestSentinelFailover(t *testing.T) {
	needCluster(t)
	base, err := strconv.Atoi(cmpOr(os.Getenv(sentinelBaseEnv), "7170"))
	if err != nil {
		t.Fatalf("%s: %v", sentinelBaseEnv, err)
	}
	for i, health := range []time.Duration{0, time.Second} {
		name := "health=default"
		if health > 0 {
			name = "health=" + health.String()
		}
		t.Run(name, func(t *testing.T) {
			sentinelFailover(t, startSentinels(t, base+10*i), health)
		})
	}
}

func sentinelFailover(t *testing.T, s *sentinelSet, health time.Duration) {
	ctx := context.Background()
	u, err := url.Parse(s.url + "?prefix=sent")
	if err != nil {
		t.Fatal(err)
	}
	ob, err := openURL(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	b := &timedBackend{urlBackend: ob.(*urlBackend)}
	t.Cleanup(func() { b.Close() })
	if _, ok := b.rdb.(*goredis.Client); !ok {
		t.Fatalf("a redis+sentinel:// URL made a %T", b.rdb)
	}
	q := testQueue(t)
	l := startKillLoad(t, b, q, health)

	// killAndFollow SIGKILLs the master, reports the time to the first
	// enqueue and claim after it, then restarts the killed node and waits
	// until the Sentinels have made it the new master's replica, in sync.
	killAndFollow := func(what string) (enq, claim time.Duration) {
		t.Helper()
		port := s.master()
		at := l.handled()
		s.script("kill", strconv.Itoa(port)) // returns once the process is gone
		t0 := time.Now()
		enq, claim = l.follow(what, port, at, t0)
		if now := s.master(); now == port {
			t.Errorf("15 s after the kill of %s (port %d), the Sentinels still name it the master", what, port)
		}
		s.script("restart", strconv.Itoa(port))
		s.script("wait", strconv.Itoa(s.base))
		return enq, claim
	}

	l.waitUntil("300 jobs handled", 60*time.Second, func() bool { return l.handled() >= 300 })
	enq1, claim1 := killAndFollow("the master")
	enq2, claim2 := killAndFollow("the promoted replica")

	acked, lost, dup, failures, st := l.finish()
	t.Logf("%d jobs, lost %d, duplicated %d, enqueue failures retried %d, queue at the end %+v; "+
		"kill of the master: enqueue %v, claim %v; kill of the promoted replica: enqueue %v, claim %v",
		acked, lost, dup, failures, st,
		enq1.Round(time.Millisecond), claim1.Round(time.Millisecond), enq2.Round(time.Millisecond), claim2.Round(time.Millisecond))
	if lost > 0 {
		t.Logf("%d acknowledged jobs lost to the failover: Redis's asynchronous replication (wait_replicas bounds it)", lost)
	}
	if st.Ready+st.Scheduled+st.InFlight+st.Dead != 0 {
		t.Errorf("the queue is not empty at the end: %+v", st)
	}
}
