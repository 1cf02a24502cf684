package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckGroup(t *testing.T) {
	for _, g := range []string{"acme", "a", "A-z_09", strings.Repeat("g", MaxGroupLen)} {
		if err := CheckGroup(g); err != nil {
			t.Errorf("CheckGroup(%q): %v", g, err)
		}
	}
	for _, g := range []string{"", "../../etc/passwd", strings.Repeat("g", MaxGroupLen+1), strings.Repeat("x", 100_000),
		"acme\u202egnp", "a b", "a.b", "a/b", "\x00", "é"} {
		err := CheckGroup(g)
		if !errors.Is(err, ErrBadGroup) {
			t.Errorf("CheckGroup(%.20q): %v, want ErrBadGroup", g, err)
			continue
		}
		if len(err.Error()) > 300 {
			t.Errorf("CheckGroup(%.20q): an error of %d bytes", g, len(err.Error()))
		}
	}
}
