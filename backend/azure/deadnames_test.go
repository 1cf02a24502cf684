package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	"github.com/asyncplatform/asyncplatform/driver"
)

// listCounter counts the blob listings sent through it.
type listCounter struct {
	next  *http.Client
	lists atomic.Int64
}

func (l *listCounter) Do(req *http.Request) (*http.Response, error) {
	q := strings.ToLower(req.URL.RawQuery)
	if req.Method == http.MethodGet && strings.Contains(q, "comp=list") && strings.Contains(q, "restype=container") {
		l.lists.Add(1)
	}
	return l.next.Do(req)
}

// countingBackend is a second backend on b's account whose blob listings
// are counted.
func countingBackend(t *testing.T) (*Backend, *listCounter) {
	t.Helper()
	cfg := testConfig(t, Config{})
	lc := &listCounter{next: cfg.ClientOptions.Transport.(*http.Client)}
	cfg.ClientOptions = &azqueue.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: lc}}
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, lc
}

// deleteInChunks deletes ids chunk at a time, as a redrive does, and
// returns how many records the deletes counted.
func deleteInChunks(t *testing.T, b *Backend, q string, ids []string, chunk int) int {
	t.Helper()
	total := 0
	for len(ids) > 0 {
		n, err := b.DeleteDead(context.Background(), q, ids[:min(chunk, len(ids))])
		if err != nil {
			t.Fatal(err)
		}
		total += n
		ids = ids[min(chunk, len(ids)):]
	}
	return total
}

func idRange(from, to int) []string {
	var ids []string
	for i := from; i < to; i++ {
		ids = append(ids, fmt.Sprintf("id%d", i))
	}
	return ids
}

