package rabbit

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestDeadUpgrade: a queue of the older layout, whose dead letters sit in
// a classic queue p.q.dead, upgrades to the quorum dead-letter queue
// p.q:dead without losing a record: every record is moved in its order,
// one held by a NextDead caller of the old version meanwhile is moved once
// it is let go, and Stats counts both queues until then.
func TestDeadUpgrade(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := testCtx(t)
	q := queueName(t, b)
	const n = 300

	// The older layout, as older versions of the backend make it.
	conn, err := amqp.Dial(testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(b.workName(q), true, false, false, false, workArgs()); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(b.legacyDeadName(q), true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	for i := range n {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", b.legacyDeadName(q), true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			MessageId:    fmt.Sprintf("r%03d", i),
			Timestamp:    base.Add(time.Duration(i) * time.Second),
			Body:         []byte(fmt.Sprint(i)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish r%03d not confirmed: %v", i, err)
		}
	}
	// An old-version NextDead caller holds the oldest record.
	holder, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	held, ok, err := holder.Get(b.legacyDeadName(q), false)
	if err != nil || !ok || held.MessageId != "r000" {
		t.Fatalf("holding r000: %v %v %q", ok, err, held.MessageId)
	}

	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	list := func() []string {
		var ids []string
		for cursor := ""; ; {
			recs, next, err := b.ListDead(ctx, q, cursor, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				ids = append(ids, r.ID)
			}
			if next == "" {
				return ids
			}
			cursor = next
		}
	}
	ids := list()
	if len(ids) != n-1 {
		t.Fatalf("after the upgrade the quorum dead-letter queue lists %d records, want %d (all but the held one)", len(ids), n-1)
	}
	for i, id := range ids {
		if want := fmt.Sprintf("r%03d", i+1); id != want {
			t.Fatalf("record %d after the upgrade is %s, want %s (the old order)", i, id, want)
		}
	}
	st, err := b.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dead != n-1 {
		t.Errorf("Stats.Dead while one record is held in the old queue: %d, want %d", st.Dead, n-1)
	}

	// The holder lets go: the record is back in the old queue, counted, and
	// the next dead-letter call moves it.
	if err := holder.Nack(held.DeliveryTag, false, true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := b.Stats(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if st.Dead == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats.Dead after the old holder let go: %d, want %d", st.Dead, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	dd, err := b.NextDead(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if dd.ID != "r000" {
		t.Errorf("NextDead after the upgrade hands out %s, want the oldest, r000", dd.ID)
	}
	if err := b.SettleDead(ctx, dd, false); err != nil {
		t.Fatal(err)
	}
	ids = list()
	seen := map[string]int{}
	for _, id := range ids {
		seen[id]++
	}
	for i := range n {
		if id := fmt.Sprintf("r%03d", i); seen[id] != 1 {
			t.Errorf("record %s listed %d times after the upgrade, want once", id, seen[id])
		}
	}
	if len(ids) != n || ids[0] != "r000" || ids[n-1] != fmt.Sprintf("r%03d", n-1) {
		t.Errorf("after the upgrade: %d records, first %s, last %s; want %d, r000 .. r%03d", len(ids), ids[0], ids[len(ids)-1], n, n-1)
	}
	q0, err := ch.QueueDeclarePassive(b.legacyDeadName(q), true, false, false, false, nil)
	if err != nil || q0.Messages != 0 {
		t.Errorf("the old dead-letter queue after the upgrade: %d records, %v; want 0", q0.Messages, err)
	}
}

// seedDeadRecords publishes n records straight to queue's dead-letter
// queue, in order, as DeadLetter writes them, and returns their IDs.
func seedDeadRecords(t *testing.T, b *Backend, queue string, n int) []string {
	t.Helper()
	ctx := testCtx(t)
	if err := b.Declare(ctx, queue); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	msgs := make([]outMsg, n)
	base := time.Now().UnixNano()
	for i := range ids {
		ids[i] = fmt.Sprintf("r%04d", i)
		msgs[i] = outMsg{key: b.deadName(queue), pub: amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			MessageId:    ids[i],
			Headers:      amqp.Table{deadSeqHeader: base + int64(i)},
			Body:         []byte(ids[i]),
		}}
	}
	if err := b.publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	return ids
}

// listAll lists every record of queue's dead-letter queue, in order.
func listAll(t *testing.T, b *Backend, queue string) []string {
	t.Helper()
	recs, next, err := b.ListDead(testCtx(t), queue, "", 10000)
	if err != nil || next != "" {
		t.Fatalf("ListDead: %v (next %q)", err, next)
	}
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ids
}

// TestDeadReadsTakeTurns: a dead-letter read takes every record off the
// queue for a moment, so reads from two processes (two connections) at
// once must take turns: each listing sees every record, and a DeleteDead
// beside listings removes exactly the records asked for (in CI, asyncctl's
// redrive deleted nothing while the test's own listing held the records,
// and left them in place: TestSIGINTRedrive).
func TestDeadReadsTakeTurns(t *testing.T) {
	t.Parallel()
	b1 := newBackend(t, Config{})
	b2 := newBackend(t, Config{})
	q := queueName(t, b1)
	const n = 200
	ids := seedDeadRecords(t, b1, q, n)

	// Listings only: each sees all n.
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for _, b := range []*Backend{b1, b2, b2} {
		wg.Go(func() {
			for range 8 {
				recs, _, err := b.ListDead(testCtx(t), q, "", 10000)
				if err == nil && len(recs) != n {
					err = fmt.Errorf("a listing beside others saw %d of %d records", len(recs), n)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()

	// Deletes beside listings: each removes its 20 records, and the
	// listings see every record not deleted yet.
	deleted := make(chan int, n)
	wg.Go(func() {
		for i := 0; i < 100; i += 20 {
			got, err := b2.DeleteDead(testCtx(t), q, ids[i:i+20])
			if err == nil && got != 20 {
				err = fmt.Errorf("DeleteDead of 20 records beside listings removed %d", got)
			}
			if err != nil {
				errs <- err
				return
			}
			deleted <- got
		}
	})
	for range 2 {
		wg.Go(func() {
			for range 6 {
				recs, _, err := b1.ListDead(testCtx(t), q, "", 10000)
				if err == nil && (len(recs) < n-100 || len(recs) > n) {
					err = fmt.Errorf("a listing beside deletes saw %d records, want %d to %d", len(recs), n-100, n)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := listAll(t, b1, q); !slices.Equal(got, ids[100:]) {
		t.Errorf("left after deleting the first 100: %d records, want %d (%v...)", len(got), n-100, got[:min(5, len(got))])
	}
}

// TestDeleteDeadAcksApplied: the acks of a DeleteDead are applied before
// its channel closes. RabbitMQ 3.10's quorum-queue client in the broker
// holds a channel's settles back beyond a few dozen unapplied commands and
// drops them when the channel closes: 500 acks then a close left up to 466
// of the records in place (the records come back). deleteScan's barrier
// (basic.cancel, then basic.get) waits for them.
func TestDeleteDeadAcksApplied(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	q := queueName(t, b)
	ctx := testCtx(t)
	ids := seedDeadRecords(t, b, q, 1000)
	left := ids
	for round := range 3 {
		del := map[string]bool{}
		var keep []string
		for i, id := range left {
			if i%2 == 0 {
				del[id] = true
			} else {
				keep = append(keep, id)
			}
		}
		unlock, err := b.lockDead(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		returned, found, err := b.deleteScan(ctx, q, del, true)
		seen := b.waitReady(ctx, b.deadName(q), returned)
		unlock()
		if err != nil {
			t.Fatal(err)
		}
		if len(found) != len(del) || returned != len(keep) {
			t.Fatalf("round %d: found %d of %d, returned %d of %d", round, len(found), len(del), returned, len(keep))
		}
		time.Sleep(200 * time.Millisecond) // acks not applied come back with the returns, or later
		if n := b.ready(ctx, b.deadName(q)); seen != returned || n != returned {
			t.Fatalf("round %d: acked %d and returned %d, but %d then %d records are ready: acks were dropped", round, len(del), returned, seen, n)
		}
		left = keep
	}
	if got := listAll(t, b, q); !slices.Equal(got, left) {
		t.Fatalf("left %d records, want %d", len(got), len(left))
	}
}

// TestDeleteDeadRecounts: when the queue counts more records after a
// DeleteDead's acks than it handed back (an ack not applied, or a record
// dead-lettered meanwhile), DeleteDead looks again for what it acked and
// counts only what is gone. Shown with the barrier of deleteScan turned off
// (so acks are dropped now and then) and a record arriving in every round.
func TestDeleteDeadRecounts(t *testing.T) {
	b := newBackend(t, Config{})
	q := queueName(t, b)
	ctx := testCtx(t)
	ids := seedDeadRecords(t, b, q, 600)
	ackBarrier = false
	arrive := 0
	var wg sync.WaitGroup
	afterAcks = func() { // a record arrives while the channel closes
		arrive++
		m := outMsg{key: b.deadName(q), pub: amqp.Publishing{MessageId: fmt.Sprintf("late%d", arrive), Headers: amqp.Table{deadSeqHeader: time.Now().UnixNano()}}}
		wg.Go(func() {
			if err := b.publish(ctx, m); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(func() { wg.Wait(); ackBarrier, afterAcks = true, nil })
	left := ids
	for range 3 {
		var del, keep []string
		for i, id := range left {
			if i%2 == 0 {
				del = append(del, id)
			} else {
				keep = append(keep, id)
			}
		}
		n, err := b.DeleteDead(ctx, q, del)
		if err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		got := listAll(t, b, q)
		var still []string
		for _, id := range got {
			if slices.Contains(del, id) {
				still = append(still, id)
			}
		}
		if n != len(del)-len(still) {
			t.Fatalf("DeleteDead of %d returned %d, but %d of them are still there", len(del), n, len(still))
		}
		left = append(keep, still...)
		slices.Sort(left)
	}
	if arrive < 3 {
		t.Fatalf("%d records arrived during the deletes, want one a round at least", arrive)
	}
}
