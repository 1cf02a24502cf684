package pause_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/pause"
)

// HeldGroups lists the paused groups and the listed held queues that hold
// jobs, sorted, with the jobs each holds; a listed held queue left empty
// is no held group.
func TestHeldGroups(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t)
	e := pause.New(config(t, b))
	if err := b.Enqueue(ctx, pause.HeldQueue("q", "g"), []driver.Message{{ID: "1", Body: []byte("x")}, {ID: "2", Body: []byte("y")}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Declare(ctx, pause.HeldQueue("q", "empty")); err != nil {
		t.Fatal(err)
	}
	got, err := e.HeldGroups(ctx, "q", []string{"p"}, map[string]bool{"g": true, "empty": true})
	if err != nil {
		t.Fatal(err)
	}
	want := []pause.Held{{Group: "g", Held: 2}, {Group: "p", Paused: true, Held: 0}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("HeldGroups = %+v; want %+v", got, want)
	}

	if err := e.PauseGroup(ctx, "q", "p"); err != nil {
		t.Fatal(err)
	}
	got, err = e.Held(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Held = %+v; want %+v", got, want)
	}
}
