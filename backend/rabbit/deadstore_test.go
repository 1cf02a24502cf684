package rabbit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/errgroup"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
	"github.com/asyncplatform/asyncplatform/pgstore"
)

// countingStore counts the calls made to the store it wraps.
type countingStore struct {
	driver.Store
	calls atomic.Int64
}

func (s *countingStore) Get(ctx context.Context, key string) ([]byte, string, error) {
	s.calls.Add(1)
	return s.Store.Get(ctx, key)
}

func (s *countingStore) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	s.calls.Add(1)
	return s.Store.Create(ctx, key, value, ttl)
}

func (s *countingStore) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	s.calls.Add(1)
	return s.Store.Update(ctx, key, value, rev, ttl)
}

func (s *countingStore) Delete(ctx context.Context, key, rev string) error {
	s.calls.Add(1)
	return s.Store.Delete(ctx, key, rev)
}

func (s *countingStore) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	s.calls.Add(1)
	return s.Store.List(ctx, prefix, after, limit)
}

// longCtx is a context for the steps that write hundreds of records to
// the store, each a few commits: minutes on a loaded machine.
func longCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// pgCompanion opens a pgstore on the machine's PostgreSQL.
func pgCompanion(t testing.TB) driver.Store {
	t.Helper()
	url := sharedPG(2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pg, err := pgstore.New(ctx, pgstore.Config{URL: url, Table: "asyncplatform_rabbit_dead_test"})
	if err != nil {
		testenv.Unreachable(t, "PostgreSQL at "+url, err)
	}
	t.Cleanup(func() { pg.Close() })
	return pg
}

// TestDeadHeadBounded: a head read from the store is decoded within
// bounds, and anything but a head this backend wrote is refused.
func TestDeadHeadBounded(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 2*deadChunk+5)
	h := encodeHead("job-1", body, 2, body[:deadChunk])
	id, size, chunks, first, err := decodeHead(h, 1<<20)
	if err != nil || id != "job-1" || size != len(body) || chunks != 2 || !bytes.Equal(first, body[:deadChunk]) {
		t.Fatalf("round trip: %q %d %d %d bytes, %v", id, size, chunks, len(first), err)
	}
	if _, _, _, _, err := decodeHead(h, len(body)-1); !errors.Is(err, errBadHead) {
		t.Errorf("a head over the body limit: %v, want errBadHead", err)
	}
	for name, v := range map[string][]byte{
		"empty":          nil,
		"other version":  append([]byte{9}, h[1:]...),
		"truncated":      h[:10],
		"chunks too few": encodeHead("job-1", body, 1, body[:deadChunk]),
		"chunks huge":    encodeHead("job-1", body[:10], 1<<40, body[:10]),
		"first short":    encodeHead("job-1", body[:10], 0, body[:5]),
		"id too long":    encodeHead(string(bytes.Repeat([]byte("i"), maxDeadID+1)), nil, 0, nil),
	} {
		if _, _, _, _, err := decodeHead(v, 1<<20); !errors.Is(err, errBadHead) {
			t.Errorf("%s: %v, want errBadHead", name, err)
		}
	}
	if !validSeq(newSeq(time.Now())) || !validSeq(movedSeq(1, "a", nil)) || validSeq("1-2") || validSeq("../../../../x") {
		t.Error("validSeq disagrees with newSeq and movedSeq")
	}
}

