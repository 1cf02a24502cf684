package nats

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestHoldMarkers shows the markers between NextDead and DeleteDead (see
// hold.go) on what the conformance suite cannot stage: a hold whose holder
// vanished lapses, so DeleteDead deletes the record then; a DeleteDead
// under way keeps NextDead off its record until its marker lapses; and a
// holder's renewals (ExtendDead) keep its hold live past one DeadHold.
func TestHoldMarkers(t *testing.T) {
	t.Parallel()
	b := deadEnv(t, realURL(t), jetstream.FileStorage)
	q := queueName(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deadLetter(t, b, q, "a")
	deadLetter(t, b, q, "b")
	seqs := map[string]uint64{}
	if err := b.walkDead(ctx, q, 1, func(m *jetstream.RawStreamMsg) bool {
		seqs[m.Header.Get(hdrDeadID)] = m.Sequence
		return true
	}); err != nil || len(seqs) != 2 {
		t.Fatalf("walk: %v, %v", seqs, err)
	}
	if _, err := b.holdStream(ctx); err != nil {
		t.Fatal(err)
	}

	// A holder that vanished: its marker stands for its lease, then lapses.
	if _, err := b.writeMarker(ctx, b.holdSubject(q, seqs["a"]), holdKeep, time.Second, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := b.DeleteDead(ctx, q, []string{"a"}); err != nil || n != 0 {
		t.Fatalf("DeleteDead of a record with a live hold: %d, %v; want 0", n, err)
	}
	time.Sleep(1200 * time.Millisecond)
	if n, err := b.DeleteDead(ctx, q, []string{"a"}); err != nil || n != 1 {
		t.Fatalf("DeleteDead of a record whose hold lapsed: %d, %v; want 1", n, err)
	}

	// A DeleteDead under way on b: NextDead passes it by until its marker
	// lapses.
	if _, err := b.writeMarker(ctx, b.holdSubject(q, seqs["b"]), holdDelete, 1500*time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	if dd, err := b.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Fatalf("NextDead while a DeleteDead marks the only record: %v, %v; want ErrNoDeadLetters", dd, err)
	}
	var dd *driver.DeadDelivery
	deadline := time.Now().Add(15 * time.Second)
	for dd == nil {
		var err error
		dd, err = b.NextDead(ctx, q)
		if err != nil && (!errors.Is(err, driver.ErrNoDeadLetters) || time.Now().After(deadline)) {
			t.Fatalf("NextDead once the deletion's marker lapsed: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if dd.ID != "b" {
		t.Fatalf("NextDead: %s, want b", dd.ID)
	}

	// The holder renews its hold with ExtendDead: after more than a
	// DeadHold, DeleteDead still leaves the record, and the holder can
	// settle it.
	for end := time.Now().Add(b.cfg.DeadHold + time.Second); time.Now().Before(end); {
		if err := b.ExtendDead(ctx, dd); err != nil {
			t.Fatalf("ExtendDead of a live hold: %v", err)
		}
		time.Sleep(b.cfg.DeadHold / 3)
	}
	if n, err := b.DeleteDead(ctx, q, []string{"b"}); err != nil || n != 0 {
		t.Fatalf("DeleteDead of a record held for longer than a DeadHold: %d, %v; want 0", n, err)
	}
	if err := b.SettleDead(ctx, dd, false); err != nil {
		t.Fatalf("SettleDead(keep): %v", err)
	}
	if n, err := b.DeleteDead(ctx, q, []string{"b"}); err != nil || n != 1 {
		t.Fatalf("DeleteDead once the holder let go: %d, %v; want 1", n, err)
	}
}
