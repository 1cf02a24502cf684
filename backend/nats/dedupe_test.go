package nats

import (
	"context"
	"slices"
	"testing"
	"time"

	gonats "github.com/nats-io/nats.go"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestDedupeIDUnguessable: the server drops a publish whose Nats-Msg-Id it
// saw within DuplicateWindow, so that ID must be one a writer to the broker
// cannot compute ahead of the real copy, and must differ between two
// messages that merely share a Message.ID; the same message published
// again is still stored once.
func TestDedupeIDUnguessable(t *testing.T) {
	url := realURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	q := queueName(t)
	b := newBackend(t, url, q)

	// A writer publishes ahead under the IDs the next copies would have had
	// by their names alone (<queue>/<job>.<copy>, <queue>/<report key>).
	for _, id := range []string{"fail-once-1.1", "order-77@0"} {
		m := &gonats.Msg{Subject: b.workSubject(q), Data: []byte("forged " + id), Header: gonats.Header{}}
		m.Header.Set(hdrMsgID, token(q)+"/"+id)
		if _, err := b.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	msgs := []driver.Message{
		{ID: "fail-once-1.1", Body: []byte("real retry")},
		{ID: "order-77@0", Body: []byte("real report")},
		// Job x's copy 1 and job x.1's copy 0 share the name x.1.
		{ID: "x.1", Body: []byte("copy 1 of x")},
		{ID: "x.1", Body: []byte("copy 0 of x.1")},
	}
	for _, m := range msgs {
		if err := b.Enqueue(ctx, q, []driver.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	// A publish retried after a timeout: the same message again.
	if err := b.Enqueue(ctx, q, msgs[:1]); err != nil {
		t.Fatal(err)
	}

	if st, err := b.Stats(ctx, q); err != nil || st.Ready != 6 {
		t.Fatalf("stored %+v, %v; want 6 ready: two forged, four real (none dropped), the retry once", st, err)
	}
	var got []string
	for len(got) < 6 {
		ds, err := b.Receive(ctx, q, 10, 30*time.Second)
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		for _, d := range ds {
			got = append(got, string(d.Body))
			if err := b.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	slices.Sort(got)
	want := []string{"copy 0 of x.1", "copy 1 of x", "forged fail-once-1.1", "forged order-77@0", "real report", "real retry"}
	if !slices.Equal(got, want) {
		t.Fatalf("stored %q, want %q", got, want)
	}
}
