package nats

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestHeldRecordNotHandedOutAgain: a dead letter a live caller holds that
// the consumer hands out again (here a nak sent on the holder's delivery
// stands for the server's redelivery: a lapsed AckWait, or nats-server
// 2.9's #5305, seen as s4ci1's DeadLetterHolderKilled failure) is not the
// next caller's while the holder's marker is live: the next caller gets
// ErrNoDeadLetters, and the holder still pops it. A record kept is at once
// the next caller's (its marker goes before the nak).
func TestHeldRecordNotHandedOutAgain(t *testing.T) {
	t.Parallel()
	b := deadEnv(t, realURL(t), jetstream.FileStorage)
	q := queueName(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deadLetter(t, b, q, "a")

	held, err := b.NextDead(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	r, err := deadReceipt(held)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Publish(r.reply, ackNak); err != nil { // the consumer hands it out again
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if dd, err := b.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
			if dd != nil {
				t.Fatalf("NextDead handed out %s, which a live caller holds; want ErrNoDeadLetters", dd.ID)
			}
			t.Fatalf("NextDead while the only record is held: %v; want ErrNoDeadLetters", err)
		}
	}
	if err := b.ExtendDead(ctx, held); err != nil {
		t.Fatalf("the holder's ExtendDead after the record was handed out again: %v", err)
	}
	if err := b.SettleDead(ctx, held, true); err != nil {
		t.Fatalf("the holder's pop: %v", err)
	}
	st, err := b.Stats(ctx, q)
	if err != nil || st.Dead != 0 {
		t.Fatalf("after the pop: %+v, %v; want no dead letters", st, err)
	}

	// Peek then pop: a kept record is the next caller's at once.
	deadLetter(t, b, q, "b")
	peek, err := b.NextDead(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SettleDead(ctx, peek, false); err != nil {
		t.Fatal(err)
	}
	pop, err := b.NextDead(ctx, q)
	if err != nil || pop.ID != "b" {
		t.Fatalf("NextDead right after a keep: %v, %v; want record b", pop, err)
	}
	if err := b.SettleDead(ctx, pop, true); err != nil {
		t.Fatal(err)
	}
}
