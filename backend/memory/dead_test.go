package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// TestDeadHold: with Config.DeadHold, a hold lasts DeadHold from NextDead
// or the last ExtendDead; a lapsed hold frees the record for the next
// NextDead and DeleteDead, and its holder's ExtendDead and SettleDead get
// driver.ErrLeaseLost. Without it, a hold lasts until SettleDead.
func TestDeadHold(t *testing.T) {
	t.Parallel()
	const hold = time.Second // a renewal every half hold fails only after a stall of half a second
	ctx := context.Background()
	br := memory.NewBroker()
	open := func(hold time.Duration) *memory.Backend {
		b, err := memory.New(ctx, memory.Config{Broker: br, DeadHold: hold})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	a, other, lasting := open(hold), open(0), open(0)
	if got := a.Capabilities().DeadHold; got != hold {
		t.Fatalf("Capabilities().DeadHold = %v, want %v", got, hold)
	}
	if _, err := memory.New(ctx, memory.Config{DeadHold: -time.Second}); err == nil {
		t.Error("New with a negative DeadHold: no error")
	}
	for _, id := range []string{"r0", "r1"} {
		if err := other.Enqueue(ctx, "q", []driver.Message{{ID: id, Body: []byte(id)}}); err != nil {
			t.Fatal(err)
		}
		ds, err := other.Receive(ctx, "q", 1, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := other.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	dd, err := a.NextDead(ctx, "q")
	if err != nil || dd.ID != "r0" {
		t.Fatalf("NextDead: %v, %v; want r0", dd, err)
	}
	kept, err := lasting.NextDead(ctx, "q")
	if err != nil || kept.ID != "r1" {
		t.Fatalf("NextDead: %v, %v; want r1", kept, err)
	}
	for range 3 {
		time.Sleep(hold / 2)
		if err := a.ExtendDead(ctx, dd); err != nil {
			t.Fatalf("ExtendDead of a live hold: %v", err)
		}
	}
	if got, err := other.NextDead(ctx, "q"); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Fatalf("NextDead with both records held: %v, %v; want ErrNoDeadLetters", got, err)
	}
	time.Sleep(hold + hold/2) // a's hold lapses; lasting's does not
	if err := a.ExtendDead(ctx, dd); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("ExtendDead of a lapsed hold: %v, want ErrLeaseLost", err)
	}
	if n, err := other.DeleteDead(ctx, "q", []string{"r0", "r1"}); err != nil || n != 1 {
		t.Errorf("DeleteDead of a lapsed hold's record and a held one: %d, %v; want 1", n, err)
	}
	if err := a.SettleDead(ctx, dd, true); !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("SettleDead of a lapsed hold: %v, want ErrLeaseLost", err)
	}
	if err := lasting.ExtendDead(ctx, kept); err != nil {
		t.Errorf("ExtendDead of a hold without DeadHold: %v", err)
	}
	if err := lasting.SettleDead(ctx, kept, true); err != nil {
		t.Errorf("SettleDead of a hold without DeadHold: %v", err)
	}
}
