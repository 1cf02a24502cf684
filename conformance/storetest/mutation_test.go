package storetest_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/conformance/internal/mutharness"
	"github.com/asyncplatform/asyncplatform/conformance/internal/reference"
	"github.com/asyncplatform/asyncplatform/conformance/storetest"
	"github.com/asyncplatform/asyncplatform/driver"
)

// mutationEnv names the store mutation that a run of TestStoreReference
// applies: set by TestStoreMutations for its child processes.
const mutationEnv = "ASYNCPLATFORM_STORETEST_MUTATION"

// refOptions are the suite's options for the reference store.
var refOptions = storetest.Options{
	SingleProcess: "the reference store lives inside one process",
	NoRestart:     "the reference store lives in the test process: there is no server to restart",
	Wait:          10 * time.Second, // it answers in microseconds
}

// TestStoreReference runs the store suite against the reference store,
// which keeps every rule: every case passes. Under mutationEnv
// (TestStoreMutations' child processes) the store breaks that one rule.
func TestStoreReference(t *testing.T) {
	t.Parallel()
	m := reference.StoreMutation(os.Getenv(mutationEnv))
	if m != "" && !slices.ContainsFunc(reference.StoreMutations, func(e reference.StoreEntry) bool { return e.Mutation == m }) {
		t.Fatalf("%s=%q: no such mutation", mutationEnv, m)
	}
	st := reference.NewStore(m)
	storetest.Run(t, func(context.Context, testing.TB) (driver.Store, error) { return st.Connect(), nil }, refOptions)
}

// TestStoreMutations is the store suite's own test: for every mutation of
// the reference store (one rule of driver.Store broken, several only in
// part), it runs the cases of that rule against the broken store in a
// child process, and requires at least one of them to fail. It logs which
// did, as a table:
//
//	go test -v -run TestStoreMutations ./conformance/storetest/
//
// ASYNCPLATFORM_STORETEST_MUTATIONS=Name1,Name2 runs only those.
func TestStoreMutations(t *testing.T) {
	t.Parallel()
	if os.Getenv(mutationEnv) != "" {
		t.Skip("a child process of TestStoreMutations")
	}
	if testing.Short() {
		t.Skip("-short: the mutation test runs the suite in a child process per mutation")
	}
	var mutants []mutharness.Mutant
	for _, m := range reference.StoreMutations {
		mutants = append(mutants, mutharness.Mutant{Name: string(m.Mutation), Rule: m.Rule, Cases: m.Cases})
	}
	mutharness.Run(t, mutharness.Config{
		Parent: "TestStoreReference",
		Env:    mutationEnv,
		Cases:  storetest.Cases(),
		Only:   mutharness.OnlyFrom("ASYNCPLATFORM_STORETEST_MUTATIONS"),
		Noun:   "store mutations",
	}, mutants)
}
