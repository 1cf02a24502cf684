package admit_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/admit"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// newStore returns the limits' namespace of a fresh memory broker's store;
// each call of the function it returns connects another process to it.
func newStore(t *testing.T) func() *kv.Store {
	t.Helper()
	br := memory.NewBroker()
	return func() *kv.Store {
		b, err := memory.New(t.Context(), memory.Config{Broker: br})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		d, err := driver.StoreOf(b)
		if err != nil {
			t.Fatal(err)
		}
		return kv.Of(d, kv.Limits)
	}
}

// newGate returns a Gate over store for the limits of type "t".
func newGate(t *testing.T, store *kv.Store, l admit.Limit) *admit.Gate {
	t.Helper()
	g, err := admit.New(admit.Config{
		Limits: map[string]admit.Limit{"t": l},
		Store:  store,
		Lease:  time.Minute,
		Holder: "test",
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// keys returns the keys of store under prefix.
// noKeys waits, up to 5 s, for no key under prefix to be left: a slot a
// job gave back is freed after the linger.
func noKeys(t *testing.T, store *kv.Store, prefix string) []string {
	t.Helper()
	got := keys(t, store, prefix)
	for end := time.Now().Add(5 * time.Second); len(got) > 0 && time.Now().Before(end); got = keys(t, store, prefix) {
		time.Sleep(10 * time.Millisecond)
	}
	return got
}

func keys(t *testing.T, store *kv.Store, prefix string) []string {
	t.Helper()
	var got []string
	err := store.ListAll(t.Context(), prefix, func(k string) (bool, error) {
		got = append(got, k)
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	store := newStore(t)()
	tests := []struct {
		name     string
		limits   map[string]admit.Limit
		store    *kv.Store
		storeErr error
		want     string // in the error
		wantIs   error  // matched with errors.Is; nil for none
	}{
		{name: "EmptyType", limits: map[string]admit.Limit{"": {Concurrency: 1}}, store: store, want: `Limits[""]: the job type is empty`},
		{name: "Negative", limits: map[string]admit.Limit{"t": {Rate: -1}}, store: store, want: `Limits["t"]: limits must not be negative`},
		{name: "ClusterWithoutStore", limits: map[string]admit.Limit{"t": {ClusterConcurrency: 1}}, storeErr: driver.ErrNoStore,
			want: `Limits["t"]: a cluster-wide limit needs the backend's store`, wantIs: driver.ErrNoStore},
		{name: "RateWithoutStore", limits: map[string]admit.Limit{"t": {Rate: 1}}, storeErr: driver.ErrNoStore,
			want: `Limits["t"]: a cluster-wide limit needs the backend's store`, wantIs: driver.ErrNoStore},
		{name: "TooManySlots", limits: map[string]admit.Limit{"t": {ClusterConcurrency: 1 << 20}}, store: store, want: `Limits["t"].ClusterConcurrency`},
		{name: "RateTooFast", limits: map[string]admit.Limit{"t": {Rate: 1e10}}, store: store, want: `Limits["t"].Rate`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := admit.New(admit.Config{Limits: tt.limits, Store: tt.store, StoreErr: tt.storeErr, Lease: time.Minute})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %v; want an error saying %q", err, tt.want)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("New: %v; want it to match %v", err, tt.wantIs)
			}
		})
	}
	// A process-wide limit needs no store.
	if _, err := admit.New(admit.Config{Limits: map[string]admit.Limit{"t": {Concurrency: 1}}, StoreErr: driver.ErrNoStore, Lease: time.Minute}); err != nil {
		t.Errorf("a per-process limit without a store: %v", err)
	}
}

// TestConcurrency: a concurrency limit, per process or cluster-wide,
// admits as many jobs as it allows and refuses the next without a wait of
// its own; a job's release lets the next in.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		limit admit.Limit
	}{
		{"Process", admit.Limit{Concurrency: 2}},
		{"Cluster", admit.Limit{ClusterConcurrency: 2}},
		{"Both", admit.Limit{Concurrency: 2, ClusterConcurrency: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			g := newGate(t, newStore(t)(), tt.limit)
			var held []admit.Ticket
			for i := range 2 {
				tk, _, ok := g.Admit(ctx, "t", "job", 10)
				if !ok {
					t.Fatalf("job %d of a limit of 2 refused", i+1)
				}
				held = append(held, tk)
			}
			if _, wait, ok := g.Admit(ctx, "t", "job", 10); ok || wait != 0 {
				t.Fatalf("a third job of a limit of 2: admitted %v, wait %v; want refused with no wait of its own", ok, wait)
			}
			if _, _, ok := g.Admit(ctx, "other", "job", 10); !ok {
				t.Fatal("a job of a type with no limit refused")
			}
			held[0].Release(ctx)
			tk, _, ok := g.Admit(ctx, "t", "job", 10)
			if !ok {
				t.Fatal("a job refused after another was released")
			}
			tk.Release(ctx)
			held[1].Release(ctx)
		})
	}
}

// TestClusterConcurrency: two processes (two Gates) over one store share a
// cluster-wide limit; its slots are the keys sem/<type key>/<i>, and a
// released job's slot is deleted.
func TestClusterConcurrency(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	connect := newStore(t)
	cfg := func(s *kv.Store) admit.Config {
		return admit.Config{
			Limits: map[string]admit.Limit{"a/b": {ClusterConcurrency: 2}},
			Key:    func(typ string) string { return strings.ReplaceAll(typ, "/", "_") },
			Store:  s, Lease: time.Minute, Holder: "test",
		}
	}
	store := connect()
	a, err := admit.New(cfg(store))
	if err != nil {
		t.Fatal(err)
	}
	b, err := admit.New(cfg(connect()))
	if err != nil {
		t.Fatal(err)
	}
	ta, _, okA := a.Admit(ctx, "a/b", "1", 10)
	tb, _, okB := b.Admit(ctx, "a/b", "2", 10)
	if !okA || !okB {
		t.Fatalf("one job in each of two processes under a limit of 2: admitted %v, %v", okA, okB)
	}
	for name, g := range map[string]*admit.Gate{"first": a, "second": b} {
		if _, _, ok := g.Admit(ctx, "a/b", "3", 10); ok {
			t.Fatalf("the %s process admitted a third job under a cluster limit of 2", name)
		}
	}
	got := keys(t, store, "sem/")
	if len(got) != 2 || !strings.HasPrefix(got[0], "sem/a_b/") || !strings.HasPrefix(got[1], "sem/a_b/") {
		t.Errorf("slot keys %q; want two under sem/a_b/", got)
	}
	ta.Release(ctx)
	var tk admit.Ticket
	ok := false
	for end := time.Now().Add(5 * time.Second); !ok && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		tk, _, ok = b.Admit(ctx, "a/b", "3", 10)
	}
	if !ok {
		t.Fatal("a job refused in one process for 5 s after a job of the other was released")
	}
	tk.Release(ctx)
	tb.Release(ctx)
	if got := noKeys(t, store, "sem/"); len(got) != 0 {
		t.Errorf("slot keys %q after every job was released; want none", got)
	}
}

