package conformance

import "testing"

// Run runs every case of the suite against the backends that makeHarness opens.
func Run(t *testing.T, makeHarness HarnessMaker, opts Options) {
	t.Helper()
	t.Fatal("conformance: the suite is being written (issue 2); this stub always fails")
}
