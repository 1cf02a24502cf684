package nats

import (
	"context"
	"fmt"
	"testing"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeleteDeadLinear deletes a queue's dead letters chunk by chunk, as a
// redrive does, and counts the messages the backend sends the server
// (requests, publishes): the walk that finds a chunk's records must not
// cost a request per record still there, so the whole costs O(records),
// not O(records²/chunk). (The server's API count misses the lookups: a
// direct get is not an API call.)
func TestDeleteDeadLinear(t *testing.T) {
	t.Parallel()
	const records, chunk = 400, 40
	url := startServer(t, t.TempDir(), 0).ClientURL()
	b := deadEnv(t, url, jetstream.FileStorage)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := "linear"
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	nc, err := gonats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, records)
	futures := make([]jetstream.PubAckFuture, records)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%04d", i)
		m := &gonats.Msg{Subject: b.deadSubject(q), Data: []byte("rec"), Header: gonats.Header{}}
		m.Header.Set(hdrDeadID, ids[i])
		if futures[i], err = js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	calls := func() uint64 { return b.nc.Stats().OutMsgs }
	before := calls()
	deleted := 0
	for i := 0; i < records; i += chunk {
		n, err := b.DeleteDead(ctx, q, ids[i:i+chunk])
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
	}
	used := calls() - before
	if deleted != records {
		t.Fatalf("deleted %d records, want %d", deleted, records)
	}
	// Each record: its marker, its delete and its marker's delete. Each
	// call: a handful (the walk's consumer made, pulled from and deleted,
	// a subject count). A walk by lookups would add records²/(2·chunk) =
	// 2,000.
	limit := uint64(3*records + 20*records/chunk)
	t.Logf("%d messages sent to delete %d records in chunks of %d (limit %d)", used, records, chunk, limit)
	if used > limit {
		t.Fatalf("%d messages sent to delete %d records in chunks of %d, want at most %d", used, records, chunk, limit)
	}
	if left := listAll(t, b, q, 100); len(left) != 0 {
		t.Fatalf("%d records left, want none", len(left))
	}
}
