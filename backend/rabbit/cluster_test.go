package rabbit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// The cluster mode: tests on a 3-node RabbitMQ cluster of their own, started
// by scripts/cluster/rabbit.sh. They run only when ASYNCPLATFORM_CLUSTER
// names rabbit (a comma-separated list of backends), never in the default
// run:
//
//	eval "$(scripts/cluster/rabbit.sh start)"
//	ASYNCPLATFORM_CLUSTER=rabbit go test -count=3 -v -run 'TestCluster/Conformance' -timeout 30m ./backend/rabbit/
//	ASYNCPLATFORM_CLUSTER=rabbit go test -count=1 -v -run 'TestCluster/NodeKill' -timeout 30m ./backend/rabbit/
//	scripts/cluster/rabbit.sh stop
const (
	clusterEnv    = "ASYNCPLATFORM_CLUSTER"
	clusterURLEnv = "ASYNCPLATFORM_RABBIT_CLUSTER_URL"
	clusterScript = "../../scripts/cluster/rabbit.sh"
)

// clusterURL returns the URL of the cluster, skipping the test outside the
// cluster mode and failing it when the mode is on and the cluster is not.
func clusterURL(t *testing.T) string {
	t.Helper()
	if !slices.Contains(strings.Split(os.Getenv(clusterEnv), ","), "rabbit") {
		t.Skipf("the cluster mode: set %s=rabbit and start scripts/cluster/rabbit.sh (see cluster_test.go)", clusterEnv)
	}
	u := os.Getenv(clusterURLEnv)
	if u == "" {
		t.Fatalf("%s=rabbit but %s is empty: eval \"$(scripts/cluster/rabbit.sh start)\"", clusterEnv, clusterURLEnv)
	}
	return u
}

func TestCluster(t *testing.T) {
	u := clusterURL(t)
	t.Run("Conformance", func(t *testing.T) { runConformance(t, u) })
	t.Run("DelayRace", func(t *testing.T) { testDelayRace(t, u, Config{}) })
	t.Run("DelayStuck", func(t *testing.T) { testDelayStuck(t, u) })
	t.Run("NodeKill", func(t *testing.T) { testNodeKill(t, u) })
}