// TestDeadStoreCostFlat: with a companion store, NextDead (keep and pop),
// a page of ListDead and a DeleteDead of one ID make as many store calls
// at 500 records as at 20: none reads the queue.
func TestDeadStoreCostFlat(t *testing.T) {
	t.Parallel()
	cs := &countingStore{Store: pgCompanion(t)}
	b := newBackend(t, Config{Store: cs})
	ctx := longCtx(t)
	calls := func(f func()) int64 {
		before := cs.calls.Load()
		f()
		return cs.calls.Load() - before
	}
	measure := func(q string, n int) []int64 {
		t.Cleanup(func() { // before DeleteQueue, with time for every key
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := b.dropStoreDead(ctx, q); err != nil {
				t.Error(err)
			}
		})
		if err := b.Declare(ctx, q); err != nil {
			t.Fatal(err)
		}
		base := time.Now()
		var g errgroup.Group
		g.SetLimit(16)
		for i := range n {
			g.Go(func() error {
				return b.writeDead(ctx, q, newSeq(base.Add(time.Duration(i))), driver.DeadMessage{ID: fmt.Sprintf("r%05d", i), Body: []byte("record")})
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		var out []int64
		out = append(out, calls(func() {
			dd, err := b.NextDead(ctx, q)
			if err != nil || dd.ID != "r00000" {
				t.Fatalf("NextDead at %d: %v %v", n, dd, err)
			}
			if err := b.SettleDead(ctx, dd, false); err != nil {
				t.Fatal(err)
			}
		}))
		out = append(out, calls(func() {
			dd, err := b.NextDead(ctx, q)
			if err != nil || dd.ID != "r00000" {
				t.Fatalf("NextDead after a keep at %d: %v %v", n, dd, err)
			}
			if err := b.SettleDead(ctx, dd, true); err != nil {
				t.Fatal(err)
			}
		}))
		out = append(out, calls(func() {
			recs, next, err := b.ListDead(ctx, q, "", 10)
			if err != nil || len(recs) != 10 || recs[0].ID != "r00001" || next == "" {
				t.Fatalf("ListDead at %d: %d records, next %q, %v", n, len(recs), next, err)
			}
		}))
		out = append(out, calls(func() {
			if got, err := b.DeleteDead(ctx, q, []string{fmt.Sprintf("r%05d", n/2)}); err != nil || got != 1 {
				t.Fatalf("DeleteDead at %d: %d, %v", n, got, err)
			}
		}))
		return out
	}
	small := measure(queueName(t, b), 20)
	large := measure(queueName(t, b), 500)
	if !slices.Equal(small, large) {
		t.Errorf("store calls of keep, pop, a page and a delete by ID: %v at 20 records, %v at 500; want the same", small, large)
	}
}

// TestDeadUpgradeToStore: the dead letters of a quorum dead-letter queue
// (the layout without a store) move into the store on the first
// dead-letter call of a backend with one, in their order and without a
// loss or a copy: a record an old holder keeps meanwhile moves once it is
// let go, a body larger than a store value is split and whole again, and a
// record written to the store by a move whose ack was lost is not moved
// twice.
func TestDeadUpgradeToStore(t *testing.T) {
	t.Parallel()
	old := newBackend(t, Config{})
	q := queueName(t, old)
	const n = 300
	ids := seedDeadRecords(t, old, q, n)
	ctx := longCtx(t) // the first call moves n records, a few commits each

	// A record with a body of three store values.
	big := bytes.Repeat([]byte("0123456789"), (2*deadChunk+100)/10)
	bigID := "r9999"
	if err := old.publish(ctx, outMsg{key: old.deadName(q), pub: amqp.Publishing{
		DeliveryMode: amqp.Persistent, MessageId: bigID, Body: big,
		Headers: amqp.Table{deadSeqHeader: time.Now().Add(time.Hour).UnixNano()},
	}}); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, bigID)

	// An old-version NextDead caller holds the oldest record.
	conn, err := amqp.Dial(testURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	holder, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	held, ok, err := holder.Get(old.deadName(q), false)
	if err != nil || !ok || held.MessageId != ids[0] {
		t.Fatalf("holding %s: %v %v %q", ids[0], ok, err, held.MessageId)
	}

	nb := newBackend(t, Config{Store: pgCompanion(t)})
	// A move whose ack was lost: the second record is in the store already.
	d1 := peekRecord(t, old, q)
	if d1.MessageId != ids[1] {
		t.Fatalf("the head of the queue is %s, want %s", d1.MessageId, ids[1])
	}
	if err := nb.writeDead(ctx, q, movedSeq(deadSeq(d1), d1.MessageId, d1.Body), driver.DeadMessage{ID: d1.MessageId, Body: d1.Body}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nb.dropStoreDead(context.Background(), q) })

	list := func() []string {
		var got []string
		for cursor := ""; ; {
			recs, next, err := nb.ListDead(ctx, q, cursor, 70)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				got = append(got, r.ID)
				if r.ID == bigID && !bytes.Equal(r.Body, big) {
					t.Errorf("the %d-byte record came back as %d bytes, or changed", len(big), len(r.Body))
				}
			}
			if next == "" {
				return got
			}
			cursor = next
		}
	}
	if got := list(); !slices.Equal(got, ids[1:]) {
		t.Fatalf("after the upgrade the store lists %d records (%v...), want %d in order (all but the held one)", len(got), got[:min(5, len(got))], len(ids)-1)
	}
	if st, err := nb.Stats(ctx, q); err != nil || st.Dead != int64(len(ids)-1) {
		t.Errorf("Stats.Dead while the old holder keeps one: %d, %v; want %d", st.Dead, err, len(ids)-1)
	}

	if err := holder.Nack(held.DeliveryTag, false, true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for nb.ready(ctx, nb.deadName(q)) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the old holder's record did not come back to the queue")
		}
		time.Sleep(20 * time.Millisecond)
	}
	dd, err := nb.NextDead(ctx, q)
	if err != nil || dd.ID != ids[0] {
		t.Fatalf("NextDead after the old holder let go: %v, %v; want the oldest, %s", dd, err, ids[0])
	}
	if err := nb.SettleDead(ctx, dd, false); err != nil {
		t.Fatal(err)
	}
	if got := list(); !slices.Equal(got, ids) {
		t.Errorf("after the upgrade: %d records (%v...), want %d in order, each once", len(got), got[:min(5, len(got))], len(ids))
	}
	if r := nb.ready(ctx, nb.deadName(q)); r != 0 {
		t.Errorf("the quorum dead-letter queue after the upgrade: %d records, want 0", r)
	}
}

