package nats

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

// deadEnv is a Backend on streams of its own, removed when the test ends:
// no other test's subjects share its message blocks (which would make the
// 2.9 server scan them linearly and hide the dead-letter bug), and no other
// test's calls reach its streams' API subjects (which a test that counts
// them would count).
func deadEnv(t *testing.T, url string, storage jetstream.StorageType) *Backend {
	t.Helper()
	ctx := context.Background()
	cfg := testConfig(url)
	cfg.Stream = fmt.Sprintf("APDEAD2_%06d", rand.IntN(1e6))
	cfg.Storage = storage
	b, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		nc, err := gonats.Connect(url)
		if err != nil {
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return
		}
		for _, s := range []string{b.cfg.Stream, b.delayName(), b.deadName(), b.holdName(), b.claimName()} {
			_ = js.DeleteStream(ctx, s)
		}
	})
	return b
}

// deadLetter makes a dead letter of queue q with record ID id.
func deadLetter(t *testing.T, b *Backend, q, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "m-" + id, Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.Receive(ctx, q, 1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 {
		t.Fatalf("received %d deliveries, want 1", len(ds))
	}
	if err := b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: id, Body: []byte("rec " + id)}); err != nil {
		t.Fatal(err)
	}
}

func deadURLs() map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"server":    func(t *testing.T) string { return realURL(t) },
		"inprocess": func(t *testing.T) string { return startServer(t, t.TempDir(), 0).ClientURL() },
	}
}

func listAll(t *testing.T, b *Backend, q string, limit int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	cursor := ""
	for i := 0; ; i++ {
		recs, next, err := b.ListDead(ctx, q, cursor, limit)
		if err != nil {
			t.Fatalf("ListDead %s: %v", q, err)
		}
		for _, r := range recs {
			ids = append(ids, r.ID)
		}
		if next == "" || i > 100 {
			return ids
		}
		cursor = next
	}
}

// TestDeadInterleavedDeletes: two queues' dead letters interleaved in the
// dead stream (a0 b0 a1 b1 a2 b2); queue a's newest record is deleted
// (DeleteDead, as a Redrive does), then its oldest (NextDead and
// SettleDead remove). nats-server 2.9.10 then loses track of a1 in its
// per-subject index (removeSeqPerSubject leaves the subject's First on the
// deleted last message): a lookup by subject and a consumer filtered on
// the subject no longer find it. ListDead, NextDead and PurgeDead must
// each still see it, and queue b must be untouched.
func TestDeadInterleavedDeletes(t *testing.T) {
	for name, url := range deadURLs() {
		for _, storage := range []jetstream.StorageType{jetstream.FileStorage, jetstream.MemoryStorage} {
			t.Run(name+"/"+storage.String(), func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				b := deadEnv(t, url(t), storage)
				qa, qb := "qa", "qb"
				for i := range 3 {
					deadLetter(t, b, qa, fmt.Sprint("a", i))
					deadLetter(t, b, qb, fmt.Sprint("b", i))
				}
				d, err := b.NextDead(ctx, qa)
				if err != nil || d.ID != "a0" {
					t.Fatalf("NextDead: %v %v, want a0", d, err)
				}
				if n, err := b.DeleteDead(ctx, qa, []string{"a2"}); err != nil || n != 1 {
					t.Fatalf("DeleteDead a2: %d %v", n, err)
				}
				if err := b.SettleDead(ctx, d, true); err != nil {
					t.Fatal(err)
				}
				if st, err := b.Stats(ctx, qa); err != nil || st.Dead != 1 {
					t.Fatalf("Stats: %+v %v, want 1 dead", st, err)
				}
				_, err = b.dead.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(b.deadSubject(qa)))
				t.Logf("server %s: next_by_subj of queue a from 1: %v", b.nc.ConnectedServerVersion(), err)

				if got := listAll(t, b, qa, 10); !slices.Equal(got, []string{"a1"}) {
					t.Errorf("ListDead a: %v, want [a1]", got)
				}
				if got := listAll(t, b, qa, 1); !slices.Equal(got, []string{"a1"}) {
					t.Errorf("ListDead a by pages of 1: %v, want [a1]", got)
				}
				if got := listAll(t, b, qb, 1); !slices.Equal(got, []string{"b0", "b1", "b2"}) {
					t.Errorf("ListDead b: %v, want [b0 b1 b2]", got)
				}

				// NextDead hands a1 out, keep puts it back, and it comes again.
				d, err = b.NextDead(ctx, qa)
				if err != nil || d.ID != "a1" {
					t.Errorf("NextDead after the deletes: %v %v, want a1", d, err)
				} else {
					if _, err := b.NextDead(ctx, qa); !errors.Is(err, driver.ErrNoDeadLetters) {
						t.Errorf("NextDead while a1 is held: %v, want ErrNoDeadLetters", err)
					}
					if err := b.SettleDead(ctx, d, false); err != nil {
						t.Fatal(err)
					}
					d, err = b.NextDead(ctx, qa)
					if err != nil || d.ID != "a1" {
						t.Errorf("NextDead after keep: %v %v, want a1", d, err)
					} else if err := b.SettleDead(ctx, d, false); err != nil {
						t.Fatal(err)
					}
				}

				if n, err := b.PurgeDead(ctx, qa); err != nil || n != 1 {
					t.Errorf("PurgeDead a: %d %v, want 1", n, err)
				}
				if st, err := b.Stats(ctx, qa); err != nil || st.Dead != 0 {
					t.Errorf("Stats after PurgeDead: %+v %v, want 0 dead", st, err)
				}
				if got := listAll(t, b, qb, 2); !slices.Equal(got, []string{"b0", "b1", "b2"}) {
					t.Errorf("ListDead b at the end: %v, want [b0 b1 b2]", got)
				}
			})
		}
	}
}

