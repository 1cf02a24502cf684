package storetest_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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
	only := map[string]bool{}
	if v := os.Getenv("ASYNCPLATFORM_STORETEST_MUTATIONS"); v != "" {
		for _, m := range strings.Split(v, ",") {
			only[strings.TrimSpace(m)] = true
		}
	}
	all := map[string]bool{}
	for _, c := range storetest.Cases() {
		all[c] = true
	}
	type row struct {
		failed []string
		took   time.Duration
	}
	var (
		mu    sync.Mutex
		table = map[reference.StoreMutation]row{}
	)
	sem := make(chan struct{}, 4)
	t.Run("each", func(t *testing.T) {
		for _, m := range reference.StoreMutations {
			if len(only) > 0 && !only[string(m.Mutation)] {
				continue
			}
			t.Run(string(m.Mutation), func(t *testing.T) {
				t.Parallel()
				for _, c := range m.Cases {
					if !all[c] {
						t.Fatalf("mutation %s names case %q, which the suite does not have", m.Mutation, c)
					}
				}
				sem <- struct{}{}
				defer func() { <-sem }()
				start := time.Now()
				failed, out, err := runStoreMutant(m)
				// A race shows only when the goroutines meet: a survivor
				// runs twice more before it counts as one.
				for try := 1; try < 3 && len(failed) == 0 && err == nil; try++ {
					failed, out, err = runStoreMutant(m)
				}
				took := time.Since(start).Round(100 * time.Millisecond)
				mu.Lock()
				table[m.Mutation] = row{failed, took}
				mu.Unlock()
				switch {
				case len(failed) > 0:
					t.Logf("caught in %v by %s", took, strings.Join(failed, ", "))
				case err != nil:
					t.Errorf("the child process failed without a failing case (%v):\n%s", err, out)
				default:
					t.Errorf("mutation %s survived: no case of %s failed, so the rule %q is not proved\n%s", m.Mutation, strings.Join(m.Cases, ", "), m.Rule, out)
				}
			})
		}
	})
	var b strings.Builder
	b.WriteString("\n| mutation | rule broken | caught by | child run |\n|---|---|---|---|\n")
	caught := 0
	for _, m := range reference.StoreMutations {
		r, ok := table[m.Mutation]
		if !ok {
			continue
		}
		by := "NOT CAUGHT"
		if len(r.failed) > 0 {
			caught++
			by = "`" + strings.Join(r.failed, "`, `") + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %v |\n", m.Mutation, m.Rule, by, r.took)
	}
	fmt.Fprintf(&b, "\n%d of %d store mutations caught\n", caught, len(table))
	t.Log(b.String())
}

// failLine is the line the testing package prints for a failed subtest.
var failLine = regexp.MustCompile(`--- FAIL: TestStoreReference/(\S+)`)

// runStoreMutant runs the cases of m against the reference store broken by
// m, in a child process (this test binary), and returns the cases that
// failed.
func runStoreMutant(m reference.StoreEntry) (failed []string, out string, err error) {
	var groups, names []string
	for _, c := range m.Cases {
		g, n, _ := strings.Cut(c, "/")
		groups = append(groups, regexp.QuoteMeta(g))
		names = append(names, regexp.QuoteMeta(n))
	}
	run := fmt.Sprintf("^TestStoreReference$/^(%s)$/^(%s)$", strings.Join(groups, "|"), strings.Join(names, "|"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+run, "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), mutationEnv+"="+string(m.Mutation))
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
	for sc.Scan() {
		if f := failLine.FindStringSubmatch(sc.Text()); f != nil && strings.Contains(f[1], "/") && !slices.Contains(failed, f[1]) {
			failed = append(failed, f[1])
		}
	}
	slices.Sort(failed)
	return failed, buf.String(), err
}
