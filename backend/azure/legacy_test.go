package azure

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The legacy layout's writer, as the versions before blob dead letters had
// it: a queue per record, overflow chunks first, the lock message, then the
// "done" metadata.

func (f lockFrame) encode() string { return base64.StdEncoding.EncodeToString(f.raw()) }

func lockInlineMax(id string) int {
	var tmp [binary.MaxVarintLen64]byte
	return maxRaw - lockHeader - binary.PutUvarint(tmp[:], uint64(len(id))) - len(id)
}

func encodeChunk(index, total int, data []byte) string {
	buf := make([]byte, chunkHeader+len(data))
	buf[0], buf[1], buf[2] = chunkMagic[0], chunkMagic[1], frameVersion
	binary.BigEndian.PutUint16(buf[3:5], uint16(index))
	binary.BigEndian.PutUint16(buf[5:7], uint16(total))
	copy(buf[chunkHeader:], data)
	return base64.StdEncoding.EncodeToString(buf)
}

// writeLegacy writes a record in the legacy layout and returns its queue.
// complete false stops before the "done" metadata (a writer that crashed).
func writeLegacy(t *testing.T, b *Backend, queue string, rec driver.DeadMessage, complete bool) string {
	t.Helper()
	ctx := context.Background()
	ttl := &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))}
	record := b.names(queue).legacy + newKey()
	lock := lockFrame{id: rec.ID, kind: lockInline, body: rec.Body}
	if len(rec.Body) > lockInlineMax(rec.ID) {
		chunks := slices.Collect(slices.Chunk(rec.Body, maxChunkData))
		if _, err := b.svc.CreateQueue(ctx, dataQueue(record), nil); err != nil {
			t.Fatal(err)
		}
		for i, c := range chunks {
			if _, err := b.svc.NewQueueClient(dataQueue(record)).EnqueueMessage(ctx, encodeChunk(i, len(chunks), c), ttl); err != nil {
				t.Fatal(err)
			}
		}
		lock = lockFrame{id: rec.ID, kind: lockChunked, chunks: len(chunks)}
	}
	meta := base64.RawURLEncoding.EncodeToString([]byte(rec.ID))
	metadata := map[string]*string{"apid": &meta}
	if _, err := b.svc.CreateQueue(ctx, record, &azqueue.CreateOptions{Metadata: metadata}); err != nil {
		t.Fatal(err)
	}
	rq := b.svc.NewQueueClient(record)
	if _, err := rq.EnqueueMessage(ctx, lock.encode(), ttl); err != nil {
		t.Fatal(err)
	}
	if complete {
		done := "1"
		metadata[doneMeta] = &done
		if _, err := rq.SetMetadata(ctx, &azqueue.SetMetadataOptions{Metadata: metadata}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Millisecond) // keys in order
	return record
}

// legacyQueues lists the queue's legacy queues.
func legacyQueues(t *testing.T, b *Backend, queue string) []string {
	t.Helper()
	prefix := b.names(queue).legacy
	var out []string
	pager := b.svc.NewListQueuesPager(&azqueue.ListQueuesOptions{Prefix: &prefix})
	for pager.More() {
		resp, err := pager.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range resp.Queues {
			out = append(out, *q.Name)
		}
	}
	return out
}

