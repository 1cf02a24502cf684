package redis

import (
	"context"
	"errors"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// A prefix that would break the key layout (hash-tag braces, spaces,
// control bytes) is refused by New with an error matching
// driver.ErrBadQueue; a prefix with ':' namespaces keys and is fine.
func TestPrefixChecked(t *testing.T) {
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, bad := range []string{"a{b}", "a b", "x\x1b[2J", "\n"} {
		if _, err := New(context.Background(), Config{Client: rdb, Prefix: bad}); !errors.Is(err, driver.ErrBadQueue) {
			t.Errorf("prefix %q: %v, want driver.ErrBadQueue", bad, err)
		}
	}
	if err := (Config{Client: rdb, Prefix: "app:jobs"}).withDefaults().validate(); err != nil {
		t.Errorf("prefix app:jobs: %v", err)
	}
}
