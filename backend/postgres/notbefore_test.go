package postgres

import (
	"testing"
	"time"
)

// A NotBefore inside a microsecond is due from the next one: a timestamptz
// holds whole microseconds, and a message is never due before its
// NotBefore.
func TestNotBeforeRoundsUp(t *testing.T) {
	base := time.UnixMicro(1_700_000_000_475_000)
	for _, c := range []struct{ nb, want time.Time }{
		{time.Time{}, time.Time{}},
		{base, base},
		{base.Add(time.Nanosecond), base.Add(time.Microsecond)},
		{base.Add(999 * time.Nanosecond), base.Add(time.Microsecond)},
	} {
		if got := dueTime(c.nb); !got.Equal(c.want) {
			t.Errorf("dueTime(%d) = %d, want %d", c.nb.UnixNano(), got.UnixNano(), c.want.UnixNano())
		}
	}
}
