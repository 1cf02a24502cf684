package jobctx

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// TestJobContextAfterFunc checks the AfterFunc contract the context package
// relies on: callbacks run once on cancel, a stopped one never runs, and one
// registered after the cancel runs at once.
func TestJobContextAfterFunc(t *testing.T) {
	c := &Context{Parent: context.Background()}
	var wg sync.WaitGroup
	ran := make(chan string, 3)
	wg.Add(2)
	c.AfterFunc(func() { ran <- "a"; wg.Done() })
	stop := c.AfterFunc(func() { ran <- "stopped" })
	if !stop() || stop() {
		t.Error("stop: want true once, then false")
	}
	c.Cancel(context.Canceled)
	c.Cancel(context.DeadlineExceeded) // only the first counts
	if late := c.AfterFunc(func() { ran <- "late"; wg.Done() }); late() {
		t.Error("stop after the cancel returned true")
	}
	wg.Wait()
	close(ran)
	var got []string
	for s := range ran {
		got = append(got, s)
	}
	if len(got) != 2 || (got[0] != "a" && got[1] != "a") || (got[0] != "late" && got[1] != "late") {
		t.Errorf("ran %v, want a and late", got)
	}
	if !errors.Is(c.Err(), context.Canceled) {
		t.Errorf("Err() = %v, want context.Canceled", c.Err())
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done() not closed after cancel")
	}
}