// TestDeadListCost measures ListDead of a page of queue a, whose records are
// spread among 10000 of queue b, with the subject index right and after it
// lost one of a's records (which makes the last page scan the stream). Set
// ASYNCPLATFORM_NATS_MEASURE=1 to run it.
func TestDeadListCost(t *testing.T) {
	if os.Getenv("ASYNCPLATFORM_NATS_MEASURE") == "" {
		t.Skip("set ASYNCPLATFORM_NATS_MEASURE=1 to measure")
	}
	ctx := context.Background()
	b := deadEnv(t, realURL(t), jetstream.FileStorage)
	qa, qb := "qa", "qb"
	var msgs []*gonats.Msg
	rec := func(q, id string) *gonats.Msg {
		m := &gonats.Msg{Subject: b.deadSubject(q), Data: []byte("rec " + id), Header: gonats.Header{}}
		m.Header.Set(hdrDeadID, id)
		return m
	}
	const others, mine = 10000, 12
	for i := range others {
		if i%(others/mine) == 0 {
			msgs = append(msgs, rec(qa, fmt.Sprint("a", len(msgs)-i)))
		}
		msgs = append(msgs, rec(qb, fmt.Sprint("b", i)))
	}
	if err := b.publish(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	page := func(what string) {
		start := time.Now()
		var n int
		cursor := ""
		for {
			recs, next, err := b.ListDead(ctx, qa, cursor, 10)
			if err != nil {
				t.Fatal(err)
			}
			n += len(recs)
			t.Logf("%s: page of %d in %v", what, len(recs), time.Since(start))
			start = time.Now()
			if next == "" {
				break
			}
			cursor = next
		}
		t.Logf("%s: %d records", what, n)
	}
	page("index right")
	start := time.Now()
	var seen int
	if err := b.scanDead(ctx, b.deadSubject(qa), 1, 0, func(*jetstream.RawStreamMsg) bool { seen++; return true }); err != nil {
		t.Fatal(err)
	}
	t.Logf("scan of the whole stream (%d messages, %d of a): %v", others+mine, seen, time.Since(start))
	start = time.Now()
	if _, err := b.Stats(ctx, qa); err != nil {
		t.Fatal(err)
	}
	t.Logf("one subject count: %v", time.Since(start))
}