// testDelayRace: two Backends (two connections) delay a message each into
// the same new delay queue at the same instant, twenty times over, on
// fresh queues; every message must come back. On 3.10.8 the second
// connection's declare of a new quorum queue returned before the queue had
// its arguments, and its publish got no TTL: it never expired, nor did
// anything behind it (2 of 12 tries with amqp091 alone; see delayed).
func testDelayRace(t *testing.T, rawURL string, cfg Config) {
	cfg.URL, cfg.Logger = rawURL, slog.New(slog.DiscardHandler)
	b1, b2 := newBackend(t, cfg), newBackend(t, cfg)
	ctx := testCtx(t)
	for i := range 20 {
		q := queueName(t, b1)
		for _, b := range []*Backend{b1, b2} {
			if err := b.Declare(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for j, b := range []*Backend{b1, b2} {
			wg.Go(func() {
				m := driver.Message{ID: fmt.Sprintf("m%d", j), NotBefore: time.Now().Add(minStep)}
				if err := b.Enqueue(ctx, q, []driver.Message{m}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a TTL of 50 ms
		got := 0
		for got < 2 {
			ds, err := b1.Receive(rctx, q, 2, time.Minute)
			if err != nil {
				st, _ := b1.Stats(ctx, q)
				t.Fatalf("try %d: %d of 2 delayed messages came back in 10 s (%v); %d still scheduled", i, got, err, st.Scheduled)
			}
			for _, d := range ds {
				if err := b1.Ack(ctx, d); err != nil {
					t.Fatal(err)
				}
			}
			got += len(ds)
		}
		cancel()
	}
}

// testDelayStuck plays testDelayRace with delay publishes that carry no
// expiration of their own, as before the fix in delayed: the race then
// leaves messages with no TTL at the head of new delay queues (without the
// sweeper, 3 runs of 3 failed, at tries 0, 0 and 6), and every one must
// still come back within the 10 s of a try, moved by the delay sweeper.
func testDelayStuck(t *testing.T, rawURL string) {
	delayExpiry.Store(false)
	t.Cleanup(func() { delayExpiry.Store(true) })
	testDelayRace(t, rawURL, Config{DelaySweep: 200 * time.Millisecond})
}

// clusterCtl runs scripts/cluster/rabbit.sh with args.
func clusterCtl(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(clusterScript, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbit.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// nodePort returns the AMQP port of the node b is connected to.
func nodePort(b *Backend) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	uri, _ := amqp.ParseURI(b.nodes[b.node])
	return fmt.Sprint(uri.Port)
}

// killReport is what one node kill cost.
type killReport struct {
	port             string
	connected        bool
	firstEnqueue     time.Duration // from the kill to the first enqueue confirmed after it
	firstClaim       time.Duration // to the first job claimed (handler started) after the kill and then acked
	enqueueFailures  int           // Enqueue calls that failed (and were tried again) meanwhile
	lastFailure      time.Duration // from the kill to the last of them
	lastErr          error         // and its error
	workerOn, prodOn string        // the nodes the worker and producer were connected to after it
}

// testNodeKill runs 2,000 jobs at concurrency 10 through the cluster, and
// meanwhile SIGKILLs the node the clients are connected to, restarts it,
// then SIGKILLs a node they are not connected to and restarts it. It
// reports, per kill, the time to the first enqueue and the first claim
// after it (which must not wait for the killed node to come back), and at
// the end lost (enqueued, never succeeded: must be 0), duplicated and
// unexpected jobs.
func testNodeKill(t *testing.T, rawURL string) {
	const jobs = 2000
	quiet := slog.New(slog.DiscardHandler)
	cfg := Config{URL: rawURL, ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, Logger: quiet}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	producer, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { producer.Close() }) // after queueName's clean-up
	worker, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { worker.Close() })
	q := queueName(t, producer)
	if err := producer.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the queues' Raft names are on disk (see rabbitKillLeaves)

	// The trace of each job: its deliveries to the worker (instance,
	// x-delivery-count, redelivered flag, what Receive did) and the
	// producer's publishes sent again after a lost confirm, printed for
	// each duplicate.
	var (
		tmu   sync.Mutex
		trace = map[string][]string{}
		t0    = time.Now()
	)
	note := func(id, s string) {
		tmu.Lock()
		defer tmu.Unlock()
		trace[id] = append(trace[id], fmt.Sprintf("%.3fs %s", time.Since(t0).Seconds(), s))
	}
	onDelivery := func(d amqp.Delivery, what string) {
		note(d.MessageId, fmt.Sprintf("delivered inst %.8s count %d redelivered %v: %s", instanceOf(d.Headers), deliveryCount(d.Headers), d.Redelivered, what))
	}
	worker.traceDelivery.Store(&onDelivery)
	onResend := func(m outMsg, attempt int) {
		note(m.pub.MessageId, fmt.Sprintf("producer sends inst %.8s again (attempt %d)", instanceOf(m.pub.Headers), attempt))
	}
	producer.traceResend.Store(&onResend)

	var (
		mu        sync.Mutex
		succeeded = map[string]int{}
		how       = map[string][]string{} // each success's copy and counters, to tell a lost ack (a redelivery, crash counted) from a copy stored twice
		claims    []time.Time             // handler starts of acked attempts
		done      = make(chan struct{})
	)
	p, err := asyncplatform.New(worker, asyncplatform.Config{
		Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: 10}},
		Policy: asyncplatform.Policy{PoisonLimit: asyncplatform.Limit(100), BackoffBase: 20 * time.Millisecond, BackoffCap: 100 * time.Millisecond},
		Logger: quiet,
		Hooks: asyncplatform.Hooks{AfterAttempt: func(_ context.Context, a asyncplatform.Attempt) {
			if a.Outcome != asyncplatform.OutcomeSucceeded {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			succeeded[a.Job.ID]++
			how[a.Job.ID] = append(how[a.Job.ID], fmt.Sprintf("copy %d try %d crashes %d", a.Job.CopyNumber(), a.Job.TryCount, a.Job.Crashes))
			claims = append(claims, time.Now().Add(-a.Duration))
			if len(succeeded) == jobs {
				select {
				case <-done:
				default:
					close(done)
				}
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle("k", func(ctx context.Context, j *asyncplatform.Job) error {
		time.Sleep(5 * time.Millisecond)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pp, err := asyncplatform.New(producer, asyncplatform.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}

	var (
		emu      sync.Mutex
		enqAt    []time.Time // when each enqueue was confirmed
		failures []time.Time // when an enqueue failed
		errs     []error     // why
	)
	enqueued := make(chan int, jobs)
	// The last 400 jobs wait for the second kill, so that work goes on
	// through it however long the first node's restart took (one took
	// longer than the rest of the 2,000 enqueues: nothing was left).
	held := jobs - 400
	second := make(chan struct{})
	go func() {
		defer close(enqueued)
		for i := range jobs {
			if i == held {
				select {
				case <-second:
				case <-ctx.Done():
					return
				}
			}
			j := &asyncplatform.Job{ID: fmt.Sprintf("kill-%05d", i), Type: "k", Queue: q}
			for {
				cctx, c := context.WithTimeout(ctx, 5*time.Second)
				err := pp.Enqueue(cctx, j)
				c()
				now := time.Now()
				emu.Lock()
				if err == nil {
					enqAt = append(enqAt, now)
				} else {
					failures = append(failures, now)
					errs = append(errs, err)
				}
				emu.Unlock()
				if err != nil {
					note(j.ID, fmt.Sprintf("Enqueue failed: %v", err))
				}
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			enqueued <- i + 1
			time.Sleep(15 * time.Millisecond)
		}
	}()

	waitEnqueued := func(n int) {
		for got := range enqueued {
			if got >= n {
				return
			}
		}
	}
	first := func(ts []time.Time, after time.Time) time.Duration {
		best := time.Duration(-1)
		for _, x := range ts {
			if d := x.Sub(after); d > 0 && (best < 0 || d < best) {
				best = d
			}
		}
		return best
	}
	kill := func(port string, connected bool, wait time.Duration) killReport {
		r := killReport{port: port, connected: connected}
		clusterCtl(t, "kill", port) // returns once the node's process is gone
		at := time.Now()
		time.Sleep(wait) // the work goes on without the node
		emu.Lock()
		r.firstEnqueue = first(enqAt, at)
		for i, f := range failures {
			if f.After(at) {
				r.enqueueFailures++
				r.lastFailure = f.Sub(at)
				r.lastErr = errs[i]
			}
		}
		emu.Unlock()
		mu.Lock()
		r.firstClaim = first(claims, at)
		mu.Unlock()
		r.workerOn, r.prodOn = nodePort(worker), nodePort(producer)
		if r.firstEnqueue < 0 || r.firstClaim < 0 {
			t.Errorf("node %s killed (connected %v): no enqueue (%v) or claim (%v) in the %v after it; the clients must go on on the other nodes", port, connected, r.firstEnqueue, r.firstClaim, wait)
		}
		if r.workerOn == port || r.prodOn == port {
			t.Errorf("node %s killed: the worker is on %s and the producer on %s", port, r.workerOn, r.prodOn)
		}
		clusterCtl(t, "restart", port)
		clusterCtl(t, "wait")
		return r
	}

	waitEnqueued(400)
	connected := nodePort(worker)
	r1 := kill(connected, true, 15*time.Second)
	waitEnqueued(held)
	var other string
	for _, node := range worker.nodes {
		uri, _ := amqp.ParseURI(node)
		if port := fmt.Sprint(uri.Port); port != nodePort(worker) && port != nodePort(producer) && port != connected {
			other = port
			break
		}
	}
	if other == "" {
		t.Fatalf("no node to kill that neither client is connected to (worker %s, producer %s)", nodePort(worker), nodePort(producer))
	}
	close(second)
	r2 := kill(other, false, 15*time.Second)
	waitEnqueued(jobs)

	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		t.Errorf("not every job succeeded within 5 minutes of the last enqueue")
	}
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopCancel()
	if err := p.Stop(stopCtx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	lost, dup := 0, 0
	for i := range jobs {
		switch n := succeeded[fmt.Sprintf("kill-%05d", i)]; {
		case n == 0:
			lost++
		case n > 1:
			dup++
			id := fmt.Sprintf("kill-%05d", i)
			tmu.Lock()
			t.Logf("duplicated: %s succeeded %d times: %s\n\ttrace: %s", id, n, strings.Join(how[id], "; "), strings.Join(trace[id], "\n\t       "))
			tmu.Unlock()
		}
	}
	unexpected := len(succeeded) - (jobs - lost)
	for _, r := range []killReport{r1, r2} {
		t.Logf("killed node %s (clients connected to it: %v): first enqueue after %v, first claim after %v; %d enqueue calls failed (and were tried again), the last %v after the kill (%v); then worker on %s, producer on %s",
			r.port, r.connected, r.firstEnqueue.Round(time.Millisecond), r.firstClaim.Round(time.Millisecond), r.enqueueFailures, r.lastFailure.Round(time.Millisecond), r.lastErr, r.workerOn, r.prodOn)
	}
	resent := 0
	tmu.Lock()
	for id, ev := range trace {
		for _, e := range ev {
			if strings.Contains(e, "producer sends") {
				resent++
				t.Logf("re-sent: %s: %s", id, strings.Join(ev, "; "))
				break
			}
		}
	}
	tmu.Unlock()
	t.Logf("jobs=%d lost=%d duplicated=%d unexpected=%d resent=%d", jobs, lost, dup, unexpected, resent)
	if lost > 0 || unexpected > 0 {
		t.Errorf("lost %d, unexpected %d", lost, unexpected)
	}
}
