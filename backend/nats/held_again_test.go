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

// TestHeldRecordNotRescued: the oldest record a is held (the consumer's ack
// floor is then 0) while a record b sits in the stream that the consumer
// will not deliver again (acked and not deleted: what the server's subject
// index can make of a record, see rescueDead). A NextDead that finds
// nothing to pull looks for stranded records; it must not move a, which
// would hand it out under a new sequence, without its hold marker, while
// its holder lives (DeadLetterHolderKilled on nats-server 2.9.10: "moved
// dead letters the server's subject index had lost", moved=1, the held
// record handed to a drain caller). Once a is popped, b is rescued.
func TestHeldRecordNotRescued(t *testing.T) {
	t.Parallel()
	b := deadEnv(t, realURL(t), jetstream.FileStorage)
	b.cfg.DeadHold = 30 * time.Second // a outlives the test without renewals
	q := queueName(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deadLetter(t, b, q, "a")
	deadLetter(t, b, q, "b")

	held, err := b.NextDead(ctx, q)
	if err != nil || held.ID != "a" {
		t.Fatalf("NextDead: %v, %v; want record a", held, err)
	}
	passed, err := b.NextDead(ctx, q)
	if err != nil || passed.ID != "b" {
		t.Fatalf("NextDead: %v, %v; want record b", passed, err)
	}
	r, err := deadReceipt(passed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.nc.Request(r.reply, ackAck, 10*time.Second); err != nil { // the consumer is done with b; the stream keeps it
		t.Fatal(err)
	}
	b.dropMarkerWait(ctx, r.holdSeq)

	for range 3 {
		if dd, err := b.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
			if dd != nil {
				t.Fatalf("NextDead handed out %s while a live caller holds a and b waits behind it; want ErrNoDeadLetters", dd.ID)
			}
			t.Fatalf("NextDead while a is held: %v; want ErrNoDeadLetters", err)
		}
	}
	if err := b.SettleDead(ctx, held, true); err != nil {
		t.Fatalf("the holder's pop of a: %v", err)
	}
	dd, err := b.NextDead(ctx, q)
	if err != nil || dd.ID != "b" {
		t.Fatalf("NextDead once a is popped: %v, %v; want record b, rescued", dd, err)
	}
	if err := b.SettleDead(ctx, dd, true); err != nil {
		t.Fatal(err)
	}
}
