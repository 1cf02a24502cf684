package nats

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/conformance/faults"
)

// TestFilteredPurgeFact records why the backend never purges: it purges one
// subject of a stream while a consumer has a message of another subject
// pending and one not yet delivered, and logs what the consumer still gets.
// On nats-server 2.9.10 it gets nothing: both messages stay in the stream,
// undeliverable. The in-process 2.15 server delivers both.
func TestFilteredPurgeFact(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"server":    func(t *testing.T) string { return realURL(t) },
		"inprocess": func(t *testing.T) string { return startServer(t, t.TempDir(), 0).ClientURL() },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			nc, err := gonats.Connect(url(t))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			stream := "PURGEFACT_" + token(queueName(t))[:6] + name
			s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage})
			if err != nil {
				t.Fatal(err)
			}
			defer js.DeleteStream(ctx, stream)
			c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxAckPending: -1})
			if err != nil {
				t.Fatal(err)
			}
			for _, subj := range []string{"x", "y", "x"} {
				if _, err := js.Publish(ctx, stream+"."+subj, []byte(subj)); err != nil {
					t.Fatal(err)
				}
			}
			get := func(ack bool) jetstream.Msg {
				b, _ := c.Fetch(1, jetstream.FetchMaxWait(1500*time.Millisecond))
				m, ok := <-b.Messages()
				if ok && ack {
					_ = m.Ack()
				}
				return m
			}
			_ = get(false).NakWithDelay(100 * time.Millisecond) // pending, as the mover's are
			if err := s.Purge(ctx, jetstream.WithPurgeSubject(stream+".y")); err != nil {
				t.Fatal(err)
			}
			got := 0
			for i := 0; i < 2; i++ {
				if get(true) != nil {
					got++
				}
			}
			info, _ := s.Info(ctx)
			t.Logf("%s: after purging another subject the consumer got %d of 2 messages; %d left in the stream", nc.ConnectedServerVersion(), got, info.State.Msgs)
		})
	}
}

// natsServerEnv names another nats-server binary for TestNATSKillFact.
const natsServerEnv = "ASYNCPLATFORM_NATS_SERVER"

// TestNATSKillFact records what nats-server keeps of a work-queue consumer
// across a restart, with nats.go alone (no platform code): a file-stored
// work-queue stream and a durable pull consumer with explicit acks; 40
// messages; 10 fetched and 5 of them acked (double acks, confirmed by the
// server); a second's pause; 1 fetched and acked (the consumer state is
// then written at once); 10 more fetched and 5 of them acked, within 100 ms
// of that write; 5 more published; then the server is stopped at once,
// with SIGTERM or SIGKILL, and started again on the same store. Everything
// is fetched again and each message's NumDelivered compared with what it
// should be: an acked message gone, a pending one back with NumDelivered 2,
// the rest with 1. ASYNCPLATFORM_NATS_SERVER names another binary.
//
// A SIGTERM keeps all of it. After a SIGKILL, on 2.9.10 here: the 5 late
// acked messages come back, as first deliveries (NumDelivered 1), and the
// 5 late delivered ones come back as first deliveries too; nothing
// published is lost, and what happened a second earlier is kept. The
// consumer store writes its state at most every 100 ms ("approximately 10
// updates per second per consumer", filestore.go, flushLoop) and a SIGKILL
// loses what it had not written yet; 2.9 also keeps a block's deletes in an
// index written at most every 0.5 s (2 s for in-order deletes) when another
// delete comes, so recent acks on a work-queue stream are lost too. A
// server built from the module's v2.15.2 keeps the acks (no acked message
// comes back) but forgets the late deliveries just the same.
//
// A forgotten delivery is one the job's try count misses: its attempt is
// not counted if it ended with no outcome (see docs/reliability.md).
func TestNATSKillFact(t *testing.T) {
	bin := natsServerBin(t)
	for _, kill := range []bool{false, true} {
		name := "SIGTERM"
		if kill {
			name = "SIGKILL"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			natsKillFact(t, bin, kill)
		})
	}
}

// natsFact starts a nats-server of bin's on file storage and makes a
// work-queue stream on fact.> with a durable pull consumer "c" (explicit
// acks, AckWait ackWait), for the NATS fact tests. The server, connection
// and context end with the test.
func natsFact(t *testing.T, bin string, ackWait time.Duration) (*faults.Server, *gonats.Conn, jetstream.JetStream, jetstream.Stream, jetstream.Consumer, context.Context) {
	dir, port := t.TempDir(), freePort(t)
	hostport := fmt.Sprintf("127.0.0.1:%d", port)
	srv := faults.StartServer(t, faults.ServerConfig{Bin: bin, Dir: dir, HostPort: hostport,
		Args: []string{"-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", dir}})
	nc, err := gonats.Connect("nats://"+hostport, gonats.MaxReconnects(-1), gonats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FACT", Subjects: []string{"fact.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: ackWait, MaxDeliver: -1, MaxAckPending: -1})
	if err != nil {
		t.Fatal(err)
	}
	return srv, nc, js, s, c, ctx
}

