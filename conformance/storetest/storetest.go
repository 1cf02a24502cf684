// Package storetest is the shared test suite of asyncplatform stores (the
// driver.Store of a backend, or a companion store): the store counterpart of
// conformance.Run. A store's package calls [Run] from one test,
// conventionally TestStore in store_test.go, with a [Maker] that opens an
// independent connection to the store under test, and [Bench] from one
// benchmark.
//
// The suite drives the store through asyncplatform.Store, the portable type
// that checks every limit before the store is called, so it proves the
// whole contract users see: Create races with exactly one winner (across
// real processes: the test binary runs itself again), compare-and-swap
// under contention, TTLs that end neither early nor late, revisions never
// given twice, listing in byte order and paging, values up to the limit, and
// limits refused with typed errors before anything reaches the store.
// Every case is a named, parallel subtest in a namespace of its own; [Cases]
// lists them. A case is skipped only when the Options say why, and the log
// shows the reason.
//
// On a slow or shared machine, ASYNCPLATFORM_CONFORMANCE_SCALE (a number
// from 1 to 100) stretches the suite's TTLs and waits, as it does for
// conformance.Run. A case still running after four Waits has stalled: it
// fails, named, with the stacks of its goroutines, and the rest of the
// report prints.
//
// The suite tests itself: TestStoreMutations (go test -v -run
// TestStoreMutations ./conformance/storetest/) runs its cases against a
// reference store broken in one rule of driver.Store at a time, subtle
// breakages among them (an Update at a stale revision that succeeds when
// it writes the unchanged value, revisions counted per key, TTLs cut to
// whole seconds), and requires a named case to fail for each.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/conformance/internal/casewatch"
	"github.com/asyncplatform/asyncplatform/driver"
)

// Maker opens a new, independent connection to the store under test, as a
// separate worker process would: every store it makes must see the same
// keys. It registers the closing of what it opened with tb.Cleanup.
type Maker func(ctx context.Context, tb testing.TB) (driver.Store, error)

// Options tune the suite for a store. The zero value is for a store that
// several processes share and that a restart test cannot reach.
type Options struct {
	// SingleProcess, when non-empty, says why the store cannot be shared by
	// two processes (the memory store lives in one). Create/RaceProcesses
	// is then skipped with that reason in the log; Create/RaceConnections
	// still runs.
	SingleProcess string

	// Restart, when set, is how Durability/Restart reaches a server of the
	// test's own (never a shared one): it returns a Maker for that server
	// and a function that restarts it on the same data, returning once it
	// takes requests. The restart is a SIGKILL of every server process
	// where the server promises to survive a crash (PostgreSQL, Redis
	// with an append-only file synced on every write, NATS), and a
	// graceful stop where a kill would test only the server's own save
	// timer (Azurite); the test says which, and why. The case writes keys,
	// restarts the server, and requires them back as they were,
	// revisions and TTLs included, and the revisions given after the
	// restart new.
	Restart func(t *testing.T) (Maker, func(t *testing.T))

	// NoRestart says why Restart is nil: a store with no server to restart
	// (the memory store lives and dies with its process).
	// Durability/Restart is then skipped with that reason; with neither
	// set, it fails.
	NoRestart string

	// Wait bounds how long one case waits for an operation. Defaults to
	// 30s. A case still running after four Waits has stalled: it fails,
	// named, with the stacks of its goroutines, and the rest of the report
	// prints.
	Wait time.Duration
}

type testCase struct {
	name string
	run  func(t *testing.T, e *env)
}

func cases() []testCase {
	return []testCase{
		{"Basic/CreateGetUpdateDelete", testBasic},
		{"Revision/NeverReused", testRevisionNeverReused},
		{"Revision/CompareAndSwap", testCompareAndSwap},
		{"Create/RaceConnections", testCreateRaceConnections},
		{"Create/RaceProcesses", testCreateRaceProcesses},
		{"CAS/Contention", testCASContention},
		{"TTL/Expiry", testTTLExpiry},
		{"TTL/SetByEachWrite", testTTLSetByEachWrite},
		{"List/OrderAndPaging", testListOrderAndPaging},
		{"List/Prefixes", testListPrefixes},
		{"Value/Sizes", testValueSizes},
		{"Limits/RefusedBeforeStore", testLimitsRefused},
		{"Limits/LongestKey", testLongestKey},
		{"Namespace/Separate", testNamespaces},
		{"Batch/EachAsSingle", testBatch},
		{"Batch/UpdateEach", testUpdateEach},
		{"Delete/IfValue", testDeleteValue},
		{"Delete/IfValueAnyRev", testDeleteValueAnyRev},
		{"Batch/DeleteValueEach", testDeleteValueEach},
		{"Durability/Restart", testRestart},
	}
}

