package conformance_test

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

	"github.com/asyncplatform/asyncplatform/conformance"
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
	everything := os.Getenv("ASYNCPLATFORM_CONFORMANCE_MUTATIONS_ALL") != ""
	only := map[string]bool{}
	if v := os.Getenv("ASYNCPLATFORM_CONFORMANCE_MUTATIONS"); v != "" {
		for _, m := range strings.Split(v, ",") {
			only[strings.TrimSpace(m)] = true
		}
	}
	all := map[string]bool{}
	for _, c := range conformance.Cases() {
		all[c] = true
	}
	type row struct {
		failed []string
		took   time.Duration
	}
	var (
		mu    sync.Mutex
		table = map[reference.Mutation]row{}
	)
	sem := make(chan struct{}, 4) // the children mostly wait on timers
	t.Run("each", func(t *testing.T) {
		for _, m := range reference.Mutations {
			if len(only) > 0 && !only[string(m.Mutation)] {
				continue
			}
			t.Run(string(m.Mutation), func(t *testing.T) {
				t.Parallel()
				for _, c := range m.Cases {
					if !all[c] && !everything {
						t.Fatalf("mutation %s names case %q, which the suite does not have", m.Mutation, c)
					}
				}
				sem <- struct{}{}
				defer func() { <-sem }()
				start := time.Now()
				failed, out, err := runMutant(m, everything)
				// Some cases catch a mutation only when their random timing
				// exercises it (Delivery/CancelledReceiveUncounted cancels
				// its Receives at random): a survivor runs twice more
				// before it counts as one.
				for try := 1; try < 3 && len(failed) == 0 && err == nil; try++ {
					failed, out, err = runMutant(m, everything)
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
	for _, m := range reference.Mutations {
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
	fmt.Fprintf(&b, "\n%d of %d mutations caught\n", caught, len(table))
	t.Log(b.String())
}

// failLine is the line the testing package prints for a failed subtest.
var failLine = regexp.MustCompile(`--- FAIL: TestReference/(\S+)`)

// runMutant runs the cases of m (or, with everything, every case) against
// the reference backend broken by m, in a child process (this test
// binary), and returns the cases that failed.
func runMutant(m reference.Entry, everything bool) (failed []string, out string, err error) {
	var groups, names []string
	for _, c := range m.Cases {
		g, n, _ := strings.Cut(c, "/")
		groups = append(groups, regexp.QuoteMeta(g))
		names = append(names, regexp.QuoteMeta(n))
	}
	run := fmt.Sprintf("^TestReference$/^(%s)$/^(%s)$", strings.Join(groups, "|"), strings.Join(names, "|"))
	if everything {
		run = "^TestReference$"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+run, "-test.count=1", "-test.parallel=8", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), mutationEnv+"="+string(m.Mutation), conformance.LoadEnv+"=1") // the bounds where the mutations fail them
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
