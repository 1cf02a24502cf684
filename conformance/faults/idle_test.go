package faults

import (
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
