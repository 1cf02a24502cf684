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
