package faults

import (
	"context"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// TestJudgeIdleNotesEveryRecord: a pass that finds one worker busy still
// notes the others' records, so that a later pass where an idle worker's
// record is missing (a late beat) counts that worker as busy.
func TestJudgeIdleNotesEveryRecord(t *testing.T) {
	since := time.Now()
	after := since.Add(time.Second)
	beating := map[string]bool{}
	running := []string{"w1", "w2"}

	busy := map[string]ap.WorkerInfo{
		"w1": {Name: "w1", Held: 1, BeatAt: after},
		"w2": {Name: "w2", BeatAt: after},
	}
	if judgeIdle(running, busy, beating, since) {
		t.Fatal("idle with w1 holding a job")
	}
	late := map[string]ap.WorkerInfo{
		"w1": {Name: "w1", BeatAt: after},
	}
	if judgeIdle(running, late, beating, since) {
		t.Fatal("idle with w2's record missing after it had one")
	}

	fresh := map[string]bool{}
	starting := map[string]ap.WorkerInfo{
		"w1": {Name: "w1", BeatAt: after},
	}
	if !judgeIdle(running, starting, fresh, since) {
		t.Fatal("busy, with w2 never having had a record (a worker still starting)")
	}
	stale := map[string]ap.WorkerInfo{
		"w1": {Name: "w1", BeatAt: since},
		"w2": {Name: "w2", BeatAt: after},
	}
	if judgeIdle(running, stale, fresh, since) {
		t.Fatal("idle with w1's newest beat no later than the last event")
	}
}

// fakeWorker is a worker whose end the test decides.
type fakeWorker struct {
	name string
	done chan struct{}
}

func (w *fakeWorker) Kill()                 {}
func (w *fakeWorker) Term()                 {}
func (w *fakeWorker) Done() <-chan struct{} { return w.done }
func (w *fakeWorker) Name() string          { return w.name }

// TestWorkersIdleNotesRecordsWhileOneIsGone: while a gone worker's window
// is open the run is busy, and the running workers' records are still
// read and noted, so that one whose record goes missing after the window
// counts as busy.
func TestWorkersIdleNotesRecordsWhileOneIsGone(t *testing.T) {
	gone := &fakeWorker{name: "w1", done: make(chan struct{})}
	close(gone.done)
	live := &fakeWorker{name: "w2", done: make(chan struct{})}
	r := &run{tg: Target{Lease: time.Hour}, queue: "q", workers: []worker{gone, live}}
	since := time.Now()
	reads := 0
	records := func(context.Context) ([]ap.WorkerInfo, error) {
		reads++
		return []ap.WorkerInfo{{Name: "w2", Queues: []string{"q"}, BeatAt: since.Add(time.Second)}}, nil
	}
	if r.workersIdle(context.Background(), since, records) {
		t.Fatal("idle with w1 gone just now")
	}
	if reads != 1 || !r.beating["w2"] {
		t.Fatalf("records read %d times, w2 noted %v: want them read and w2 noted while w1's window is open", reads, r.beating["w2"])
	}
	r.ended["w1"] = time.Now().Add(-(2*r.tg.Lease + 2*time.Second)) // the window has passed
	if !r.workersIdle(context.Background(), since, records) {
		t.Fatal("busy with w1's window passed and w2 idle by its record")
	}
	none := func(context.Context) ([]ap.WorkerInfo, error) { return nil, nil }
	if r.workersIdle(context.Background(), since, none) {
		t.Fatal("idle with w2's record missing after it had one")
	}
}
