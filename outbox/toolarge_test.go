package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/asyncplatform/asyncplatform/driver"
)

// smallTarget is a target whose bodies are bounded, as an Azure queue's
// or a RabbitMQ one's with Config.MaxBody are: it refuses a whole batch
// holding a body past the bound, as those backends' Enqueue does.
type smallTarget struct {
	fakeTarget
	max int
}

func (t *smallTarget) Capabilities() driver.Capabilities { return driver.Capabilities{MaxBody: t.max} }

func (t *smallTarget) Enqueue(ctx context.Context, q string, msgs []driver.Message) error {
	for _, m := range msgs {
		if len(m.Body) > t.max {
			return fmt.Errorf("enqueue %s: %w", q, driver.ErrTooLarge)
		}
	}
	return t.fakeTarget.Enqueue(ctx, q, msgs)
}

// TestRelayTargetTooSmall: a row whose body the target cannot store (past
// its Capabilities.MaxBody, which may be smaller than the source's) is
// moved aside, and the rows around it are published: it never holds the
// queue up for good.
func TestRelayTargetTooSmall(t *testing.T) {
	rs := rows("a", "big", "c")
	rs[1].Msg.Body = make([]byte, 2048)
	src := &fakeSource{rows: map[string][]Row{"q": rs}, held: map[string]bool{}}
	tgt := &smallTarget{max: 1024}
	r, err := New(Config{Source: src, Target: tgt, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, err = r.Once(context.Background())
	}
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tgt.ids, []string{"a", "c"}) || !slices.Equal(src.aside, []int64{2}) {
		t.Errorf("published %v, aside %v; want a c, and row 2 aside", tgt.ids, src.aside)
	}
}