// peekRecord returns, without taking it, the head of the quorum
// dead-letter queue of q: basic.get on a channel it then closes, which
// hands the record back.
func peekRecord(t *testing.T, b *Backend, q string) amqp.Delivery {
	t.Helper()
	ctx := testCtx(t)
	ready := b.ready(ctx, b.deadName(q))
	var got amqp.Delivery
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		d, ok, err := ch.Get(b.deadName(q), false)
		if err == nil && !ok {
			err = errors.New("the queue is empty")
		}
		got = d
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.waitReady(ctx, b.deadName(q), ready); n != ready {
		t.Fatalf("%d records ready after a peek, want %d", n, ready)
	}
	return got
}

// TestDeadStoreForeignHead: a head in the store that this backend did not
// write (garbage under a record's key) is handed out in its place, its ID
// its seq and its body the bytes, so that the platform reports it as
// undecodable and it can be popped or deleted; the records behind it are
// not blocked.
func TestDeadStoreForeignHead(t *testing.T) {
	t.Parallel()
	st := pgCompanion(t)
	b := newBackend(t, Config{Store: st})
	q := queueName(t, b)
	ctx := testCtx(t)
	t.Cleanup(func() { _ = b.dropStoreDead(context.Background(), q) })
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	base := time.Now()
	var seqs []string
	for i, v := range [][]byte{[]byte("not a head"), {deadHeadVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}} {
		seq := newSeq(base.Add(time.Duration(i)))
		if _, err := st.Create(ctx, b.headKey(q, seq), v, 0); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	if err := b.writeDead(ctx, q, newSeq(base.Add(time.Second)), driver.DeadMessage{ID: "good", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	recs, _, err := b.ListDead(ctx, q, "", 10)
	if err != nil || len(recs) != 3 || recs[0].ID != seqs[0] || string(recs[0].Body) != "not a head" || recs[2].ID != "good" {
		t.Fatalf("ListDead with foreign heads: %v, %v", recs, err)
	}
	dd, err := b.NextDead(ctx, q)
	if err != nil || dd.ID != seqs[0] {
		t.Fatalf("NextDead with a foreign head first: %v, %v; want it, as %s", dd, err, seqs[0])
	}
	if err := b.SettleDead(ctx, dd, true); err != nil {
		t.Fatalf("popping a foreign head: %v", err)
	}
	if n, err := b.DeleteDead(ctx, q, []string{seqs[1]}); err != nil || n != 1 {
		t.Fatalf("DeleteDead of a foreign head by its seq: %d, %v; want 1", n, err)
	}
	dd, err = b.NextDead(ctx, q)
	if err != nil || dd.ID != "good" {
		t.Fatalf("NextDead after the foreign heads: %v, %v; want good", dd, err)
	}
	if err := b.SettleDead(ctx, dd, false); err != nil {
		t.Fatal(err)
	}
}

// batchingStore counts the writes made to the store it wraps, a batch
// call as one (one commit on PostgreSQL), and the counts; it forwards the
// batch calls of a store that has them.
type batchingStore struct {
	driver.Store
	writes, counts atomic.Int64
}

func (s *batchingStore) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	s.writes.Add(1)
	return s.Store.Create(ctx, key, value, ttl)
}

func (s *batchingStore) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	s.writes.Add(1)
	return s.Store.Update(ctx, key, value, rev, ttl)
}

func (s *batchingStore) Delete(ctx context.Context, key, rev string) error {
	s.writes.Add(1)
	return s.Store.Delete(ctx, key, rev)
}

func (s *batchingStore) GetEach(ctx context.Context, keys []string) ([]driver.BatchResult, error) {
	return s.Store.(driver.StoreBatcher).GetEach(ctx, keys)
}

func (s *batchingStore) CreateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	s.writes.Add(1)
	return s.Store.(driver.StoreBatcher).CreateEach(ctx, items)
}

