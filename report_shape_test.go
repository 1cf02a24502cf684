package asyncplatform

import (
	"reflect"
	"testing"

	"github.com/asyncplatform/asyncplatform/internal/executor"
)

// The report the executor publishes (executor.Report) is OutcomeReport
// field for field, with the same JSON tags, and its outcomes are the
// public ones: what DecodeReport reads is what was written.
func TestReportMatchesOutcomeReport(t *testing.T) {
	pub, in := reflect.TypeFor[OutcomeReport](), reflect.TypeFor[executor.Report]()
	if pub.NumField() != in.NumField() {
		t.Fatalf("OutcomeReport has %d fields, executor.Report %d", pub.NumField(), in.NumField())
	}
	for i := range pub.NumField() {
		a, b := pub.Field(i), in.Field(i)
		if a.Name != b.Name || a.Tag != b.Tag || a.Type.Kind() != b.Type.Kind() {
			t.Errorf("field %d: %s %s %s; executor.Report: %s %s %s", i, a.Name, a.Type, a.Tag, b.Name, b.Type, b.Tag)
		}
	}
	if executor.ReportSucceeded != string(OutcomeSucceeded) || executor.ReportDeadLettered != string(OutcomeDeadLettered) {
		t.Errorf("report outcomes %q, %q", executor.ReportSucceeded, executor.ReportDeadLettered)
	}
}
