package redis

import (
	"testing"
	"time"
)

// A NotBefore inside a millisecond is due from the next one: the scripts
// compare whole milliseconds, and a message is never due before its
// NotBefore (Delivery/NotBeforeRace saw one handed out 188µs early when
// the millisecond was rounded down).
func TestNotBeforeRoundsUp(t *testing.T) {
	base := time.UnixMilli(1_700_000_000_475)
	for _, c := range []struct {
		nb   time.Time
		want int64
	}{
		{time.Time{}, 0},
		{base, 1_700_000_000_475},
		{base.Add(time.Nanosecond), 1_700_000_000_476},
		{base.Add(300 * time.Microsecond), 1_700_000_000_476},
		{base.Add(time.Millisecond - time.Nanosecond), 1_700_000_000_476},
	} {
		if got := unixMs(c.nb); got != c.want {
			t.Errorf("unixMs(%v) = %d, want %d", c.nb.UnixNano(), got, c.want)
		}
		if c.want != 0 && time.UnixMilli(c.want).Before(c.nb) {
			t.Errorf("unixMs(%v) = %d is before the NotBefore", c.nb.UnixNano(), c.want)
		}
	}
}
