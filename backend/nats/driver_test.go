package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestDriverSmoke walks the driver primitives once against the machine's
// server (2.9): delayed enqueue through the mover, extension, requeue, and
// the dead-letter half. The behaviour contract itself is checked by
// TestConformance.
func TestDriverSmoke(t *testing.T) {
	url := realURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := queueName(t)
	b := newBackend(t, url, q)
	lease := time.Second

	// Delayed enqueue: not before NotBefore.
	nb := time.Now().Add(700 * time.Millisecond)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: q + "-d", Body: []byte("late"), NotBefore: nb}}); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Stats(ctx, q); st.Scheduled != 1 {
		t.Errorf("stats after delayed enqueue: %+v", st)
	}
	ds, err := b.Receive(ctx, q, 5, lease)
	if err != nil {
		t.Fatal(err)
	}
	if now := time.Now(); now.Before(nb) {
		t.Fatalf("delayed message delivered %v early", nb.Sub(now))
	}
	t.Logf("delayed message delivered %v after NotBefore", time.Since(nb))
	if string(ds[0].Body) != "late" || ds[0].Deliveries != 1 {
		t.Fatalf("got %q with %d deliveries", ds[0].Body, ds[0].Deliveries)
	}
	if err := b.Extend(ctx, ds[0], lease); err != nil {
		t.Fatalf("extend: %v", err)
	}
	// Requeue resets the count.
	if err := b.Requeue(ctx, ds[0], driver.Message{ID: q + "-d.1", Body: []byte("again")}); err != nil {
		t.Fatal(err)
	}
	ds, err = b.Receive(ctx, q, 5, lease)
	if err != nil {
		t.Fatal(err)
	}
	if string(ds[0].Body) != "again" || ds[0].Deliveries != 1 {
		t.Fatalf("got %q with %d deliveries", ds[0].Body, ds[0].Deliveries)
	}
	if err := b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: "j0", Body: []byte("rec0")}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		if err := b.Enqueue(ctx, q, []driver.Message{{ID: fmt.Sprint(q, i), Body: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Receive(ctx, q, 1, lease)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: fmt.Sprint("j", i), Body: []byte(fmt.Sprint("rec", i))}); err != nil {
			t.Fatal(err)
		}
	}
	recs, next, err := b.ListDead(ctx, q, "", 3)
	if err != nil || len(recs) != 3 || next == "" || recs[0].ID != "j0" {
		t.Fatalf("list: %v %q %v", recs, next, err)
	}
	recs, next, err = b.ListDead(ctx, q, next, 3)
	if err != nil || len(recs) != 1 || next != "" || recs[0].ID != "j3" {
		t.Fatalf("list page 2: %v %q %v", recs, next, err)
	}

	// Two holders get different records; keep puts the record back first.
	d1, err := b.NextDead(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := b.NextDead(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if d1.ID != "j0" || d2.ID != "j1" {
		t.Fatalf("next dead: %s, %s", d1.ID, d2.ID)
	}
	if err := b.SettleDead(ctx, d1, false); err != nil {
		t.Fatal(err)
	}
	d3, err := b.NextDead(ctx, q)
	if err != nil || d3.ID != "j0" {
		t.Fatalf("after keep: %v %v", d3, err)
	}
	if err := b.SettleDead(ctx, d3, true); err != nil {
		t.Fatal(err)
	}
	if err := b.SettleDead(ctx, d3, true); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second settle: %v", err)
	}
	if n, err := b.DeleteDead(ctx, q, []string{"j2"}); err != nil || n != 1 {
		t.Fatalf("delete: %d %v", n, err)
	}
	// A holder that vanishes: its record comes back at once on Close.
	b2, err := New(ctx, testConfig(url))
	if err != nil {
		t.Fatal(err)
	}
	h, err := b2.NextDead(ctx, q)
	if err != nil || h.ID != "j3" {
		t.Fatalf("b2 next dead: %v %v", h, err)
	}
	if _, err := b.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Fatalf("all held: %v", err)
	}
	b2.Close()
	if d, err := b.NextDead(ctx, q); err != nil || d.ID != "j3" {
		t.Fatalf("after the holder closed: %v %v", d, err)
	}
	if err := b.SettleDead(ctx, d2, false); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Stats(ctx, q); st.Dead != 2 {
		t.Errorf("stats: %+v", st)
	}
	if n, err := b.PurgeDead(ctx, q); err != nil || n != 2 {
		t.Fatalf("purge: %d %v", n, err)
	}
	if _, err := b.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Fatalf("after purge: %v", err)
	}
}

