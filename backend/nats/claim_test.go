package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestNoSecondHolderAfterStaleRequest is TestStaleRequestFact through the
// backend: a worker holds r (it dies: r is never settled) and s (alive: it
// extends s), a killed worker's pull request is left on the server, r's
// lease runs out, and then another worker receives. It must get r with its
// crash counted, and must not get s, which the first worker still holds: on
// nats-server before 2.10.14 the server hands s out again as a first
// delivery (see claim.go).
func TestNoSecondHolderAfterStaleRequest(t *testing.T) {
	for name, url := range map[string]func(t *testing.T) string{
		"server":    func(t *testing.T) string { return realURL(t) },
		"inprocess": func(t *testing.T) string { return startServer(t, t.TempDir(), 0).ClientURL() },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			u := url(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			q := queueName(t)
			holder := newBackend(t, u, q)
			const lease = time.Second
			if err := holder.Enqueue(ctx, q, []driver.Message{{ID: "r", Body: []byte("r")}, {ID: "s", Body: []byte("s")}}); err != nil {
				t.Fatal(err)
			}
			held, err := holder.Receive(ctx, q, 2, lease)
			if err != nil {
				t.Fatal(err)
			}
			if len(held) != 2 || string(held[1].Body) != "s" {
				t.Fatalf("got %d deliveries, want r and s", len(held))
			}
			s := held[1]
			alive := make(chan struct{})
			extended := make(chan error, 1)
			go func() {
				tick := time.NewTicker(lease / 4)
				defer tick.Stop()
				for {
					select {
					case <-alive:
						extended <- nil
						return
					case <-tick.C:
						if err := holder.Extend(ctx, s, lease); err != nil {
							extended <- err
							return
						}
					}
				}
			}()

			// A worker killed while its long poll is out.
			nc, err := gonats.Connect(u)
			if err != nil {
				t.Fatal(err)
			}
			inbox := nc.NewInbox()
			if _, err := nc.SubscribeSync(inbox); err != nil {
				t.Fatal(err)
			}
			data, _ := json.Marshal(pullRequest{Batch: 1, Expires: time.Minute})
			if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+testStream+"."+workConsumer(q), inbox, data); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			nc.Close()

			time.Sleep(lease + lease/2) // r's lease runs out
			other := newBackend(t, u, q)
			var gotR bool
			rctx, rcancel := context.WithTimeout(ctx, 3*lease)
			defer rcancel()
			for !gotR {
				ds, err := other.Receive(rctx, q, 10, lease)
				if err != nil {
					t.Fatalf("r did not come back: %v", err)
				}
				for _, d := range ds {
					switch string(d.Body) {
					case "s":
						t.Fatalf("s handed to a second worker (deliveries %d) while the first one holds it (server %s)", d.Deliveries, other.nc.ConnectedServerVersion())
					case "r":
						if d.Deliveries < 2 {
							t.Fatalf("r came back with deliveries %d: its crash is not counted", d.Deliveries)
						}
						if err := other.Ack(ctx, d); err != nil {
							t.Fatal(err)
						}
						gotR = true
					}
				}
			}
			close(alive)
			if err := <-extended; err != nil {
				t.Fatalf("the first worker lost s: %v", err)
			}
			if err := holder.Ack(ctx, s); err != nil {
				t.Fatalf("the first worker's ack of s: %v", err)
			}
			// Every claim is deleted once its message is settled.
			left := int64(-1)
			for end := time.Now().Add(5 * time.Second); left != 0 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				left = claimsOf(t, holder, q)
			}
			if left != 0 {
				t.Fatalf("%d claims left after every message was settled", left)
			}
		})
	}
}

// claimsOf counts the queue's claims (0 when there is no claims stream).
func claimsOf(t *testing.T, b *Backend, q string) int64 {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, b.claimName())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(b.cfg.Stream+".claim."+token(q)+".>"))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range info.State.Subjects {
		n += int64(c)
	}
	return n
}

