package conformance_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/conformance/internal/mutharness"
	"github.com/asyncplatform/asyncplatform/conformance/internal/reference"
	"github.com/asyncplatform/asyncplatform/driver"
)

// mutationEnv names the mutation that a run of TestReference applies: set
// by TestMutations for its child processes.
const mutationEnv = "ASYNCPLATFORM_CONFORMANCE_MUTATION"

// refHarness opens connections to one reference broker.
type refHarness struct{ br *reference.Broker }

func (h refHarness) MakeBackend(context.Context) (driver.Backend, error) { return h.br.Connect(), nil }
func (refHarness) Close()                                                {}

// refOptions are the suite's options for the reference backend: a short
// Wait, since it answers in microseconds, keeps a broken rule that shows
// as a time-out cheap.
var refOptions = conformance.Options{
	Wait:          5 * time.Second,
	SingleProcess: "the reference backend lives inside one process",
}

// TestReference runs the whole suite against the reference backend, which
// keeps every rule: every case passes. Under mutationEnv (TestMutations'
// child processes) the backend breaks that one rule.
func TestReference(t *testing.T) {
	t.Parallel()
	m := reference.Mutation(os.Getenv(mutationEnv))
	if m != "" && !slices.ContainsFunc(reference.Mutations, func(e reference.Entry) bool { return e.Mutation == m }) {
		t.Fatalf("%s=%q: no such mutation", mutationEnv, m)
	}
	conformance.Run(t, func(context.Context, *testing.T) (conformance.Harness, error) {
		return refHarness{reference.NewBroker(m)}, nil
	}, refOptions)
}

// TestMutations is the suite's own test: for every mutation of the
// reference backend (one rule of the contract broken), it runs the cases of
// that rule against the broken backend in a child process, and requires at
// least one of them to fail. It logs which did, as a table:
//
//	go test -v -run TestMutations ./conformance/
//
// ASYNCPLATFORM_CONFORMANCE_MUTATIONS=Name1,Name2 runs only those, and
// ASYNCPLATFORM_CONFORMANCE_MUTATIONS_ALL=1 runs every case of the suite
// against each mutation (minutes), to list every case that catches it.
func TestMutations(t *testing.T) {
	t.Parallel()
	if os.Getenv(mutationEnv) != "" {
		t.Skip("a child process of TestMutations")
	}
	if testing.Short() {
		t.Skip("-short: the mutation test runs the suite in a child process per mutation")
	}
	var mutants []mutharness.Mutant
	for _, m := range reference.Mutations {
		mutants = append(mutants, mutharness.Mutant{Name: string(m.Mutation), Rule: m.Rule, Cases: m.Cases})
	}
	mutharness.Run(t, mutharness.Config{
		Parent:     "TestReference",
		Env:        mutationEnv,
		ChildEnv:   []string{conformance.LoadEnv + "=1"}, // the bounds where the mutations fail them
		ChildArgs:  []string{"-test.parallel=8"},
		Cases:      conformance.Cases(),
		Everything: os.Getenv("ASYNCPLATFORM_CONFORMANCE_MUTATIONS_ALL") != "",
		Only:       mutharness.OnlyFrom("ASYNCPLATFORM_CONFORMANCE_MUTATIONS"),
		Noun:       "mutations",
		// A survivor's retries run with the suite's timings stretched 2×
		// and 4× (times the scale this run was given): on a loaded
		// machine a case can miss the short window where a twin breaks
		// its rule (ExtendLateNoop: an Extend in a lease's last tenth).
		RetryEnv: func(try int) []string {
			f := 1.0
			if v, err := strconv.ParseFloat(os.Getenv(conformance.ScaleEnv), 64); err == nil && v >= 1 {
				f = v
			}
			return []string{conformance.ScaleEnv + "=" + strconv.FormatFloat(min(f*float64(int(1)<<try), 100), 'g', -1, 64)}
		},
	}, mutants)
}
