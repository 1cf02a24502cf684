package rabbit

import (
	"context"
	"errors"
	"testing"

	"github.com/asyncplatform/asyncplatform/driver"
)

// A prefix the broker would refuse (amq.) or that is not a name at all is
// refused by New, with an error matching driver.ErrBadQueue, before any dial.
func TestPrefixChecked(t *testing.T) {
	for _, bad := range []string{"amq.jobs", "a b", "x\x1b]0;title\x07", "q/../x"} {
		_, err := New(context.Background(), Config{Prefix: bad, URL: "amqp://guest:guest@127.0.0.1:1/"})
		if !errors.Is(err, driver.ErrBadQueue) {
			t.Errorf("prefix %q: %v, want driver.ErrBadQueue", bad, err)
		}
	}
}