func TestNeedsClaims(t *testing.T) {
	for v, want := range map[string]bool{
		"2.9.10": true, "2.9.25": true, "2.10.0": true, "2.10.13": true, "2.10.14": false, "2.10.29": false,
		"2.11.0-RC.1": false, "2.11.0": false, "2.15.2": false, "3.0.0": false, "1.4.0": true, "": true, "dev": true,
	} {
		if got := needsClaims(v); got != want {
			t.Errorf("needsClaims(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestCASUnsafe(t *testing.T) {
	for v, want := range map[string]bool{
		"2.9.10": true, "2.9.20": true, "2.9.21": false, "2.10.0": false, "2.15.2": false, "": true,
	} {
		if got := casUnsafe(v); got != want {
			t.Errorf("casUnsafe(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestUnclaimInBulk settles deliveries on a server that needs claims and
// counts the deletes and purges of claims the backend sends (seen by a
// subscriber of their API subjects): a few purges, not a delete a job
// (see unclaim). Every claim is gone soon after.
func TestUnclaimInBulk(t *testing.T) {
	t.Parallel()
	u := realURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := queueName(t)
	// Streams of its own: the spy below counts every delete and purge
	// sent to the claims stream, which the package's other tests share.
	b := deadEnv(t, u, jetstream.FileStorage)
	if !b.claiming() {
		t.Skipf("nats-server %s needs no claims", b.nc.ConnectedServerVersion())
	}
	const jobs, batch = 300, 50
	msgs := make([]driver.Message, jobs)
	for i := range msgs {
		msgs[i] = driver.Message{ID: fmt.Sprintf("j%d", i), Body: []byte("x")}
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	spy, err := gonats.Connect(u)
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close()
	var deletes atomic.Int64
	for _, api := range []string{"$JS.API.STREAM.MSG.DELETE.", "$JS.API.STREAM.PURGE."} {
		if _, err := spy.Subscribe(api+b.claimName(), func(*gonats.Msg) { deletes.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	for done := 0; done < jobs; {
		ds, err := b.Receive(ctx, q, batch, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if err := b.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
		done += len(ds)
	}
	left := int64(-1)
	for end := time.Now().Add(claimKeepMax / 2); left != 0 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		left = claimsOf(t, b, q)
	}
	if left != 0 {
		t.Fatalf("%d claims left after every message was settled", left)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	// A purge or two every claimFlushEvery while claims are queued; a
	// delete a job would make jobs.
	n := deletes.Load()
	t.Logf("%d claim deletes and purges for %d jobs", n, jobs)
	if n > jobs/5 {
		t.Fatalf("%d claim deletes and purges for %d jobs, want at most %d", n, jobs, jobs/5)
	}
}

// TestUnclaimBucketBelowFloor holds one message and settles the others:
// the claims of every bucket below the consumer's ack floor are purged
// while the held message keeps the queue busy (see unclaim).
func TestUnclaimBucketBelowFloor(t *testing.T) {
	t.Parallel()
	u := realURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := queueName(t)
	b := newBackend(t, u, q)
	if !b.claiming() {
		t.Skipf("nats-server %s needs no claims", b.nc.ConnectedServerVersion())
	}
	const jobs = 1100 // more than a bucket
	msgs := make([]driver.Message, jobs)
	for i := range msgs {
		msgs[i] = driver.Message{ID: fmt.Sprintf("j%d", i), Body: []byte("x")}
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	var held *driver.Delivery
	for done := 0; done < jobs; {
		ds, err := b.Receive(ctx, q, 100, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			done++
			if done == jobs {
				held = d // the newest: the floor stays below it
				continue
			}
			if err := b.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	left := int64(-1)
	for end := time.Now().Add(claimKeepMax / 2); left >= 1<<claimBucketBits && time.Now().Before(end) || left < 0; time.Sleep(50 * time.Millisecond) {
		left = claimsOf(t, b, q)
	}
	if left >= 1<<claimBucketBits {
		t.Fatalf("%d claims left with one message held, want those of its bucket only (fewer than %d)", left, 1<<claimBucketBits)
	}
	if err := b.Ack(ctx, held); err != nil {
		t.Fatal(err)
	}
}

// TestPurgeBelowFact checks what the idle purge of unclaim relies on: a
// purge with a filter and a sequence removes the filter's messages below
// that sequence only, leaving later ones and other subjects.
func TestPurgeBelowFact(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := gonats.Connect(realURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("APPURGE_%d", time.Now().UnixNano())
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	var seqs []uint64
	for _, subj := range []string{"a.1", "b.1", "a.2", "a.3", "b.2"} {
		pa, err := js.Publish(ctx, name+"."+subj, nil)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, pa.Sequence)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(name+".a.>"), jetstream.WithPurgeSequence(seqs[2]+1)); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(name+".>"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{name + ".a.3": 1, name + ".b.1": 1, name + ".b.2": 1}
	if len(info.State.Subjects) != len(want) {
		t.Fatalf("%s: left %v, want %v", nc.ConnectedServerVersion(), info.State.Subjects, want)
	}
	for subj, n := range want {
		if info.State.Subjects[subj] != n {
			t.Fatalf("%s: left %v, want %v", nc.ConnectedServerVersion(), info.State.Subjects, want)
		}
	}
}
