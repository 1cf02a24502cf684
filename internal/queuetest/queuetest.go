// Package queuetest checks a backend's driver.QueueLister on a real broker:
// each backend's queues_test.go calls Run with a backend of a namespace of
// its own (a fresh prefix, stream or broker), so that nothing else's queues
// are listed.
package queuetest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Options say what a backend's broker keeps.
type Options struct {
	// DeclareLeavesNoTrace is the reason a queue that was only declared
	// (nothing enqueued, nothing received) is not listed; empty when it is.
	DeclareLeavesNoTrace string

	// Lease is the lease of the one Receive that dead-letters a job.
	// Defaults to a second.
	Lease time.Duration
}

// Queues of the scenario. Each is a kind of queue Queues must list: one
// holding a ready job (with every character a name may have), a scheduled
// one, a dead letter only, one a worker received from while it was empty,
// and the longest name there is.
var (
	Declared  = "declared"
	Jobs      = "Jobs_x.y-Z"
	Scheduled = "later"
	Dead      = "dead.only"
	Received  = "received_empty"
	Long      = strings.Repeat("L.o_n-g", 15)[:driver.MaxQueueLen]
)

// Run declares, fills and deletes the scenario's queues on b, checking what
// b's Queues lists at each step. b must see no other queue.
func Run(t *testing.T, b driver.Backend, o Options) {
	t.Helper()
	if o.Lease == 0 {
		o.Lease = time.Second
	}
	l, ok := b.(driver.QueueLister)
	if !ok {
		t.Fatalf("%T does not implement driver.QueueLister", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a safety net
	defer cancel()
	all := []string{Declared, Jobs, Scheduled, Dead, Received, Long}
	t.Cleanup(func() {
		if d, ok := b.(driver.QueueDeleter); ok {
			for _, q := range all {
				_ = d.DeleteQueue(context.Background(), q)
			}
		}
	})
	check := func(step string, want ...string) {
		t.Helper()
		got, err := l.Queues(ctx)
		if err != nil {
			t.Fatalf("%s: Queues: %v", step, err)
		}
		want = slices.Clone(want)
		slices.Sort(want)
		if len(got) == 0 && len(want) == 0 {
			return
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: Queues = %q, want %q", step, got, want)
		}
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	check("a fresh namespace")
	for _, q := range all {
		must("declare "+q, b.Declare(ctx, q))
	}
	declared := []string{Declared, Jobs, Scheduled, Dead, Received, Long}
	if o.DeclareLeavesNoTrace != "" {
		t.Logf("a queue only declared is not listed: %s", o.DeclareLeavesNoTrace)
		declared = nil
	}
	check("after Declare", declared...)

	msg := func(id string, notBefore time.Time) []driver.Message {
		return []driver.Message{{ID: id, Body: []byte("body of " + id), NotBefore: notBefore}}
	}
	must("enqueue", b.Enqueue(ctx, Jobs, msg("j1", time.Time{})))
	must("enqueue", b.Enqueue(ctx, Long, msg("l1", time.Time{})))
	must("enqueue scheduled", b.Enqueue(ctx, Scheduled, msg("s1", time.Now().Add(time.Hour))))
	must("enqueue", b.Enqueue(ctx, Dead, msg("d1", time.Time{})))
	var ds []*driver.Delivery
	for len(ds) == 0 {
		var err error
		ds, err = b.Receive(ctx, Dead, 1, o.Lease)
		must("receive", err)
	}
	must("dead-letter", b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: "d1", Body: []byte("record of d1")}))
	rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	got, err := b.Receive(rctx, Received, 1, o.Lease)
	rcancel()
	if len(got) > 0 || err == nil {
		t.Fatalf("receive from the empty queue %s: %d deliveries, %v", Received, len(got), err)
	}
	want := []string{Jobs, Scheduled, Dead, Received, Long}
	if o.DeclareLeavesNoTrace == "" {
		want = append(want, Declared)
	}
	check("with a job, a scheduled job, a dead letter, a worker", want...)

	d, ok := b.(driver.QueueDeleter)
	if !ok {
		return
	}
	must("delete", d.DeleteQueue(ctx, Jobs))
	must("delete", d.DeleteQueue(ctx, Dead))
	want = slices.DeleteFunc(want, func(q string) bool { return q == Jobs || q == Dead })
	check("after DeleteQueue of two", want...)
	for _, q := range want {
		must("delete", d.DeleteQueue(ctx, q))
	}
	check("after DeleteQueue of all")
	must("declare again", b.Declare(ctx, Jobs))
	must("enqueue again", b.Enqueue(ctx, Jobs, msg("j2", time.Time{})))
	check("after a deleted queue is written again", Jobs)
}
