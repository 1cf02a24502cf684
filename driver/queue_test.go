package driver_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/asyncplatform/asyncplatform/driver"
)

func TestCheckQueue(t *testing.T) {
	for _, name := range []string{"a", "mail", "Orders.v2", "a_b-c.d", "0", strings.Repeat("x", driver.MaxQueueLen)} {
		if err := driver.CheckQueue(name); err != nil {
			t.Errorf("CheckQueue(%q) = %v, want nil", name, err)
		}
	}
	for _, c := range []struct{ name, want string }{
		{"", "queue name is empty"},
		{strings.Repeat("x", driver.MaxQueueLen+1), "is 101 bytes, the limit is 100"},
		{"a b", `queue name "a b" has ' ' at byte 1`},
		{"no/slash", `has '/' at byte 2`},
		{"{tag}", `has '{' at byte 0`},
		{"é", `has 0xc3 at byte 0`},
		{"a\x00", `has 0x00 at byte 1`},
	} {
		err := driver.CheckQueue(c.name)
		if !errors.Is(err, driver.ErrBadQueue) || !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("CheckQueue(%q) = %v, want ErrBadQueue naming %q", c.name, err, c.want)
		}
	}
	wrapped := fmt.Errorf("enqueue: %w", driver.CheckQueue("a b"))
	if !errors.Is(wrapped, driver.ErrBadQueue) {
		t.Errorf("a wrapped CheckQueue error does not match ErrBadQueue: %v", wrapped)
	}
}
