package admit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/internal/flow"
)

// hangKV is a flow.KV whose writes wait until their context ends, as a
// store that stopped answering does; running counts the writes under way.
type hangKV struct {
	flow.KV
	running atomic.Int32
	calls   atomic.Int32
}

func (s *hangKV) wait(ctx context.Context) error {
	s.calls.Add(1)
	s.running.Add(1)
	defer s.running.Add(-1)
	<-ctx.Done()
	return ctx.Err()
}

func (s *hangKV) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	return "", s.wait(ctx)
}

func (s *hangKV) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	return "", s.wait(ctx)
}

// TestRateStopEndsReservationAhead: a reservation ahead on a store that
// does not answer is cut short by stop, which returns once it has ended
// (not after the reservation's own timeout, a minute here), and no
// reservation ahead starts after stop.
func TestRateStopEndsReservationAhead(t *testing.T) {
	kv := &hangKV{KV: memory.NewBroker().Connect()}
	r, err := flow.NewRate(kv, flow.RateConfig{Key: "rate/t", Events: 100, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	l := newRateLine(r)
	l.reserveAhead(time.Minute)
	for kv.running.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { l.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("stop still waiting after 30 s for a reservation ahead given a minute")
	}
	if n := kv.running.Load(); n != 0 {
		t.Fatalf("%d store writes still running after stop returned", n)
	}
	calls := kv.calls.Load()
	l.reserveAhead(time.Minute)
	l.bg.Wait()
	if n := kv.calls.Load(); n != calls {
		t.Errorf("a reservation ahead after stop made %d store writes; want none", n-calls)
	}
}

// TestGateRunStopsRates: a Gate with a rate and no cluster concurrency
// keeps running until its context ends, then ends the rate's reservation
// ahead before it returns, so none outlives the platform's Stop.
func TestGateRunStopsRates(t *testing.T) {
	kv := &hangKV{KV: memory.NewBroker().Connect()}
	r, err := flow.NewRate(kv, flow.RateConfig{Key: "rate/t", Events: 100, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	l := newRateLine(r)
	g := &Gate{types: map[string]*typeGate{"t": {rate: l}}, lease: time.Minute}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan struct{})
	go func() { g.Run(ctx); close(ran) }()
	l.reserveAhead(time.Minute)
	for kv.running.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-ran:
		t.Fatal("Run returned before its context ended")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	select {
	case <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("Run still running 30 s after its context ended")
	}
	if n := kv.running.Load(); n != 0 {
		t.Fatalf("%d store writes of the rate still running after Run returned", n)
	}
}
