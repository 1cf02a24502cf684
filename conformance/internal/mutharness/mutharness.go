// Package mutharness runs a suite's own mutation test: for each mutation
// of a reference implementation (one rule broken), it runs the cases of
// that rule against the broken implementation in a child process (the test
// binary again, an environment variable naming the mutation), requires at
// least one of them to fail, and logs which did as a table. The
// conformance suite (TestMutations) and the store suite
// (TestStoreMutations) share it.
package mutharness

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
)

// Mutant is one mutation: its name, the rule it breaks, and the cases
// ("Group/Name") expected to fail against it (at least one must).
type Mutant struct {
	Name  string
	Rule  string
	Cases []string
}

// Config says how to run the mutants of one suite.
type Config struct {
	// Parent is the test function that runs the suite against the
	// reference implementation, with the suite's cases as its subtests
	// ("TestReference").
	Parent string
	// Env is the environment variable that names the mutation for the
	// child process.
	Env string
	// ChildEnv is added to the child's environment (beside Env).
	ChildEnv []string
	// ChildArgs are added to the child's command line.
	ChildArgs []string
	// Cases lists the suite's cases: a mutant naming another fails.
	Cases []string
	// Everything runs every case of the suite against each mutant instead
	// of the mutant's own (to list every case that catches it).
	Everything bool
	// Only, when not empty, names the mutants to run.
	Only map[string]bool
	// Noun names the mutants in the summary line ("mutations").
	Noun string
	// RetryEnv, when set, is added to the child's environment for a
	// survivor's retry (try 1, 2, ...): a suite's timings stretched, so
	// that a case whose timing a loaded machine pushed past the window
	// where the mutation acts gets a wider window.
	RetryEnv func(try int) []string
}

// OnlyFrom reads a comma-separated list of mutant names from the
// environment variable name; empty for all.
func OnlyFrom(name string) map[string]bool {
	only := map[string]bool{}
	if v := os.Getenv(name); v != "" {
		for _, m := range strings.Split(v, ",") {
			only[strings.TrimSpace(m)] = true
		}
	}
	return only
}

// tries is how many times a mutant runs before it counts as a survivor.
const tries = 3

// Run runs every mutant of cfg in parallel subtests of t (four children at
// a time: they mostly wait on timers) and logs the table of what caught
// each.
func Run(t *testing.T, cfg Config, mutants []Mutant) {
	t.Helper()
	known := map[string]bool{}
	for _, c := range cfg.Cases {
		known[c] = true
	}
	type row struct {
		failed []string
		took   time.Duration
	}
	var (
		mu    sync.Mutex
		table = map[string]row{}
	)
	sem := make(chan struct{}, 4)
	t.Run("each", func(t *testing.T) {
		for _, m := range mutants {
			if len(cfg.Only) > 0 && !cfg.Only[m.Name] {
				continue
			}
			t.Run(m.Name, func(t *testing.T) {
				t.Parallel()
				for _, c := range m.Cases {
					if !known[c] && !cfg.Everything {
						t.Fatalf("mutation %s names case %q, which the suite does not have", m.Name, c)
					}
				}
				sem <- struct{}{}
				defer func() { <-sem }()
				start := time.Now()
				failed, out, err := cfg.runMutant(m, nil)
				// Some cases catch a mutation only when their timing
				// exercises it (a race, a Receive cancelled at random, an
				// Extend landing in a lease's last tenth): a survivor runs
				// twice more, with RetryEnv's, before it counts as one.
				for try := 1; try < tries && len(failed) == 0 && err == nil; try++ {
					var env []string
					if cfg.RetryEnv != nil {
						env = cfg.RetryEnv(try)
					}
					failed, out, err = cfg.runMutant(m, env)
				}
				took := time.Since(start).Round(100 * time.Millisecond)
				mu.Lock()
				table[m.Name] = row{failed, took}
				mu.Unlock()
				switch {
				case len(failed) > 0:
					t.Logf("caught in %v by %s", took, strings.Join(failed, ", "))
				case err != nil:
					t.Errorf("the child process failed without a failing case (%v):\n%s", err, out)
				default:
					t.Errorf("mutation %s survived %d runs: no case of %s failed, so the rule %q is not proved\n%s", m.Name, tries, strings.Join(m.Cases, ", "), m.Rule, out)
				}
			})
		}
	})
	var b strings.Builder
	b.WriteString("\n| mutation | rule broken | caught by | child run |\n|---|---|---|---|\n")
	caught := 0
	for _, m := range mutants {
		r, ok := table[m.Name]
		if !ok {
			continue
		}
		by := "NOT CAUGHT"
		if len(r.failed) > 0 {
			caught++
			by = "`" + strings.Join(r.failed, "`, `") + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %v |\n", m.Name, m.Rule, by, r.took)
	}
	fmt.Fprintf(&b, "\n%d of %d %s caught\n", caught, len(table), cfg.Noun)
	t.Log(b.String())
}

// runMutant runs the cases of m (or, with cfg.Everything, every case)
// against the implementation broken by m, in a child process (this test
// binary), and returns the cases that failed.
func (cfg Config) runMutant(m Mutant, env []string) (failed []string, out string, err error) {
	var groups, names []string
	for _, c := range m.Cases {
		g, n, _ := strings.Cut(c, "/")
		groups = append(groups, regexp.QuoteMeta(g))
		names = append(names, regexp.QuoteMeta(n))
	}
	run := fmt.Sprintf("^%s$/^(%s)$/^(%s)$", cfg.Parent, strings.Join(groups, "|"), strings.Join(names, "|"))
	if cfg.Everything {
		run = "^" + cfg.Parent + "$"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args := append([]string{"-test.run=" + run, "-test.count=1", "-test.timeout=2m"}, cfg.ChildArgs...)
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(append(append(os.Environ(), cfg.Env+"="+m.Name), cfg.ChildEnv...), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	failLine := regexp.MustCompile(`--- FAIL: ` + regexp.QuoteMeta(cfg.Parent) + `/(\S+)`)
	sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
	for sc.Scan() {
		if f := failLine.FindStringSubmatch(sc.Text()); f != nil && strings.Contains(f[1], "/") && !slices.Contains(failed, f[1]) {
			failed = append(failed, f[1])
		}
	}
	slices.Sort(failed)
	return failed, buf.String(), err
}
