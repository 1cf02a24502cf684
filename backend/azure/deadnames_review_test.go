package azure

import (
	"context"
	"fmt"
	"testing"
)

// TestDeleteDeadAllRecordsOfAnID: DeleteDead removes every record of an
// ID (driver.Backend), also when the listings before it showed only some of
// them: a partial listing (one page, the dashboard's) must not make the
// delete leave the record it did not show, which a later redrive would
// enqueue again (its job run twice).
func TestDeleteDeadAllRecordsOfAnID(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	// Two records of id0 (a duplicate, as a lost lease leaves), then id1.
	deadLetterN(t, b, q, 1, func(int) []byte { return []byte("first") })
	deadLetterN(t, b, q, 2, func(i int) []byte { return []byte(fmt.Sprint("second ", i)) })

	c, _ := countingBackend(t)
	// One page of one record: c has seen id0's first record only.
	if recs, _, err := c.ListDead(ctx, q, "", 1); err != nil || len(recs) != 1 || recs[0].ID != "id0" {
		t.Fatalf("ListDead: %v, %v", recs, err)
	}
	n, err := c.DeleteDead(ctx, q, []string{"id0"})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for cursor := ""; ; {
		recs, next, err := b.ListDead(ctx, q, cursor, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			left = append(left, r.ID+":"+string(r.Body))
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	if n != 2 || len(left) != 1 || left[0] != "id1:second 1" {
		t.Errorf("DeleteDead of id0 (two records, one listed) removed %d, left %q; want 2 removed and only id1 left", n, left)
	}
}

// TestDeadNamesComplete: the index's names are used only after a whole
// listing with nothing dropped: a chain of pages from the empty cursor to
// the end, or a walk whose entry no other walk replaced.
func TestDeadNamesComplete(t *testing.T) {
	var d deadNames
	r := func(id string) []deadRef { return []deadRef{{id: id, name: "p/" + id}} }
	d.page("p/", "", "c1", r("a"))
	if _, ok := d.lookup("p/", []string{"a"}); ok {
		t.Error("names of a first page alone were used")
	}
	d.page("p/", "other", "", r("b")) // the end of another chain
	if _, ok := d.lookup("p/", []string{"a"}); ok {
		t.Error("a page from a cursor the chain did not give completed it")
	}
	d.page("p/", "", "c1", r("a"))
	d.page("p/", "c1", "", r("b"))
	if refs, ok := d.lookup("p/", []string{"a", "b"}); !ok || len(refs) != 2 {
		t.Errorf("after a whole chain: %v, %v; want both", refs, ok)
	}

	w1 := d.walk("q/")
	w2 := d.walk("q/") // a second walk began meanwhile
	d.learn("q/", "x", "q/x")
	d.walked(w1)
	if _, ok := d.lookup("q/", []string{"x"}); ok {
		t.Error("a walk whose entry another walk replaced marked it complete")
	}
	d.walked(w2)
	if _, ok := d.lookup("q/", []string{"x"}); !ok {
		t.Error("a whole walk did not mark its entry complete")
	}

	long := string(make([]byte, maxDeadNameID+1))
	w := d.walk("l/")
	d.learn("l/", long, "l/1")
	d.walked(w)
	if _, ok := d.lookup("l/", []string{long}); ok || d.queues["l/"].complete {
		t.Error("an ID past maxDeadNameID was taken, or its drop left the queue complete")
	}
}