// natsServerBin is the nats-server binary for the fact tests:
// ASYNCPLATFORM_NATS_SERVER, or the one on PATH; the test skips without one.
func natsServerBin(t *testing.T) string {
	bin := os.Getenv(natsServerEnv)
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("nats-server"); err != nil {
			t.Skipf("no nats-server binary: %v", err)
		}
	}
	return bin
}

func natsKillFact(t *testing.T, bin string, kill bool) {
	const ackWait = 3 * time.Second
	srv, nc, js, _, c, ctx := natsFact(t, bin, ackWait)
	const n, last = 40, 5 // the last 5 are published just before the stop
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, "fact.x", []byte(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0, n-last)

	// want is what each message should show after the restart: 0 gone
	// (acked), else its NumDelivered.
	want := make([]uint64, n)
	for i := range want {
		want[i] = 1
	}
	fetchAck := func(phase string, count, acks int) {
		b, err := c.Fetch(count, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for m := range b.Messages() {
			i, _ := strconv.Atoi(string(m.Data()))
			if k < acks {
				if err := m.DoubleAck(ctx); err != nil {
					t.Fatalf("%s: ack %d: %v", phase, i, err)
				}
				want[i] = 0
			} else {
				want[i] = 2
			}
			k++
		}
		if k != count {
			t.Fatalf("%s: fetched %d, want %d", phase, k, count)
		}
	}
	fetchAck("early", 10, 5)
	time.Sleep(time.Second)   // longer than the consumer store's flush interval (100 ms)
	fetchAck("trigger", 1, 1) // the consumer state is written at once
	fetchAck("late", 10, 5)   // within 100 ms of that write
	publish(n-last, n)
	if err := srv.Restart(kill); err != nil {
		t.Fatal(err)
	}

	got := map[int][]uint64{}
	for quiet := time.Now(); time.Since(quiet) < ackWait+3*time.Second; {
		b, err := c.Fetch(20, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			time.Sleep(100 * time.Millisecond) // reconnecting
			continue
		}
		for m := range b.Messages() {
			i, _ := strconv.Atoi(string(m.Data()))
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			got[i] = append(got[i], md.NumDelivered)
			if err := m.DoubleAck(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				t.Logf("ack %d after the restart: %v", i, err)
			}
			quiet = time.Now()
		}
	}

	var back, reset, lost, ok []string
	for i := range n {
		g := got[i]
		switch {
		case want[i] == 0 && len(g) > 0:
			back = append(back, fmt.Sprintf("%d:%v", i, g))
		case want[i] > 0 && len(g) == 0:
			lost = append(lost, strconv.Itoa(i))
		case want[i] == 2 && g[0] < 2:
			reset = append(reset, fmt.Sprintf("%d:%v", i, g))
		case want[i] > 0 && g[0] == want[i]:
			ok = append(ok, strconv.Itoa(i))
		}
	}
	sort.Strings(back)
	t.Logf("%s, %s: acked messages back after the restart (message:NumDelivered): %d %v; delivered messages back as first deliveries: %d %v; unacked lost: %d %v; as expected: %d of %d",
		nc.ConnectedServerVersion(), map[bool]string{false: "SIGTERM", true: "SIGKILL"}[kill],
		len(back), strings.Join(back, " "), len(reset), strings.Join(reset, " "), len(lost), lost, len(ok)+len(back)*0, n)
	if len(lost) > 0 {
		t.Errorf("unacked messages lost across the restart: %v", lost)
	}
	if !kill && len(back)+len(reset) > 0 {
		t.Errorf("a graceful restart lost consumer state")
	}
}

// BenchmarkNATSOwnCounter prices what keeping a delivery counter of the
// backend's own would add to each job on NATS (see docs/reliability.md):
// Plain is a job's broker work today (a sync publish, a fetch of one, a
// double ack); Counted adds, per delivery, a counter append that must be
// the subject's first (Nats-Expected-Last-Subject-Sequence 0, one round
// trip) and, at the settle, its deletion (one more). c goroutines, nats.go
// only, against the machine's server.
//
// Run: go test -run '^$' -bench NATSOwnCounter -benchtime 5000x ./backend/nats/
func BenchmarkNATSOwnCounter(b *testing.B) {
	url := os.Getenv(URLEnv)
	if url == "" {
		url = gonats.DefaultURL
	}
	nc, err := gonats.Connect(url)
	if err != nil {
		b.Skipf("no NATS at %s: %v", url, err)
	}
	defer nc.Close()
	for _, counted := range []bool{false, true} {
		name := map[bool]string{false: "Plain", true: "Counted"}[counted]
		b.Run(name+"/c10", func(b *testing.B) { benchOwnCounter(b, nc, counted, 10) })
	}
}

func benchOwnCounter(b *testing.B, nc *gonats.Conn, counted bool, conc int) {
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	name := "OWNCNT_" + rand.Text()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	defer js.DeleteStream(ctx, name)
	cs, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + "_CNT", Subjects: []string{name + "_cnt.>"},
		Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	defer js.DeleteStream(ctx, name+"_CNT")
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 30 * time.Second, MaxAckPending: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	jobs := make(chan int, b.N)
	for i := range b.N {
		jobs <- i
	}
	close(jobs)
	errs := make(chan error, conc)
	for range conc {
		go func() {
			errs <- func() error {
				for range jobs {
					if _, err := js.Publish(ctx, name+".q", benchBody); err != nil {
						return err
					}
					mb, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
					if err != nil {
						return err
					}
					for m := range mb.Messages() {
						md, err := m.Metadata()
						if err != nil {
							return err
						}
						var cseq uint64
						if counted {
							pa, err := js.Publish(ctx, fmt.Sprintf("%s_cnt.q.%d", name, md.Sequence.Stream), []byte("1"),
								jetstream.WithExpectLastSequencePerSubject(0))
							if err != nil {
								return err
							}
							cseq = pa.Sequence
						}
						if err := m.DoubleAck(ctx); err != nil {
							return err
						}
						if counted {
							if err := cs.DeleteMsg(ctx, cseq); err != nil {
								return err
							}
						}
					}
				}
				return nil
			}()
		}()
	}
	for range conc {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}

var benchBody = make([]byte, 64)

// TestNATSKillLeftoversFact records what a SIGKILL of nats-server can leave
// in a work-queue stream, with nats.go alone (no platform code): 20
// messages published, 10 fetched and double-acked, and the server SIGKILLed
// 400 ms later (after the consumer store wrote its state, at most 100 ms
// after a change; before the stream wrote its deletes) and started again on
// the same store. Then everything the consumer hands out is fetched and
// acked until it is quiet for three AckWaits.
//
// On 2.9.10 here: the consumer comes back with its ack floor at 10 and 10
// messages to deliver, and the stream with all 20. The 10 acked messages
// are never handed out again and stay in the stream for ever (after the
// drain: 10 messages, first sequence 1): 2.9 keeps a block's deletes in an
// index written only when a later delete finds the last write 0.5 s old
// (2 s for deletes in order), or by the 60 s sync. backend/nats sweeps
// such leftovers (TestSweepAfterKill there). The test fails only if an
// unacked message is lost.
func TestNATSKillLeftoversFact(t *testing.T) {
	const ackWait = time.Second
	srv, nc, js, s, c, ctx := natsFact(t, natsServerBin(t), ackWait)
	for i := 1; i <= 20; i++ {
		if _, err := js.Publish(ctx, "fact.x", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	b, err := c.Fetch(10, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(400 * time.Millisecond)
	if err := srv.Restart(true); err != nil {
		t.Fatal(err)
	}
	state := func(when string) {
		si, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ci, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s, %s: stream: %d messages, first %d, last %d; consumer: ack floor %d, delivered %d, %d to deliver, %d pending",
			nc.ConnectedServerVersion(), when, si.State.Msgs, si.State.FirstSeq, si.State.LastSeq, ci.AckFloor.Stream, ci.Delivered.Stream, ci.NumPending, ci.NumAckPending)
	}
	state("after the kill")
	got := map[int]bool{}
	for quiet := time.Now(); time.Since(quiet) < 3*ackWait; {
		b, err := c.Fetch(20, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			time.Sleep(100 * time.Millisecond) // reconnecting
			continue
		}
		for m := range b.Messages() {
			i, _ := strconv.Atoi(string(m.Data()))
			got[i] = true
			_ = m.DoubleAck(ctx)
			quiet = time.Now()
		}
	}
	state("drained")
	for i := 11; i <= 20; i++ {
		if !got[i] {
			t.Errorf("message %d, never acked, was not handed out after the kill", i)
		}
	}
}
