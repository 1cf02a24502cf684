package nats

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestBrowseBoundsForgedID: a message published on the queue's subject by
// anyone with the server, with a Nats-Msg-Id header as large as the server takes (64 KiB), is listed with
// an ID of at most driver.MaxBrowseID bytes.
func TestBrowseBoundsForgedID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := queueName(t)
	b := newBackend(t, realURL(t), q)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(b.workSubject(q))
	m.Header.Set(hdrMsgID, q+strings.Repeat("x", 60<<10)) // unique: the server drops a repeated ID
	m.Data = []byte("forged")
	if _, err := b.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	pg, err := b.Browse(ctx, q, driver.BrowseReady, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(pg.Items) != 1 {
		t.Fatalf("%d items, want the forged one", len(pg.Items))
	}
	if n := len(pg.Items[0].ID); n > driver.MaxBrowseID {
		t.Errorf("the forged message came back with an ID of %d bytes, want at most %d", n, driver.MaxBrowseID)
	}
}
