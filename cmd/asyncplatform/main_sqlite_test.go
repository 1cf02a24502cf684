package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mainEnv makes the test binary run main instead of its tests: the demo on
// SQLite starts its second process from os.Executable, the test binary
// here.
const mainEnv = "ASYNCPLATFORM_DEMO_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDemoSQLite: on SQLite the demo process enqueues the seven jobs into
// the file and ends; another process (another pid) finds the seven jobs
// in the file and works each to the end the contract says.
func TestDemoSQLite(t *testing.T) {
	t.Setenv(mainEnv, "1") // for the second process only
	db := filepath.Join(t.TempDir(), "jobs.db")
	var out bytes.Buffer
	if err := run(context.Background(), &out, options{backend: "sqlite", db: db}); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"here, in the SQLite file " + db,
		"Found 7 jobs on queue \"demo\"",
		"greet    ✔ succeeded",
		"flaky    try 3  (failures 2, crashes 0)",
		"busy     ↺ rejected",
		"crash    try 4  (failures 0, crashes 3)",
		"crash    reason=poisoned         tries=4",
		"parse    reason=invalid          tries=1",
		"explode  reason=retries_exceeded tries=3",
		"doomed   reason=retries_exceeded tries=3",
		"The dead-letter queue is empty.",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if strings.Count(s, "reason=") != 4 {
		t.Errorf("want 4 dead letters drained")
	}
	first := regexp.MustCompile(`This process \(pid (\d+)\) has closed`).FindStringSubmatch(s)
	second := regexp.MustCompile(`\(this is pid (\d+)\)`).FindStringSubmatch(s)
	if first == nil || second == nil || first[1] == second[1] {
		t.Errorf("the jobs were not worked by a second process: %q, %q", first, second)
	}
	if before, _, ok := strings.Cut(s, "This process"); !ok || strings.Contains(before, "try 1") {
		t.Errorf("the first process worked a job")
	}
	if t.Failed() {
		t.Log(s)
	}
}

// TestDemoFlags: the backend's name is checked.
func TestDemoFlags(t *testing.T) {
	if err := run(context.Background(), &bytes.Buffer{}, options{backend: "kafka"}); err == nil {
		t.Error("--backend kafka: no error")
	}
	if err := run(context.Background(), &bytes.Buffer{}, options{backend: "sqlite", resume: true}); err == nil {
		t.Error("--resume without --db: no error")
	}
}
