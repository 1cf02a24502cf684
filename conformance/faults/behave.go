package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// jobType is the type of every job the suite enqueues.
const jobType = "fault"

// Plan is what a job's handler does, carried in the job's payload so that
// every worker, in this process or another, behaves the same.
type Plan struct {
	// SleepMin and SleepMax bound the work, in milliseconds (uniform).
	SleepMin, SleepMax int `json:",omitempty"`
	// Fail makes the handler fail while the job has fewer failures.
	Fail int `json:",omitempty"`
	// Permanent makes the handler return Permanent once it is done failing.
	Permanent bool `json:",omitempty"`
	// RejectFor makes the handler Reject, 3 times out of 4, for this many
	// milliseconds after the job was enqueued.
	RejectFor int `json:",omitempty"`
	// SlowFirst, in milliseconds, replaces the sleep of the job's first
	// attempt (no failure, no crash counted yet).
	SlowFirst int `json:",omitempty"`
	// Kill makes the handler kill its worker (the process, or the
	// in-process worker's connection) on every attempt.
	Kill bool `json:",omitempty"`
	// DieAtSettle, on a worker whose WorkerSpec.DieAtSettle is set, kills
	// the worker at the settle of the job's first attempt (no failure, no
	// crash counted yet) once its handler has returned nil: "before" the
	// ack (so after a workflow step's success is recorded and its
	// dependents enqueued), or "after" the ack returned.
	DieAtSettle string `json:",omitempty"`
}

func newJob(id string, p Plan) *ap.Job {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return &ap.Job{ID: id, Type: jobType, Payload: b}
}

// handler runs plans, writing a start event before the work and an end event
// just before it returns. crash kills the worker; doom, when not nil, makes
// the settle of a delivery kill it (Plan.DieAtSettle); running counts the
// handlers running.
func handler(log *Log, worker string, crash func(), doom func(*driver.Delivery, string), running *handlers) ap.Handler {
	return func(ctx context.Context, j *ap.Job) error {
		running.n.Add(1)
		defer running.n.Add(-1)
		var p Plan
		if err := json.Unmarshal(j.Payload, &p); err != nil {
			return ap.Invalid(err)
		}
		e := Event{ID: j.ID, Worker: worker, Try: j.TryCount, Failures: j.Failures, Crashes: j.Crashes, Copy: j.CopyNumber()}
		start := e
		start.Kind = KindStart
		log.Add(start)
		end := func(result string) {
			e.Kind, e.Result = KindEnd, result
			log.Add(e)
		}
		switch {
		case p.Kill:
			crash()
			<-ctx.Done() // in-process: the dead worker's handler never reports
			return ctx.Err()
		case p.RejectFor > 0 && time.Since(j.EnqueuedAt) < time.Duration(p.RejectFor)*time.Millisecond && rand.IntN(4) != 0:
			end(ResultReject)
			return ap.Reject(errors.New("planned transient rejection"))
		case j.Failures < p.Fail:
			end(ResultFail)
			return fmt.Errorf("planned failure %d of %d", j.Failures+1, p.Fail)
		case p.Permanent:
			end(ResultFail)
			return ap.Permanent(errors.New("planned permanent failure"))
		}
		d := time.Duration(p.SleepMin) * time.Millisecond
		if p.SleepMax > p.SleepMin {
			d += rand.N(time.Duration(p.SleepMax-p.SleepMin) * time.Millisecond)
		}
		if p.SlowFirst > 0 && j.Failures == 0 && j.Crashes == 0 {
			d = time.Duration(p.SlowFirst) * time.Millisecond
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			end(ResultCancel)
			return ctx.Err()
		}
		if p.DieAtSettle != "" && doom != nil && j.Failures == 0 && j.Crashes == 0 {
			if d := driver.DeliveryFrom(ctx); d != nil {
				doom(d, p.DieAtSettle)
			}
		}
		end(ResultOK)
		return nil
	}
}