// Cases lists the names of the suite's cases, in the order Run runs them.
// Each is a subtest of the test that calls Run.
func Cases() []string {
	var names []string
	for _, c := range cases() {
		names = append(names, c.name)
	}
	return names
}

// childEnv carries a Create/RaceProcesses child's namespace down to it.
const childEnv = "ASYNCPLATFORM_STORETEST_CHILD"

const scaleEnv = "ASYNCPLATFORM_CONFORMANCE_SCALE"

// Run runs every case of the suite against the stores makeStore opens, each
// case a parallel subtest of t in a namespace of its own (see Cases).
func Run(t *testing.T, makeStore Maker, opts Options) {
	t.Helper()
	if opts.Wait <= 0 {
		opts.Wait = 30 * time.Second
	}
	scale, err := timeScale()
	if err != nil {
		t.Fatal(err)
	}
	opts.Wait = scaled(opts.Wait, scale)
	if ns := os.Getenv(childEnv); ns != "" {
		runChild(t, makeStore, opts, ns)
		return
	}
	for _, c := range cases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// A stalled case fails, named, with its goroutines' stacks.
			casewatch.Run(t, 4*opts.Wait, 10*time.Second, nil, func() {
				e := newEnv(t, makeStore, opts, scale, c.name)
				c.run(t, e)
			})
		})
	}
}

// env is one case's world: its namespace and the stores it opened.
type env struct {
	t     *testing.T
	make  Maker
	opts  Options
	scale float64
	ns    string
	store *ap.Store // over the first connection
	raw   driver.Store
}

func newEnv(t *testing.T, makeStore Maker, opts Options, scale float64, name string) *env {
	e := &env{t: t, make: makeStore, opts: opts, scale: scale, ns: namespace(name)}
	if name == "Durability/Restart" {
		return e // it opens its own stores
	}
	e.raw = e.connect()
	e.store = e.in(e.raw)
	t.Cleanup(func() { e.clean(e.store) })
	return e
}

// connect opens a new connection to the store.
func (e *env) connect() driver.Store {
	e.t.Helper()
	d, err := e.make(e.ctx(), e.t)
	if err != nil {
		e.t.Fatalf("opening the store: %v", err)
	}
	return d
}

// in returns the portable store over d in the case's namespace.
func (e *env) in(d driver.Store) *ap.Store {
	e.t.Helper()
	s, err := ap.NewStore(d, e.ns)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// clean deletes every key of the case's namespace.
func (e *env) clean(s *ap.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
	defer cancel()
	for cursor := ""; ; {
		page, err := s.List(ctx, "", cursor, ap.MaxListLimit)
		if err != nil {
			e.t.Logf("cleaning up namespace %s: %v", e.ns, err)
			return
		}
		for _, k := range page.Keys {
			if err := s.Delete(ctx, k, ""); err != nil {
				e.t.Logf("cleaning up %s: %v", k, err)
			}
		}
		if cursor = page.Next; cursor == "" {
			return
		}
	}
}

// ctx is a context bounded by the case's wait and ended with the case.
func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *env) scaled(d time.Duration) time.Duration { return scaled(d, e.scale) }

// namespace makes a namespace from a case name: short, lower-case, unique.
func namespace(name string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(name) {
		if b.Len() >= 24 {
			break
		}
		if 'a' <= c && c <= 'z' || '0' <= c && c <= '9' {
			b.WriteRune(c)
		}
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	return "st-" + b.String() + "-" + hex.EncodeToString(r[:])
}

func timeScale() (float64, error) {
	v := os.Getenv(scaleEnv)
	if v == "" {
		return 1, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f < 1 || f > 100 {
		return 0, fmt.Errorf("%s=%q: want a number from 1 to 100", scaleEnv, v)
	}
	return f, nil
}

func scaled(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }

// is fails the test unless err matches want and is a *asyncplatform.StoreError.
func is(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want one matching %v", what, err, want)
		return
	}
	var se *ap.StoreError
	if !errors.As(err, &se) {
		t.Errorf("%s: error %v is not a *asyncplatform.StoreError", what, err)
	}
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
