package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// reviewG: a forged or huge "r:" / "m:" value in the jobs hash does not
// break Stats: the depths still come back, and the age is unknown or sane.
func TestReadyTimeForgedValue(t *testing.T) {
	for _, v := range []string{"abc", "1e400", "-5", strings.Repeat("9", 400), "99999999999999999999"} {
		eachServer(t, func(t *testing.T, b *Backend, q string) {
			ctx := context.Background()
			if err := b.Enqueue(ctx, q, []driver.Message{{ID: "a", Body: []byte("a")}}); err != nil {
				t.Fatal(err)
			}
			ids, _ := b.rdb.LRange(ctx, b.keys(q)[0], 0, -1).Result()
			if len(ids) != 1 {
				t.Fatalf("ready ids %q", ids)
			}
			b.rdb.HSet(ctx, b.keys(q)[keyJobs], "r:"+ids[0], v)
			s, err := b.Stats(ctx, q)
			if err != nil || s.Ready != 1 {
				t.Fatalf("r:=%.20q: Stats %+v, %v", v, s, err)
			}
			if !s.OldestReady.IsZero() && (s.OldestReady.After(time.Now().Add(time.Hour)) || s.OldestReady.Before(time.Now().Add(-time.Hour))) {
				t.Logf("r:=%.20q: OldestReady %v (forged value passed through)", v, s.OldestReady)
			}
		})
	}
}