func (s *batchingStore) DeleteEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	s.writes.Add(1)
	return s.Store.(driver.StoreBatcher).DeleteEach(ctx, items)
}

func (s *batchingStore) ListEach(ctx context.Context, prefixes []string, limit int) ([][]string, error) {
	return s.Store.(driver.StoreBatcher).ListEach(ctx, prefixes, limit)
}

func (s *batchingStore) Count(ctx context.Context, prefix string) (int64, error) {
	s.counts.Add(1)
	return s.Store.(driver.StoreCounter).Count(ctx, prefix)
}

// TestDeadStoreBatchedDelete: on a store with batches, a DeleteDead of
// many IDs (what a redrive does, 500 at a time) makes three writes a round
// of deadBatch records, whatever their number (before: four a record);
// it leaves a held record alone, and removes every key of the others.
// Stats counts the records with one count query.
func TestDeadStoreBatchedDelete(t *testing.T) {
	t.Parallel()
	bs := &batchingStore{Store: pgCompanion(t)}
	b := newBackend(t, Config{Store: bs})
	ctx := longCtx(t)
	q := queueName(t, b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := b.dropStoreDead(ctx, q); err != nil {
			t.Error(err)
		}
	})
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	const n = deadBatch + 100 // two rounds
	base := time.Now()
	var g errgroup.Group
	g.SetLimit(16)
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("r%05d", i)
		g.Go(func() error {
			body := []byte("record")
			if i == 7 {
				body = bytes.Repeat([]byte("b"), 2*deadChunk+1) // two chunk keys
			}
			return b.writeDead(ctx, q, newSeq(base.Add(time.Duration(i))), driver.DeadMessage{ID: ids[i], Body: body})
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	st, err := b.Stats(ctx, q)
	if err != nil || st.Dead != n || bs.counts.Load() != 1 {
		t.Fatalf("Stats: Dead %d (%v) with %d count queries; want %d with 1", st.Dead, err, bs.counts.Load(), n)
	}
	held, err := b.NextDead(ctx, q)
	if err != nil || held.ID != ids[0] {
		t.Fatalf("NextDead: %v %v", held, err)
	}
	before := bs.writes.Load()
	got, err := b.DeleteDead(ctx, q, ids)
	writes := bs.writes.Load() - before
	if err != nil || got != n-1 {
		t.Fatalf("DeleteDead of %d IDs, one held: removed %d (%v), want %d", n, got, err, n-1)
	}
	if writes > 3*2 {
		t.Errorf("DeleteDead of %d records made %d writes, want at most 3 a round of %d (6)", n-1, writes, deadBatch)
	}
	keys, err := bs.List(ctx, b.deadScope(q), "", 100)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, k := range keys {
		left = append(left, k[len(b.deadScope(q)):len(b.deadScope(q))+2])
	}
	if !slices.Equal(left, []string{"h/", "i/", "r/"}) { // the held record's hold, index key and head
		t.Errorf("%d keys left after the delete, the first %q; want the held record's hold, index key and head", len(keys), keys[:min(len(keys), 5)])
	}
	if err := b.SettleDead(ctx, held, false); err != nil {
		t.Fatal(err)
	}
	recs, _, err := b.ListDead(ctx, q, "", 10)
	if err != nil || len(recs) != 1 || recs[0].ID != ids[0] {
		t.Fatalf("ListDead after the keep: %v %v; want the held record alone", recs, err)
	}
}