// TestRate: a rate shared by two processes admits its burst, then refuses
// with the wait until its next start; a start due soon is waited for in
// the worker.
func TestRate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		connect := newStore(t)
		store := connect()
		a := newGate(t, store, admit.Limit{Rate: 0.01, Burst: 2}) // one every 100 s
		b := newGate(t, connect(), admit.Limit{Rate: 0.01, Burst: 2})
		for i, g := range []*admit.Gate{a, b} {
			tk, wait, ok := g.Admit(ctx, "t", "job", 10)
			if !ok || wait != 0 {
				t.Fatalf("job %d of a burst of 2: admitted %v, wait %v", i+1, ok, wait)
			}
			tk.Release(ctx)
		}
		_, wait, ok := a.Admit(ctx, "t", "job", 10)
		if ok || wait < 90*time.Second || wait > 100*time.Second {
			t.Fatalf("a job after the burst of a rate of one per 100 s: admitted %v, wait %v; want refused, about 100 s", ok, wait)
		}
		if got := keys(t, store, "rate/"); len(got) != 1 || got[0] != "rate/t" {
			t.Errorf("rate keys %q; want [rate/t]", got)
		}
	})
	t.Run("WaitsForItsStart", func(t *testing.T) {
		t.Parallel()
		g := newGate(t, newStore(t)(), admit.Limit{Rate: 10}) // one every 100 ms
		t0 := time.Now()
		for i := range 3 {
			tk, wait, ok := g.Admit(ctx, "t", "job", 10)
			if !ok || wait != 0 {
				t.Fatalf("job %d of a rate of 10/s: admitted %v, wait %v; want admitted after a wait in the worker", i+1, ok, wait)
			}
			tk.Release(ctx)
		}
		if d := time.Since(t0); d < 150*time.Millisecond {
			t.Errorf("3 starts of a rate of 10/s, burst 1, in %v; want at least 200 ms", d)
		}
	})
	t.Run("StopEndsTheWait", func(t *testing.T) {
		t.Parallel()
		g := newGate(t, newStore(t)(), admit.Limit{Rate: 1})
		tk, _, _ := g.Admit(ctx, "t", "job", 10)
		tk.Release(ctx)
		stop, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		_, wait, ok := g.Admit(stop, "t", "job", 10)
		if ok || wait <= 0 || time.Since(t0) > 500*time.Millisecond {
			t.Errorf("a job waiting for its start when ctx ends: admitted %v, wait %v after %v; want refused at once with a wait", ok, wait, time.Since(t0))
		}
	})
}