// TestConnectionCut cuts a worker's connection on the server side while it
// holds a delivery: the connection comes back by itself, the delivery's
// lease survives it (JetStream leases are not tied to a connection), and
// receiving goes on.
func TestConnectionCut(t *testing.T) {
	srv := startServer(t, t.TempDir(), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := queueName(t)
	b := newBackend(t, srv.ClientURL(), q)
	msgs := []driver.Message{{ID: q + "-1", Body: []byte("1")}, {ID: q + "-2", Body: []byte("2")}}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	lease := 20 * time.Second // outlasts a failed pull during the reconnect
	ds, err := b.Receive(ctx, q, 1, lease)
	if err != nil {
		t.Fatal(err)
	}
	id, err := b.nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.DisconnectClientByID(id); err != nil {
		t.Fatal(err)
	}
	// Receive recovers with the connection; a pull sent into the dying
	// connection is sent again, or the Receive fails once, as the
	// platform's retry expects.
	var ds2 []*driver.Delivery
	for ds2 == nil {
		ds2, err = b.Receive(ctx, q, 1, lease)
		if err != nil && ctx.Err() != nil {
			t.Fatal(err)
		}
	}
	if err := b.Ack(ctx, ds[0]); err != nil {
		t.Fatalf("ack after the reconnect: %v", err)
	}
	if err := b.Ack(ctx, ds2[0]); err != nil {
		t.Fatal(err)
	}
	if ds[0].Deliveries != 1 || ds2[0].Deliveries != 1 {
		t.Errorf("deliveries %d and %d, want 1 and 1", ds[0].Deliveries, ds2[0].Deliveries)
	}
	if st, err := b.Stats(ctx, q); err != nil || st.Ready != 0 || st.InFlight != 0 {
		t.Errorf("stats %+v %v: want an empty queue", st, err)
	}
}

// TestDeclareForeignConsumer: a consumer in the queue's name that is not
// ours is an error naming the setting, not a silent misuse.
func TestDeclareForeignConsumer(t *testing.T) {
	url := realURL(t)
	ctx := context.Background()
	q := queueName(t)
	b := newBackend(t, url, q)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	if _, err := b.work.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: workConsumer(q), FilterSubject: b.workSubject(q) + "x", AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	err := b.Declare(ctx, q)
	if err == nil || !strings.Contains(err.Error(), "filters") {
		t.Fatalf("Declare over a foreign consumer: %v, want an error naming its filter", err)
	}
}

// TestLateDeliveryKeepsCount: a delivery that reaches a Receive whose
// caller already left is handed back without counting it, and without
// forgetting the deliveries before it.
func TestLateDeliveryKeepsCount(t *testing.T) {
	url := realURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := queueName(t)
	b := newBackend(t, url, q)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: q, Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	lease := 300 * time.Millisecond
	if _, err := b.Receive(ctx, q, 1, lease); err != nil { // delivery 1, never settled: a crash
		t.Fatal(err)
	}
	// A Receive that gives up while its long poll is out; the redelivery
	// (delivery 2) reaches that poll after its caller left.
	rctx, rcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if ds, err := b.Receive(rctx, q, 1, lease); err == nil {
		t.Fatalf("got %d deliveries before the lease ran out", len(ds))
	}
	rcancel()
	ds, err := b.Receive(ctx, q, 1, lease)
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Deliveries != 2 {
		t.Fatalf("deliveries %d, want 2: the crash counts, the late delivery does not", ds[0].Deliveries)
	}
	if err := b.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
}
