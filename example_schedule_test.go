package asyncplatform_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// A Schedule enqueues a job at every tick of a cron expression or a fixed
// interval. Register it on every worker process: exactly one job is
// enqueued per tick across all of them, each carrying its tick in the
// ScheduleTickHeader header. Schedules lists what the backend's store
// knows of them (asyncctl schedules list), and TriggerSchedule enqueues a
// schedule's job at once (asyncctl schedules trigger).
func Example_schedule() {
	ctx := context.Background()
	broker := memory.NewBroker() // three worker processes share it
	ticks := make(chan time.Time, 64)
	var workers []*ap.Platform
	for range 3 {
		p, err := ap.New(broker.Connect(), ap.Config{
			Logger: slog.New(slog.DiscardHandler),
			Schedules: []ap.Schedule{{
				Name:  "heartbeat",
				Every: 100 * time.Millisecond, // or Cron: "*/5 * * * * *", Location: ...
				Job:   ap.Job{Type: "heartbeat"},
			}},
		})
		if err != nil {
			log.Fatal(err)
		}
		_ = p.Handle("heartbeat", func(ctx context.Context, job *ap.Job) error {
			tick, err := time.Parse(time.RFC3339Nano, job.Headers[ap.ScheduleTickHeader])
			if err == nil {
				ticks <- tick
			}
			return nil
		})
		if err := p.Start(ctx); err != nil {
			log.Fatal(err)
		}
		defer p.Stop(ctx)
		workers = append(workers, p)
	}

	seen := map[time.Time]bool{}
	for range 5 {
		tick := <-ticks
		if seen[tick] || tick.UnixNano()%int64(100*time.Millisecond) != 0 {
			log.Fatalf("tick %v: enqueued twice, or not on the interval", tick)
		}
		seen[tick] = true
	}
	fmt.Println("5 jobs for 5 ticks, from 3 schedulers")

	list, err := workers[0].Schedules(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(list[0].Name, "every", list[0].Every, "next after last:", list[0].Next.After(list[0].Last))
	// Output:
	// 5 jobs for 5 ticks, from 3 schedulers
	// heartbeat every 100ms next after last: true
}