// TestDeleteDeadListsOnce: deleting a queue's records in chunks, as a
// redrive does, lists the queue's records once in all, not once a chunk:
// not at all after a ListDead walk that showed them, once when no listing
// did. An ID no listing showed makes DeleteDead walk the queue again.
func TestDeleteDeadListsOnce(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	deadLetterN(t, b, q, 40, func(i int) []byte { return []byte(fmt.Sprint("record ", i)) })

	// A redrive: ListDead pages over all of them, then deletes in chunks.
	c, lc := countingBackend(t)
	var ids []string
	for cursor := ""; ; {
		recs, next, err := c.ListDead(ctx, q, cursor, 15)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			ids = append(ids, r.ID)
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	if len(ids) != 40 {
		t.Fatalf("ListDead showed %d records, want 40", len(ids))
	}
	before := lc.lists.Load()
	if n := deleteInChunks(t, c, q, ids, 8); n != 40 {
		t.Errorf("the deletes removed %d records, want 40", n)
	}
	if got := lc.lists.Load() - before; got != 0 {
		t.Errorf("5 deletes of records ListDead showed listed the queue %d times, want 0", got)
	}
	if st, err := b.Stats(ctx, q); err != nil || st.Dead != 0 {
		t.Errorf("after the deletes: %d dead, %v; want 0", st.Dead, err)
	}

	// Deletes in chunks with no listing before: the first walks the
	// queue, the others delete what it saw.
	deadLetterN(t, b, q, 20, func(i int) []byte { return []byte(fmt.Sprint("again ", i)) })
	d, ld := countingBackend(t)
	if n := deleteInChunks(t, d, q, idRange(0, 20), 5); n != 20 {
		t.Errorf("the deletes removed %d records, want 20", n)
	}
	if got := ld.lists.Load(); got != 1 {
		t.Errorf("4 deletes with no listing before listed the queue %d times, want 1", got)
	}

	// An ID no listing showed: DeleteDead walks the queue, and finds
	// nothing to count.
	if n, err := d.DeleteDead(ctx, q, []string{"nope"}); err != nil || n != 0 {
		t.Errorf("DeleteDead of an unknown ID: %d, %v; want 0", n, err)
	}
	if got := ld.lists.Load(); got != 2 {
		t.Errorf("DeleteDead of an ID no listing showed: %d listings in all, want 2", got)
	}
}

// TestDeleteDeadKnownNames: a delete by remembered name counts only what
// it removed: a record popped by another caller since the listing counts 0,
// a record another caller holds stays (and is deleted once released), and
// a record written after the listing with an ID that was not listed makes
// the delete walk the queue again.
func TestDeleteDeadKnownNames(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	deadLetterN(t, b, q, 3, func(i int) []byte { return []byte(fmt.Sprint("record ", i)) })
	c, lc := countingBackend(t)
	if recs, _, err := c.ListDead(ctx, q, "", 10); err != nil || len(recs) != 3 {
		t.Fatalf("ListDead: %d records, %v", len(recs), err)
	}

	// Another caller pops id0.
	dd, err := b.NextDead(ctx, q)
	if err != nil || dd.ID != "id0" {
		t.Fatalf("NextDead: %v, %v", dd, err)
	}
	if err := b.SettleDead(ctx, dd, true); err != nil {
		t.Fatal(err)
	}
	// And holds id1.
	held, err := b.NextDead(ctx, q)
	if err != nil || held.ID != "id1" {
		t.Fatalf("NextDead: %v, %v", held, err)
	}
	before := lc.lists.Load()
	if n, err := c.DeleteDead(ctx, q, []string{"id0", "id1"}); err != nil || n != 0 {
		t.Errorf("DeleteDead of a popped and a held record: %d, %v; want 0", n, err)
	}
	if err := b.SettleDead(ctx, held, false); err != nil {
		t.Fatal(err)
	}
	if n, err := c.DeleteDead(ctx, q, []string{"id1", "id2"}); err != nil || n != 2 {
		t.Errorf("DeleteDead of id1, released, and id2: %d, %v; want 2", n, err)
	}
	if got := lc.lists.Load() - before; got != 0 {
		t.Errorf("deletes of listed IDs listed the queue %d times, want 0", got)
	}

	// id3, written after the listing, was never shown to c: the delete walks.
	deadLetterN(t, b, q, 4, func(i int) []byte { return []byte(fmt.Sprint("later ", i)) })
	if n, err := c.DeleteDead(ctx, q, []string{"id2", "id3"}); err != nil || n != 2 {
		t.Errorf("DeleteDead of id2 and id3 (new records of them): %d, %v; want 2", n, err)
	}
	if got := lc.lists.Load() - before; got != 1 {
		t.Errorf("a delete of an ID no listing showed: %d listings, want 1", got)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, want := range []string{"id0", "id1"} {
		dd, err := b.NextDead(rctx, q)
		if err != nil || dd.ID != want {
			t.Fatalf("NextDead: %v, %v; want %s", dd, err, want)
		}
		if err := b.SettleDead(rctx, dd, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.NextDead(rctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Errorf("NextDead after every record went: %v, want ErrNoDeadLetters", err)
	}
}

// TestDeadNamesBounded: the index holds at most maxDeadNames names; when
// full it forgets other queues first, then takes no more of the one
// being learned, and a delete's forget makes room again.
func TestDeadNamesBounded(t *testing.T) {
	var d deadNames
	// known reports whether the index holds a name of id, complete or not.
	known := func(prefix, id string) bool {
		q := d.queues[prefix]
		return q != nil && len(q.ids[id]) > 0
	}
	for i := range maxDeadNames {
		d.learn("a/", fmt.Sprint(i), fmt.Sprint("a/", i))
	}
	d.learn("b/", "x", "b/x")
	if ok := known("b/", "x"); !ok || d.count != 1 {
		t.Fatalf("after a full index learned another queue's name: known %v, count %d; want true, 1", ok, d.count)
	}
	if known("a/", "0") {
		t.Error("the full queue's names were kept")
	}
	for i := range maxDeadNames + 10 {
		d.learn("b/", fmt.Sprint(i), fmt.Sprint("b/", i))
	}
	if d.count != maxDeadNames {
		t.Errorf("count %d, want the bound %d", d.count, maxDeadNames)
	}
	if known("b/", fmt.Sprint(maxDeadNames+5)) {
		t.Error("a name past the bound was learned")
	}
	if _, ok := d.lookup("b/", []string{"0"}); ok {
		t.Error("lookup used the names of a queue that dropped one")
	}
	d.queues["b/"].complete = true
	refs, ok := d.lookup("b/", []string{"0", "1", "0"})
	if !ok || len(refs) != 2 {
		t.Fatalf("lookup of 0, 1, 0: %v, %v; want two records", refs, ok)
	}
	d.forget("b/", refs)
	d.learn("b/", "new", "b/new")
	if ok := known("b/", "new"); !ok || d.count != maxDeadNames-1 {
		t.Errorf("after forgetting two names and learning one: known %v, count %d; want true, %d", ok, d.count, maxDeadNames-1)
	}
	d.reset("b/")
	if d.count != 0 {
		t.Errorf("count %d after a reset of the only queue, want 0", d.count)
	}
}
