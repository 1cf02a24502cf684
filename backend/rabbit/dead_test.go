package rabbit

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestDeadUpgrade: a queue of the layout before issue 24, whose dead
// letters sit in a classic queue p.q.dead, upgrades to the quorum
// dead-letter queue p.q:dead without losing a record: every record is
// moved in its order, one held by a NextDead caller of the old version
// meanwhile is moved once it is let go, and Stats counts both queues until
// then.
func TestDeadUpgrade(t *testing.T) {
	t.Parallel()
	b := newBackend(t, Config{})
	ctx := testCtx(t)
	q := queueName(t, b)
	const n = 300

	// The old layout, as the backend before issue 24 made it.
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
