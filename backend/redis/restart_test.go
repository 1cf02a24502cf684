package redis

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// ownRedis runs a redis-server of this test's own with AOF fsynced on every
// write, on a free port, and returns its address and a restart function.
func ownRedis(t *testing.T) (addr string, restart func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unreachable(t, "redis-server binary", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	addr = "127.0.0.1:" + strconv.Itoa(port)
	dir := t.TempDir()
	var cmd *exec.Cmd
	start := func() {
		cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--maxmemory-policy", "noeviction")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		defer c.Close()
		for i := 0; ; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := c.Ping(ctx).Err()
			cancel()
			if err == nil {
				return
			}
			if i > 100 {
				t.Fatalf("own redis-server on %s did not start: %v", addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	start()
	t.Cleanup(stop)
	return addr, func() { stop(); start() }
}

// TestRedisRestart kills Redis (SIGKILL) under load and starts it again on
// its AOF: no enqueued job is lost, duplicates are counted (at-least-once),
// and the queue ends empty.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	addr, restart := ownRedis(t)
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	b, err := New(context.Background(), Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	q := testQueue(t)
	p, err := ap.New(b, ap.Config{
		Queues: map[string]ap.QueueConfig{q: {Concurrency: 8}},
		Lease:  500 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	const n = 300
	if err := p.Handle("r", func(ctx context.Context, j *ap.Job) error {
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		seen[j.ID]++
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	var jobs []*ap.Job
	for i := range n {
		j := &ap.Job{ID: fmt.Sprintf("job-%d", i), Type: "r", Queue: q}
		ids = append(ids, j.ID)
		jobs = append(jobs, j)
	}
	if err := p.EnqueueBatch(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitUntil("some jobs done", func() bool { return count() >= n/5 })
	restart()
	waitUntil("every job handled", func() bool { return count() == n })
	waitUntil("the queue empty", func() bool {
		st, err := b.Stats(ctx, q)
		return err == nil && st.Ready+st.Scheduled+st.InFlight+st.Dead == 0
	})
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var lost, dup int
	for _, id := range ids {
		switch seen[id] {
		case 0:
			lost++
		case 1:
		default:
			dup += seen[id] - 1
		}
	}
	t.Logf("lost %d, duplicated %d, unexpected %d, queue empty at the end", lost, dup, len(seen)-n+lost)
	if lost > 0 {
		t.Fatalf("%d jobs lost", lost)
	}
}
