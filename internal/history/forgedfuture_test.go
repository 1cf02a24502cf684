package history

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// Buckets of minutes after now, which no worker's clock writes (anyone who
// can write to the store can), do not take the read's byte budget: a read
// bounded by MaxReadBytes reads the newest minutes up to now, not forged
// ones from the future that would cut every real minute away.
func TestReadSkipsFutureBuckets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newStore(t)
	st := kv.Of(d, kv.History)
	real, err := json.Marshal(bucket{Series: []Series{{Queue: "q", Type: "t", Succeeded: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	forged, err := json.Marshal(bucket{Series: []Series{{Queue: "forged", Type: strings.Repeat("f", driver.MaxValueLen-100), Succeeded: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(forged) > driver.MaxValueLen {
		forged = forged[:driver.MaxValueLen]
	}
	nowMin := t0.Unix() / 60
	var items []driver.BatchItem
	const n = 10
	for i := range n {
		items = append(items, driver.BatchItem{Key: key(nowMin - int64(i)), Value: real, TTL: time.Hour})
	}
	const budget = 1 << 20
	for i := range budget/driver.MaxValueLen + 2 {
		items = append(items, driver.BatchItem{Key: key(nowMin + 1000 + int64(i)), Value: forged, TTL: time.Hour})
	}
	if _, err := st.CreateEach(ctx, items); err != nil {
		t.Fatal(err)
	}
	c := New(Config{Store: st, Now: func() time.Time { return t0 }, MaxReadBytes: budget})
	r, err := c.Read(ctx, t0.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, m := range r.Minutes {
		if !m.Start.After(t0) {
			got++
		}
	}
	if got != n || r.Cut {
		t.Errorf("read %d of the %d real minutes (cut %v, %d minutes in all): buckets forged after now took the read", got, n, r.Cut, len(r.Minutes))
	}
}
