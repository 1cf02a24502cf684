// Package testenv holds the test plumbing the backend tests share.
package testenv

import (
	"os"
	"testing"
)

// RequireEnv names the variable that turns a backend test's skip into a
// failure. .ci/run sets it, so CI can never go green by skipping.
const RequireEnv = "ASYNCPLATFORM_REQUIRE_SERVERS"

// Required reports whether unreachable servers must fail the run.
func Required() bool { return os.Getenv(RequireEnv) != "" }

// Unreachable skips the test, or fails it when Required, because the named
// server could not be reached.
func Unreachable(t testing.TB, server string, err error) {
	t.Helper()
	if Required() {
		t.Fatalf("%s is unreachable and %s is set, so this is a failure, not a skip: %v", server, RequireEnv, err)
	}
	t.Skipf("%s is unreachable (set %s to make this a failure): %v", server, RequireEnv, err)
}

// Getenv returns the variable's value, or def when it is empty.
func Getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// LongEnv names the variable that turns on the long mode (scripts/test
// --long): soaks, clusters and the suites' second runs on other servers.
// The default run keeps one run of every suite per backend, a short fault
// run included, and fits in the time CI gives it.
const LongEnv = "ASYNCPLATFORM_LONG"

// Long skips the test unless the long mode is on; why says what the test
// adds to the default run's.
func Long(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(LongEnv) == "" {
		t.Skipf("long mode only (scripts/test --long, or %s=1): %s", LongEnv, why)
	}
}