// TestRefusalFreesWhatWasTaken: a job the rate refuses gives back the
// place and the slot it took first.
func TestRefusalFreesWhatWasTaken(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := newStore(t)()
	g := newGate(t, store, admit.Limit{Concurrency: 1, ClusterConcurrency: 1, Rate: 0.01})
	tk, _, ok := g.Admit(ctx, "t", "job", 10)
	if !ok {
		t.Fatal("the first job refused")
	}
	tk.Release(ctx)
	for i := range 3 {
		if _, wait, ok := g.Admit(ctx, "t", "job", 10); ok || wait == 0 {
			t.Fatalf("try %d of a job over the rate: admitted %v, wait %v; want refused by the rate, with its wait", i+1, ok, wait)
		}
	}
	if got := noKeys(t, store, "sem/"); len(got) != 0 {
		t.Errorf("slot keys %q after the refusals; want none", got)
	}
}

// TestRunRenews: Run keeps the slots of running jobs held past their lease,
// stops renewing a released one, and returns when ctx ends.
func TestRunRenews(t *testing.T) {
	t.Parallel()
	connect := newStore(t)
	cfg := func(s *kv.Store) admit.Config {
		return admit.Config{Limits: map[string]admit.Limit{"t": {ClusterConcurrency: 1}}, Store: s, Lease: time.Second}
	}
	a, err := admit.New(cfg(connect()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := admit.New(cfg(connect()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx)
	}()
	tk, _, ok := a.Admit(ctx, "t", "job", 10)
	if !ok {
		t.Fatal("the first job refused")
	}
	time.Sleep(3200 * time.Millisecond) // over three leases
	if _, _, ok := b.Admit(ctx, "t", "job", 10); ok {
		t.Fatal("another process took the slot of a running job: Run did not renew it")
	}
	tk.Release(ctx)
	if tk, _, ok := b.Admit(ctx, "t", "job", 10); !ok {
		t.Fatal("another process could not take a released slot")
	} else {
		tk.Release(ctx)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return when its ctx ended")
	}
	// Without limits to renew, Run returns at once.
	g, err := admit.New(admit.Config{Limits: map[string]admit.Limit{"t": {Concurrency: 1}}, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g.Run(t.Context())
}

// TestAdmitAllocs: admitting and releasing a job of a type without limits,
// or with a per-process limit only, allocates nothing.
func TestAdmitAllocs(t *testing.T) {
	if testenv.Race {
		t.Skip("the race detector allocates")
	}
	ctx := t.Context()
	tests := []struct {
		name  string
		limit admit.Limit
		want  float64
	}{
		{"None", admit.Limit{}, 0},
		{"Process", admit.Limit{Concurrency: 10}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGate(t, newStore(t)(), tt.limit)
			got := testing.AllocsPerRun(100, func() {
				if tk, _, ok := g.Admit(ctx, "t", "job", 10); ok {
					tk.Release(ctx)
				}
			})
			if got != tt.want {
				t.Errorf("%v allocations per admitted job; want %v", got, tt.want)
			}
		})
	}
}

// TestSlotReused: the jobs of a type that come one after another in a
// process use one cluster slot, taken from the store once: its key keeps
// its revision (no write) from the first job to the hundredth; and it is
// freed once no job came for the linger.
func TestSlotReused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := newStore(t)()
	g := newGate(t, store, admit.Limit{ClusterConcurrency: 3})
	var rev string
	for i := range 100 {
		tk, _, ok := g.Admit(ctx, "t", "job", 10)
		if !ok {
			t.Fatalf("job %d refused", i)
		}
		got := keys(t, store, "sem/")
		if len(got) != 1 {
			t.Fatalf("job %d: slot keys %q; want one", i, got)
		}
		_, r, err := store.Get(ctx, got[0])
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			rev = r
		} else if r != rev {
			t.Fatalf("job %d: the slot key at revision %s, the first job's at %s: written again", i, r, rev)
		}
		tk.Release(ctx)
	}
	if got := noKeys(t, store, "sem/"); len(got) != 0 {
		t.Errorf("slot keys %q after the linger; want none", got)
	}
}
