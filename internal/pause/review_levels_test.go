package pause_test

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/pause"
)

// TestResumeGroupLateParkOnLevel: a worker whose poll still says paused
// sets a job aside during ResumeGroup's wait (2 polls + resumeSlack), the
// very race the wait exists for. On the queue itself the job is moved back;
// on a priority level whose held queue did not exist when ResumeGroup
// listed the levels (before the wait), it stays held for good.
func TestResumeGroupLateParkOnLevel(t *testing.T) {
	for _, lq := range []string{"q", "q.prio2"} {
		t.Run(lq, func(t *testing.T) {
			ctx := context.Background()
			b := newBackend(t)
			cfg := config(t, b)
			cfg.Levels = map[string]string{"q.prio1": "q", "q.prio2": "q", "q.prio3": "q"}
			cfg.LevelQueues = func(q string) []string { return []string{q, q + ".prio1", q + ".prio2", q + ".prio3"} }
			cfg.MoveBack = func(d *driver.Delivery) (string, driver.Message) {
				return string(d.Body), driver.Message{ID: string(d.Body) + ".back", Body: d.Body}
			}
			e := pause.New(cfg)
			if err := e.PauseGroup(ctx, "q", "g"); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, err := e.ResumeGroup(ctx, "q", "g"); done <- err }()
			time.Sleep(100 * time.Millisecond) // inside the 2*poll+250ms wait
			if err := e.Park(ctx, lq, "g", "j1", driver.Message{ID: "j1", Body: []byte("j1")}, func() error { return nil }); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			st, err := b.Stats(ctx, pause.HeldQueue(lq, "g"))
			if err != nil {
				t.Fatal(err)
			}
			if st.Ready+st.InFlight+st.Scheduled != 0 {
				t.Errorf("after ResumeGroup %s still holds %d job(s) set aside during its wait: held for good", pause.HeldQueue(lq, "g"), st.Ready+st.InFlight+st.Scheduled)
			}
		})
	}
}