// TestLegacyUpgrade upgrades a queue whose dead letters are in the legacy
// layout (inline and chunked records, one held by a worker of the previous
// version, one half-written) and loses none: the first dead-letter call
// moves them into blobs in their order, ahead of a record written after the
// upgrade; the held one is moved once its holder lets go; the half-written
// one is left alone and removed by PurgeDead.
func TestLegacyUpgrade(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	big := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 40_000) // 160 kB: four chunks
	var want []driver.DeadMessage
	var records []string
	for i := range 6 {
		rec := driver.DeadMessage{ID: fmt.Sprintf("old%d", i), Body: []byte(fmt.Sprintf("record %d", i))}
		if i == 2 {
			rec.Body = big
		}
		records = append(records, writeLegacy(t, b, q, rec, true))
		want = append(want, rec)
	}
	writeLegacy(t, b, q, driver.DeadMessage{ID: "halfwritten", Body: []byte("x")}, false)
	// A worker of the previous version holds old5 (its lock message is
	// dequeued) while the upgrade happens.
	held := records[5]
	resp, err := b.svc.NewQueueClient(held).DequeueMessage(ctx, &azqueue.DequeueMessageOptions{VisibilityTimeout: to.Ptr(int32(60))})
	if err != nil || len(resp.Messages) != 1 {
		t.Fatalf("hold %s: %v", held, err)
	}
	if f, _ := decodeLock(*resp.Messages[0].MessageText); f.id != "old5" {
		t.Fatalf("held %s, want old5", f.id)
	}
	// A record written by the new version after the upgrade.
	d := receiveOrEnqueue(t, b, q)
	if err := b.DeadLetter(ctx, d, driver.DeadMessage{ID: "new", Body: []byte("new record")}); err != nil {
		t.Fatal(err)
	}

	// The first dead-letter call moves old0..old4 and lists them first.
	recs, next, err := b.ListDead(ctx, q, "", 100)
	if err != nil || next != "" {
		t.Fatalf("ListDead: %v, next %q", err, next)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.ID)
	}
	if fmt.Sprint(got) != "[old0 old1 old2 old3 old4 new]" {
		t.Fatalf("after the upgrade, ListDead lists %v", got)
	}
	for i, r := range recs[:5] {
		if !bytes.Equal(r.Body, want[i].Body) {
			t.Fatalf("record %s changed in the move (%d bytes, want %d)", r.ID, len(r.Body), len(want[i].Body))
		}
	}
	if left := legacyQueues(t, b, q); len(left) != 2 || !slices.Contains(left, held) {
		t.Fatalf("legacy queues left after the move: %v, want the held record's and the half-written one's", left)
	}

	// The previous version's holder lets go (keep): the next check moves it.
	if _, err := b.svc.NewQueueClient(held).UpdateMessage(ctx, *resp.Messages[0].MessageID, *resp.Messages[0].PopReceipt,
		*resp.Messages[0].MessageText, &azqueue.UpdateMessageOptions{VisibilityTimeout: to.Ptr(int32(0))}); err != nil {
		t.Fatal(err)
	}
	if moved, err := b.MigrateDeadLetters(ctx, q); err != nil || moved != 1 {
		t.Fatalf("MigrateDeadLetters = %d, %v; want 1", moved, err)
	}
	if moved, err := b.MigrateDeadLetters(ctx, q); err != nil || moved != 0 {
		t.Fatalf("MigrateDeadLetters again = %d, %v; want 0", moved, err)
	}
	// Every record, in order: NextDead hands them out oldest first.
	var popped []string
	var holds []*driver.DeadDelivery
	for {
		dd, err := b.NextDead(ctx, q)
		if errors.Is(err, driver.ErrNoDeadLetters) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		popped = append(popped, dd.ID)
		if dd.ID == "old2" && !bytes.Equal(dd.Body, big) {
			t.Fatal("the chunked record changed in the move")
		}
		if len(popped) <= 4 {
			if err := b.SettleDead(ctx, dd, true); err != nil {
				t.Fatal(err)
			}
		} else {
			holds = append(holds, dd) // held: NextDead goes on to the next
		}
	}
	if fmt.Sprint(popped) != "[old0 old1 old2 old3 old4 old5 new]" {
		t.Fatalf("NextDead handed out %v", popped)
	}
	// PurgeDead removes the rest, held or not, and the half-written legacy
	// record.
	if n, err := b.PurgeDead(ctx, q); err != nil || n != 4 {
		t.Fatalf("PurgeDead = %d, %v; want 3 records and the half-written one", n, err)
	}
	if left := legacyQueues(t, b, q); len(left) != 0 {
		t.Fatalf("legacy queues left after PurgeDead: %v", left)
	}
	if err := b.SettleDead(ctx, holds[0], false); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("keep of a purged record: %v, want ErrLeaseLost", err)
	}
	if err := b.SettleDead(ctx, holds[1], true); err != nil {
		t.Fatalf("pop of a purged record: %v, want nil (it is gone)", err)
	}
}
