package azure

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

var azureNameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9]|-[a-z0-9])*$`)

func TestNames(t *testing.T) {
	b := &Backend{prefix: "abcdefgh"}
	inputs := []string{
		"a", "default", "orders", "Orders", "ORDERS", "orders.v2", "orders_v2", "orders-v2", "-", "--", "_", ".",
		"a-", "-a", "a--b", "h0123456789abcdef0123", "x-h0123456789abcdef0123",
		strings.Repeat("a", 34), strings.Repeat("a", 35), strings.Repeat("Z", 100), strings.Repeat("._-", 33),
	}
	seen := map[string]string{}
	for _, in := range inputs {
		n := b.names(in)
		for _, name := range []string{n.work, n.legacy + newKey(), dataQueue(n.legacy + newKey())} {
			if len(name) < 3 || len(name) > 63 || !azureNameRe.MatchString(name) {
				t.Errorf("names(%q) made invalid Azure name %q (%d chars)", in, name, len(name))
			}
		}
		if !strings.HasPrefix(n.dead, deadFolder) || !strings.HasSuffix(n.dead, "/") || strings.Count(n.dead, "/") != 2 {
			t.Errorf("names(%q) made blob prefix %q, want dead/<base>/", in, n.dead)
		}
		for _, name := range []string{n.work, n.dead, n.legacy} {
			if prev, ok := seen[name]; ok {
				t.Errorf("%q and %q both map to %q", prev, in, name)
			}
			seen[name] = in
		}
	}
	// No queue's dead-letter prefix starts another queue's.
	for a := range seen {
		for c := range seen {
			if a == c || !strings.HasPrefix(c, a) {
				continue
			}
			if strings.HasPrefix(a, deadFolder) || a[len(b.prefix)] == 'd' && c[len(b.prefix)] == 'd' {
				t.Errorf("dead-letter prefix %q is a prefix of %q", a, c)
			}
		}
	}
	if _, err := New(context.Background(), Config{ConnectionString: "x", Prefix: "Bad_"}); err == nil || !strings.Contains(err.Error(), "Prefix") {
		t.Errorf("bad prefix: %v", err)
	}
	t.Setenv(ConnectionStringEnv, "") // an empty Config falls back to it
	if _, err := New(context.Background(), Config{}); err == nil {
		t.Error("empty config accepted")
	}
}

func receiveOne(t *testing.T, b *Backend, q string, lease time.Duration) *driver.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ds, err := b.Receive(ctx, q, 1, lease)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return ds[0]
}

func TestDeliveriesAndLeases(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	body := []byte{0, 1, 2, 0xff, 0xfe, '<', '&'}
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "j1", Body: body}}); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(t, b, q, time.Second)
	if !bytes.Equal(d.Body, body) || d.Deliveries != 1 {
		t.Fatalf("got body %x deliveries %d, want %x 1", d.Body, d.Deliveries, body)
	}
	r := d.Handle.(*receipt)
	// A copy of the receipt from before Extend, its lease still running by
	// the local clock: the service must refuse its pop receipt.
	stale := receipt{b: b, q: r.q, id: r.id, pop: r.pop, content: r.content, dequeueCount: r.dequeueCount, closed: r.closed,
		until: time.Now().Add(time.Minute)}
	if err := b.Extend(ctx, d, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Ack(ctx, &driver.Delivery{Queue: q, Handle: &stale}); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("ack with the receipt from before Extend: %v, want ErrLeaseLost", err)
	}
	// Let the lease lapse: the next delivery counts 2 and the old one is
	// stale. The new delivery's lease is long: the Requeue below must find
	// it running on a loaded machine.
	d2 := receiveOne(t, b, q, 30*time.Second)
	if d2.Deliveries != 2 || !bytes.Equal(d2.Body, body) {
		t.Fatalf("redelivery: deliveries %d body %x", d2.Deliveries, d2.Body)
	}
	if err := b.Ack(ctx, d); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("ack of a lapsed delivery: %v, want ErrLeaseLost", err)
	}
	// Requeue resets the count.
	if err := b.Requeue(ctx, d2, driver.Message{ID: "j1.1", Body: []byte("v2")}); err != nil {
		t.Fatal(err)
	}
	d3 := receiveOne(t, b, q, 30*time.Second)
	if d3.Deliveries != 1 || string(d3.Body) != "v2" {
		t.Fatalf("after requeue: deliveries %d body %q", d3.Deliveries, d3.Body)
	}
	if err := b.Requeue(ctx, d2, driver.Message{Body: []byte("x")}); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("requeue of a settled delivery: %v, want ErrLeaseLost", err)
	}
	if err := b.Ack(ctx, d3); err != nil {
		t.Fatal(err)
	}
	if err := b.Ack(ctx, d3); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second ack: %v, want ErrLeaseLost", err)
	}
}

func TestTooLarge(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	limit := b.Capabilities().MaxBody
	for _, size := range []int{limit - 1, limit} {
		body := bytes.Repeat([]byte{0xa5}, size)
		body[0] = byte(size)
		if err := b.Enqueue(ctx, q, []driver.Message{{Body: body}}); err != nil {
			t.Fatalf("enqueue %d bytes (limit %d): %v", size, limit, err)
		}
		d := receiveOne(t, b, q, 5*time.Second)
		if !bytes.Equal(d.Body, body) {
			t.Fatalf("%d bytes: body changed", size)
		}
		if err := b.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	err := b.Enqueue(ctx, q, []driver.Message{{Body: make([]byte, limit+1)}})
	if !errors.Is(err, driver.ErrTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(limit)) {
		t.Fatalf("enqueue limit+1: %v, want ErrTooLarge naming %d", err, limit)
	}
	// The service itself agrees on the limit: one byte more of text fails.
	text := strings.Repeat("A", maxText+4)
	if _, err := b.svc.NewQueueClient(b.names(q).work).EnqueueMessage(ctx, text, nil); err == nil {
		t.Logf("note: the service accepted %d characters of message text", len(text))
	}
}

func TestNotBefore(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	at := time.Now().Add(1500 * time.Millisecond)
	if err := b.Enqueue(ctx, q, []driver.Message{{Body: []byte("later"), NotBefore: at}}); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(t, b, q, 5*time.Second)
	if now := time.Now(); now.Before(at) {
		t.Fatalf("delivered %v before its NotBefore", at.Sub(now))
	}
	if d.Deliveries != 1 {
		t.Fatalf("deliveries %d, want 1", d.Deliveries)
	}

	// A message that surfaces before its NotBefore (as one scheduled beyond
	// Azure's 7-day visibility cap does) is hidden again without counting.
	early := workFrame{notBefore: time.Now().Add(2 * time.Second), body: []byte("early")}.encode()
	wq := b.svc.NewQueueClient(b.names(q).work)
	if _, err := wq.EnqueueMessage(ctx, early, &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))}); err != nil {
		t.Fatal(err)
	}
	d = receiveOne(t, b, q, 5*time.Second)
	if string(d.Body) != "early" || d.Deliveries != 1 {
		t.Fatalf("got %q deliveries %d, want early 1", d.Body, d.Deliveries)
	}
}

func TestForeignMessage(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	wq := b.svc.NewQueueClient(b.names(q).work)
	if _, err := wq.EnqueueMessage(ctx, "not base64 at all", nil); err != nil {
		t.Fatal(err)
	}
	d := receiveOne(t, b, q, 5*time.Second)
	if string(d.Body) != "not base64 at all" || d.Deliveries != 1 {
		t.Fatalf("got %q deliveries %d", d.Body, d.Deliveries)
	}
	if err := b.Extend(ctx, d, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.DeadLetter(ctx, d, driver.DeadMessage{ID: "foreign", Body: d.Body}); err != nil {
		t.Fatal(err)
	}
	dd, err := b.NextDead(ctx, q)
	if err != nil || dd.ID != "foreign" || string(dd.Body) != "not base64 at all" {
		t.Fatalf("NextDead: %v %+v", err, dd)
	}
}

// deadLetterN dead-letters n jobs with IDs id0..id<n-1>, in order.
func deadLetterN(t *testing.T, b *Backend, q string, n int, body func(i int) []byte) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		if err := b.Enqueue(ctx, q, []driver.Message{{Body: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		d := receiveOne(t, b, q, 10*time.Second)
		if err := b.DeadLetter(ctx, d, driver.DeadMessage{ID: fmt.Sprintf("id%d", i), Body: body(i)}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	const n = 40
	deadLetterN(t, b, q, n, func(i int) []byte { return []byte(fmt.Sprintf("rec%d", i)) })

	// No queue per record: the records are blobs.
	if left := legacyQueues(t, b, q); len(left) != 0 {
		t.Fatalf("dead letters made queues: %v", left)
	}
	// Listing in pages with the service's marker, oldest first, changes
	// nothing.
	for range 2 {
		var all []string
		cursor := ""
		for {
			recs, next, err := b.ListDead(ctx, q, cursor, 7)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) > 7 {
				t.Fatalf("page of %d > limit 7", len(recs))
			}
			for _, r := range recs {
				all = append(all, r.ID+"="+string(r.Body))
			}
			if next == "" {
				break
			}
			cursor = next
		}
		if len(all) != n {
			t.Fatalf("listed %d records, want %d: %v", len(all), n, all)
		}
		for i, s := range all {
			if want := fmt.Sprintf("id%d=rec%d", i, i); s != want {
				t.Fatalf("record %d is %s, want %s", i, s, want)
			}
		}
	}
	_, next, err := b.ListDead(ctx, q, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.ListDead(ctx, q+"x", next, 1); err == nil {
		t.Fatal("ListDead took another queue's cursor")
	}
	if st, err := b.Stats(ctx, q); err != nil || st.Dead != n || st.Ready != 0 {
		t.Fatalf("stats %+v %v", st, err)
	}

	// Keep: the next call sees the same record.
	dd, err := b.NextDead(ctx, q)
	if err != nil || dd.ID != "id0" {
		t.Fatalf("NextDead: %v %v", dd, err)
	}
	if err := b.SettleDead(ctx, dd, false); err != nil {
		t.Fatal(err)
	}
	dd, err = b.NextDead(ctx, q)
	if err != nil || dd.ID != "id0" {
		t.Fatalf("NextDead after keep: %v %v", dd, err)
	}
	// While held, others get the next records, never the same one.
	var wg sync.WaitGroup
	got := make([]string, 4)
	held := make([]*driver.DeadDelivery, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := b.NextDead(ctx, q)
			if err != nil {
				t.Error(err)
				return
			}
			got[i], held[i] = d.ID, d
		}()
	}
	wg.Wait()
	seen := map[string]bool{"id0": true}
	for _, id := range got {
		if seen[id] {
			t.Fatalf("two callers got %s: %v", id, got)
		}
		seen[id] = true
	}
	if err := b.SettleDead(ctx, dd, true); err != nil {
		t.Fatal(err)
	}
	if err := b.SettleDead(ctx, dd, true); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("second settle: %v, want ErrLeaseLost", err)
	}
	for _, h := range held {
		if err := b.SettleDead(ctx, h, false); err != nil {
			t.Fatal(err)
		}
	}
	dd, err = b.NextDead(ctx, q)
	if err != nil || dd.ID != "id1" {
		t.Fatalf("NextDead after pop: %v %v", dd, err)
	}
	// DeleteDead leaves a held record alone: a delete without the lease is
	// refused.
	if c, err := b.DeleteDead(ctx, q, []string{"id1", "id5", "id6", "nope"}); err != nil || c != 2 {
		t.Fatalf("DeleteDead = %d %v, want 2 (id1 is held)", c, err)
	}
	if err := b.SettleDead(ctx, dd, false); err != nil {
		t.Fatal(err)
	}
	if c, err := b.PurgeDead(ctx, q); err != nil || c != n-3 {
		t.Fatalf("PurgeDead = %d %v, want %d", c, err, n-3)
	}
	if _, err := b.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Fatalf("NextDead on empty: %v", err)
	}
}

// TestDeadHolds: a holder keeps its record past DeadHold (it renews its
// lease with ExtendDead), and a holder that vanishes (its Backend closed, as
// a crashed process's would be) releases its record when its lease ends.
func TestDeadHolds(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{DeadHold: MinDeadHold})
	ctx := context.Background()
	deadLetterN(t, b, q, 3, func(i int) []byte { return []byte{byte(i)} })
	other := func() *Backend {
		c, err := New(ctx, testConfig(t, Config{DeadHold: MinDeadHold}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	b2, b3 := other(), other()
	kept, err := b.NextDead(ctx, q)
	if err != nil || kept.ID != "id0" {
		t.Fatalf("NextDead: %v %v", kept, err)
	}
	lost, err := b2.NextDead(ctx, q)
	if err != nil || lost.ID != "id1" {
		t.Fatalf("NextDead: %v %v", lost, err)
	}
	b2.Close() // the holder vanishes
	third, err := b3.NextDead(ctx, q)
	if err != nil || third.ID != "id2" {
		t.Fatalf("NextDead while id0 and id1 are held: %v %v", third, err)
	}
	if _, err := b3.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Fatalf("NextDead with every record held: %v, want ErrNoDeadLetters", err)
	}
	for end := time.Now().Add(MinDeadHold + 5*time.Second); time.Now().Before(end); {
		time.Sleep(MinDeadHold / 3)
		if err := b.ExtendDead(ctx, kept); err != nil {
			t.Fatalf("ExtendDead of a live hold: %v", err)
		}
		if err := b3.ExtendDead(ctx, third); err != nil {
			t.Fatalf("ExtendDead of a live hold: %v", err)
		}
	}
	dd, err := b3.NextDead(ctx, q)
	if err != nil || dd.ID != "id1" {
		t.Fatalf("NextDead after the holder of id1 vanished: %v %v, want id1", dd, err)
	}
	if _, err := b3.NextDead(ctx, q); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Fatalf("NextDead: %v, want ErrNoDeadLetters (id0 and id2 are held on)", err)
	}
	if err := b.SettleDead(ctx, kept, true); err != nil {
		t.Fatalf("settle of a record held past DeadHold: %v", err)
	}
	if err := b.ExtendDead(ctx, kept); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("ExtendDead after SettleDead: %v, want ErrLeaseLost", err)
	}
	if err := b2.SettleDead(ctx, lost, true); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("settle by the vanished holder: %v, want ErrClosed", err)
	}
}

// TestLargeDeadLetter: a record of any size is one blob (the queue layout
// stopped at 32 chunks of 48 KiB, about 1.5 MiB).
func TestLargeDeadLetter(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	ctx := context.Background()
	big := func(i int) []byte {
		return bytes.Repeat([]byte{byte(i), 0, 0xff}, 60_000+i*1_000_000) // 180 kB, then 3.2 MB
	}
	deadLetterN(t, b, q, 2, big)
	recs, next, err := b.ListDead(ctx, q, "", 10)
	if err != nil || next != "" || len(recs) != 2 || !bytes.Equal(recs[1].Body, big(1)) {
		t.Fatalf("ListDead: %d records, next %q, %v", len(recs), next, err)
	}
	for i := range 2 {
		dd, err := b.NextDead(ctx, q)
		if err != nil || dd.ID != fmt.Sprintf("id%d", i) || !bytes.Equal(dd.Body, big(i)) {
			t.Fatalf("NextDead: %v", err)
		}
		if err := b.SettleDead(ctx, dd, true); err != nil {
			t.Fatal(err)
		}
	}
}

func receiveOrEnqueue(t *testing.T, b *Backend, q string) *driver.Delivery {
	if err := b.Enqueue(context.Background(), q, []driver.Message{{Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	return receiveOne(t, b, q, 10*time.Second)
}

func TestClose(t *testing.T) {
	t.Parallel()
	b, q := newBackend(t, Config{})
	errc := make(chan error, 1)
	go func() {
		_, err := b.Receive(context.Background(), q, 1, time.Second)
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	b.Close()
	if err := <-errc; !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("blocked Receive after Close: %v, want ErrClosed", err)
	}
	if err := b.Enqueue(context.Background(), q, nil); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Enqueue after Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenURL(t *testing.T) {
	conn := os.Getenv(ConnectionStringEnv)
	if conn == "" {
		t.Skip("no Azurite connection string in the environment")
	}
	ctx := context.Background()
	for _, raw := range []string{"azure:" + conn, "azure://?prefix=opentest"} {
		b, err := ap.Open(ctx, raw)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if err := b.Declare(ctx, "opentest"); err != nil {
			t.Errorf("Declare through %s: %v", raw[:8], err)
		}
		if d, ok := b.(driver.QueueDeleter); ok {
			_ = d.DeleteQueue(ctx, "opentest")
		}
		b.Close()
	}
	_, err := ap.Open(ctx, "azure:AccountKey=c2VjcmV0;NoAccountName=1")
	if err == nil || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Errorf("a bad connection string: %v (must fail without showing the key)", err)
	}
}

// TestNoQueuePerDeadLetter: dead letters, their listing, holds and
// settles create no queue. With a prefix of the test's own, the account's
// queues under it are the work queue alone, before and after.
func TestNoQueuePerDeadLetter(t *testing.T) {
	t.Parallel()
	prefix := fmt.Sprintf("n%07x", time.Now().UnixNano()&0xfffffff)
	b, q := newBackend(t, Config{Prefix: prefix})
	ctx := context.Background()
	queues := func() []string {
		t.Helper()
		var out []string
		pager := b.svc.NewListQueuesPager(&azqueue.ListQueuesOptions{Prefix: &prefix})
		for pager.More() {
			resp, err := pager.NextPage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range resp.Queues {
				out = append(out, *q.Name)
			}
		}
		return out
	}
	want := []string{b.names(q).work}
	if got := queues(); !slices.Equal(got, want) {
		t.Fatalf("queues under %q before: %q, want %q", prefix, got, want)
	}
	deadLetterN(t, b, q, 20, func(i int) []byte { return bytes.Repeat([]byte{'r'}, 100*i) })
	if _, _, err := b.ListDead(ctx, q, "", 100); err != nil {
		t.Fatal(err)
	}
	for _, keep := range []bool{false, true} {
		dd, err := b.NextDead(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.SettleDead(ctx, dd, keep); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := b.Stats(ctx, q); err != nil || st.Dead != 19 {
		t.Fatalf("Stats: %+v, %v; want 19 dead", st, err)
	}
	if got := queues(); !slices.Equal(got, want) {
		t.Fatalf("queues under %q after 20 dead letters: %q, want %q: a dead letter must not make a queue", prefix, got, want)
	}
}

// TestConnectionStringDefault: with neither ConnectionString nor Client,
// New takes $ASYNCPLATFORM_AZURE_CONNECTION_STRING (ConnectionStringEnv);
// with it empty too, New and the azure:// URL fail naming it. A Client
// keeps the variable out.
func TestConnectionStringDefault(t *testing.T) {
	client, err := azqueue.NewServiceClientWithNoCredential("http://127.0.0.1:1/devstoreaccount1", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  string
		cfg  Config
		want string
	}{
		{"unset", "", Config{}, ""},
		{"from the variable", "UseDevelopmentStorage=true", Config{}, "UseDevelopmentStorage=true"},
		{"set", "UseDevelopmentStorage=true", Config{ConnectionString: "AccountName=a"}, "AccountName=a"},
		{"client", "UseDevelopmentStorage=true", Config{Client: client}, ""},
	} {
		t.Setenv(ConnectionStringEnv, tc.env)
		if got := tc.cfg.withDefaults().ConnectionString; got != tc.want {
			t.Errorf("%s: ConnectionString defaults to %q, want %q", tc.name, got, tc.want)
		}
	}
	t.Setenv(ConnectionStringEnv, "")
	ctx := context.Background()
	if _, err := New(ctx, Config{}); !errors.Is(err, errNoAccount) || !strings.Contains(err.Error(), ConnectionStringEnv) {
		t.Errorf("New with no account: %v, want errNoAccount naming %s", err, ConnectionStringEnv)
	}
	if _, err := ap.Open(ctx, "azure://"); !errors.Is(err, errNoAccount) || !strings.Contains(err.Error(), "azure:<connection string>") {
		t.Errorf("Open(azure://) with no account: %v, want errNoAccount and the other form", err)
	}
}
