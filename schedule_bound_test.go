package asyncplatform

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// Schedules reads at most MaxSchedules schedules: with one more in the
// store it lists nothing and says so (ErrTooManySchedules); by name it
// still lists them.
func TestSchedulesBounded(t *testing.T) {
	ctx := context.Background()
	b := memory.NewBroker().Connect()
	t.Cleanup(func() { _ = b.Close() })
	p, err := New(b, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	ticks := kv.Of(d, kv.Schedules)
	for i := range MaxSchedules + 1 {
		if _, err := ticks.Create(ctx, "s"+strconv.Itoa(i), []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if l, err := p.Schedules(ctx); !errors.Is(err, ErrTooManySchedules) || l != nil {
		t.Fatalf("Schedules over the bound: %d, %v; want ErrTooManySchedules", len(l), err)
	}
	if l, err := p.Schedules(ctx, "s0", "s1"); err != nil || len(l) != 2 {
		t.Errorf("Schedules by name: %d, %v", len(l), err)
	}
}
