package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// A read cut at MaxHistoryReadBytes whose buckets did not parse (anyone
// who can write to the store can write them) has no minute to start the
// totals at: the page still says the history was cut, not that it is empty.
func TestHistoryPageCutWithoutMinutes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, noStart: true})
	st, err := driver.StoreOf(f.backend)
	if err != nil {
		t.Fatal(err)
	}
	v := []byte(strings.Repeat("x", driver.MaxValueLen))
	n := ap.MaxHistoryReadBytes/len(v) + 20 // more than one read holds
	now := time.Now().Unix() / 60
	var items []driver.BatchItem
	for i := range n {
		items = append(items, driver.BatchItem{Key: fmt.Sprintf("m/%012d", now-int64(i)), Value: v, TTL: time.Hour})
	}
	if _, err := kv.Of(st, kv.History).CreateEach(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	hr, err := f.p.ReadHistory(context.Background(), time.Now().Add(-24*time.Hour))
	if err != nil || !hr.Cut || len(hr.Minutes) != 0 {
		t.Fatalf("ReadHistory: %d minutes, cut %v, %v; want none, cut", len(hr.Minutes), hr.Cut, err)
	}
	c := newClient(t, f)
	p := "/history?span=24h"
	resp, body := c.get(p)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d\n%s", p, resp.StatusCode, body)
	}
	if err := contains(body, `id="history-cut"`); err != nil {
		t.Errorf("%s: a cut read without minutes: %v", p, err)
	}
}
