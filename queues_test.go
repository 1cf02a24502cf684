package asyncplatform_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// Queues finds every queue of the backend with its depths and the time of
// its oldest dead letter.
func TestQueues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := memory.NewBroker()
	dead := make(chan ap.DeadLetter, 1)
	worker, err := ap.New(broker.Connect(), ap.Config{
		Queues: map[string]ap.QueueConfig{"mail": {}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks:  ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl }},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := worker.Handle("fail", func(context.Context, *ap.Job) error { return ap.Permanent(errors.New("no")) }); err != nil {
		t.Fatal(err)
	}
	if err := worker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer worker.Stop(ctx)
	before := time.Now()
	if err := worker.Enqueue(ctx, &ap.Job{Type: "fail", Queue: "mail"}); err != nil {
		t.Fatal(err)
	}
	dl := <-dead
	p, err := ap.New(broker.Connect(), ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range []*ap.Job{{Type: "t", Queue: "billing"}, {Type: "t", Queue: "billing"}, {Type: "t", Queue: "a.later", NotBefore: time.Now().Add(time.Hour)}} {
		if err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}

	names, err := p.QueueNames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a.later", "billing", "mail"}; !slices.Equal(names, want) {
		t.Fatalf("QueueNames = %q, want %q", names, want)
	}
	qs, err := p.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []ap.QueueInfo{
		{Name: "a.later", QueueStats: ap.QueueStats{Scheduled: 1}},
		{Name: "billing", QueueStats: ap.QueueStats{Ready: 2}},
		{Name: "mail", QueueStats: ap.QueueStats{Dead: 1}, OldestDead: dl.DeadAt},
	}
	same := func(a, b ap.QueueInfo) bool {
		return a.Name == b.Name && a.QueueStats == b.QueueStats && a.OldestDead.Equal(b.OldestDead) && a.Err == nil
	}
	for i := range qs {
		// Only billing has ready jobs, enqueued since before.
		if at := qs[i].OldestReady; qs[i].Name == "billing" && (at.Before(before) || at.After(time.Now())) || qs[i].Name != "billing" && !at.IsZero() {
			t.Errorf("queue %s: OldestReady %v, want zero without ready jobs, else since %v", qs[i].Name, at, before)
		}
		qs[i].OldestReady = time.Time{}
	}
	if !slices.EqualFunc(qs, want, same) {
		t.Fatalf("Queues = %+v, want %+v", qs, want)
	}
	if dl.DeadAt.Before(before) || time.Since(dl.DeadAt) > time.Minute {
		t.Errorf("the dead letter's DeadAt is %v, set before %v", dl.DeadAt, before)
	}
}

// lister is a backend whose broker lists what it likes.
type lister struct {
	driver.Backend
	names []string
}

func (l lister) Queues(context.Context) ([]string, error) { return l.names, nil }

// Names off the broker are checked: a name that is not a queue name, as a
// foreign writer might make one, is left out, and so are duplicates. A
// queue whose depths cannot be read is listed with its error.
func TestQueuesUntrusted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, _ := memory.New(ctx, memory.Config{})
	p, err := ap.New(lister{b, []string{"", "a", "a", "bad\x1b[2J", "b", string(make([]byte, 101))}}, ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	names, err := p.QueueNames(ctx)
	if err != nil || !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("QueueNames = %q, %v; want a and b", names, err)
	}
	b.Close()
	qs, err := p.Queues(ctx)
	if err != nil || len(qs) != 2 || !errors.Is(qs[0].Err, driver.ErrClosed) || !errors.Is(qs[1].Err, driver.ErrClosed) {
		t.Fatalf("Queues on a closed backend = %+v, %v; want both queues with ErrClosed", qs, err)
	}
}

// A backend that cannot list its queues says so.
func TestQueuesUnsupported(t *testing.T) {
	t.Parallel()
	b, _ := memory.New(context.Background(), memory.Config{})
	defer b.Close()
	p, err := ap.New(struct{ driver.Backend }{b}, ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Queues(context.Background()); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Queues = %v, want an error matching errors.ErrUnsupported", err)
	}
	if _, err := new(ap.Platform).QueueNames(context.Background()); !errors.Is(err, ap.ErrNotNew) {
		t.Fatalf("QueueNames of a zero Platform = %v, want ErrNotNew", err)
	}
}

// CheckKnownQueue knows the queues the backend lists, and the paused ones;
// any other name is an *UnknownQueueError naming it.
func TestCheckKnownQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := ap.New(memory.NewBroker().Connect(), ap.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Enqueue(ctx, &ap.Job{Type: "t", Queue: "mail"}); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckKnownQueue(ctx, "mail"); err != nil {
		t.Errorf("mail: %v", err)
	}
	var ue *ap.UnknownQueueError
	if err := p.CheckKnownQueue(ctx, "mial"); !errors.As(err, &ue) || ue.Queue != "mial" {
		t.Errorf("mial: %v, want an UnknownQueueError naming it", err)
	}
	if err := p.Pause(ctx, "later"); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckKnownQueue(ctx, "later"); err != nil {
		t.Errorf("a paused queue: %v", err)
	}
	if err := p.PauseGroup(ctx, "grouped", "acme"); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckKnownQueue(ctx, "grouped"); err != nil {
		t.Errorf("a queue with a paused group: %v", err)
	}
}

// Queues lists each queue once when held queues (HeldQueue) of several
// queues are listed, some of whose own queues the backend does not list:
// those are added to the listing, which must not then hide the others
// from the check that keeps a queue from being added twice.
func TestQueuesOnceWithHeldQueues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for round := range 10 {
		b := memory.NewBroker().Connect()
		held := []string{"mail"} // listed itself
		for i := range 9 {
			held = append(held, fmt.Sprintf("gone%d", i)) // only their held jobs are left
		}
		if err := b.Enqueue(ctx, "mail", []driver.Message{{Body: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		for _, q := range held {
			if err := b.Enqueue(ctx, ap.HeldQueue(q, "acme"), []driver.Message{{Body: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
		}
		p, err := ap.New(b, ap.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		qs, err := p.Queues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, q := range qs {
			names = append(names, q.Name)
		}
		if len(names) != len(held) || !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
			t.Fatalf("round %d: Queues listed %q; want each of the %d queues once, sorted", round, names, len(held))
		}
	}
}
