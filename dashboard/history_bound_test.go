package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// The history page states what one read of the history reads at most,
// and, when a day of full minutes holds more, that its totals start at
// the first minute read; the newest minute is among them.
func TestHistoryPageBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{queues: []string{"mail"}, noStart: true})
	st, err := driver.StoreOf(f.backend)
	if err != nil {
		t.Fatal(err)
	}
	type series struct {
		Q  string `json:"q"`
		T  string `json:"t"`
		OK int64  `json:"ok"`
	}
	var ss []series
	for i := range 200 {
		ss = append(ss, series{Q: fmt.Sprintf("q%03d", i), T: strings.Repeat("t", 200), OK: 1})
	}
	v, err := json.Marshal(map[string]any{"s": ss})
	if err != nil {
		t.Fatal(err)
	}
	n := ap.MaxHistoryReadBytes/len(v) + 20 // more than one read holds
	now := time.Now().Unix() / 60
	var items []driver.BatchItem
	for i := range n {
		items = append(items, driver.BatchItem{Key: fmt.Sprintf("m/%012d", now-int64(i)), Value: v, TTL: time.Hour})
	}
	if _, err := kv.Of(st, kv.History).CreateEach(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, f)
	p := "/history?span=24h"
	resp, body := c.get(p)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d\n%s", p, resp.StatusCode, body)
	}
	if err := contains(body, fmt.Sprintf("reads at most %d MiB of the history", ap.MaxHistoryReadBytes>>20), `id="history-cut"`,
		time.Unix(now*60, 0).UTC().Format("2006-01-02 15:04")); err != nil {
		t.Errorf("%s: %v", p, err)
	}
	hr, err := f.p.ReadHistory(context.Background(), time.Now().Add(-24*time.Hour))
	if err != nil || !hr.Cut || len(hr.Minutes) >= n || len(hr.Minutes) == 0 {
		t.Errorf("ReadHistory: %d of %d minutes, cut %v, %v; want fewer, cut", len(hr.Minutes), n, hr.Cut, err)
	}
}
