package asyncplatform

import (
	"os"
	"regexp"
	"slices"
	"testing"
)

// TestReasonsInREADME ties Reasons to the README's outcome table: every
// reason of the table's last column is listed, and every listed reason is in
// the table.
func TestReasonsInREADME(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var inTable []string
	for _, m := range regexp.MustCompile("(?m)^\\|.*\\| `([a-z_]+)` \\|$").FindAllStringSubmatch(string(b), -1) {
		if !slices.Contains(inTable, m[1]) {
			inTable = append(inTable, m[1])
		}
	}
	var listed []string
	for _, r := range Reasons() {
		listed = append(listed, string(r))
	}
	slices.Sort(inTable)
	slices.Sort(listed)
	if !slices.Equal(inTable, listed) {
		t.Errorf("the README's outcome table has the reasons %q, Reasons() %q", inTable, listed)
	}
}
