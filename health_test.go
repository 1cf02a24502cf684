package asyncplatform

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A check that fails from the start keeps every job in the broker.
func TestHealthGatesFromTheStart(t *testing.T) {
	var ran atomic.Int32
	p := startPlatform(t, Config{
		HealthInterval: 20 * time.Millisecond,
		HealthChecks:   map[string]HealthCheck{"db": func(context.Context) error { return errors.New("down") }},
	}, map[string]Handler{"t": func(context.Context, *Job) error { ran.Add(1); return nil }})
	for range 5 {
		_ = p.Enqueue(context.Background(), &Job{Type: "t"})
	}
	time.Sleep(200 * time.Millisecond)
	if n := ran.Load(); n != 0 {
		t.Errorf("%d jobs ran while the only health check failed", n)
	}
}

// A failed check is run again soon, not a whole HealthInterval later: jobs
// run again soon after what it checks is back (a broker node's failover
// took the gate 10 s to notice with the default interval).
func TestHealthRecheckSoonAfterFailure(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	var ran atomic.Int32
	p := startPlatform(t, Config{
		HealthInterval: time.Hour,
		HealthChecks: map[string]HealthCheck{"db": func(context.Context) error {
			if down.Load() {
				return errors.New("down")
			}
			return nil
		}},
	}, map[string]Handler{"t": func(context.Context, *Job) error { ran.Add(1); return nil }})
	if err := p.Enqueue(context.Background(), &Job{Type: "t"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a failed run and a retry or two
	if n := ran.Load(); n != 0 {
		t.Fatalf("%d jobs ran while the only health check failed", n)
	}
	down.Store(false)
	waitUntil(t, "the job to run after the check passes again (an hour's interval)", func() bool { return ran.Load() == 1 })
}
