package pause_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/kv"
	"github.com/asyncplatform/asyncplatform/internal/pause"
)

// poll is the tests' Config.Poll: short, so that a change is read at once.
const poll = 10 * time.Millisecond

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// backend is a memory connection whose store reads can be made to fail,
// and which records the queues it was asked to release (driver.Releaser).
type backend struct {
	*memory.Backend
	broker *memory.Broker
	down   atomic.Bool // Get and List fail

	mu       sync.Mutex
	released []string
}

func (b *backend) Get(ctx context.Context, key string) ([]byte, string, error) {
	if b.down.Load() {
		return nil, "", errors.New("store unreachable")
	}
	return b.Backend.Get(ctx, key)
}

func (b *backend) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if b.down.Load() {
		return nil, errors.New("store unreachable")
	}
	return b.Backend.List(ctx, prefix, after, limit)
}

func (b *backend) Release(_ context.Context, queue string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.released = append(b.released, queue)
	return nil
}

func (b *backend) Released() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.released)
}

// newBackend returns a connection to a new memory broker.
func newBackend(t *testing.T) *backend {
	t.Helper()
	br := memory.NewBroker()
	m := br.Connect()
	t.Cleanup(func() { _ = m.Close() })
	return &backend{Backend: m, broker: br}
}

// config returns a Config over b's store (namespace kv.Flow).
func config(t *testing.T, b *backend) pause.Config {
	t.Helper()
	d, err := driver.StoreOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return pause.Config{
		Store: kv.Of(d, kv.Flow), Backend: b, Log: quiet, Poll: poll, Lease: time.Second, Worker: "w1",
		Declare: b.Declare,
	}
}

func TestPauseResumeQueue(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t)
	cfg := config(t, b)
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 3600))
	cfg.Now = func() time.Time { return at }
	e := pause.New(cfg)

	if err := e.Pause(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	at = at.Add(time.Hour)
	if err := e.Pause(ctx, "q"); err != nil { // paused already: the first record stays
		t.Fatalf("Pause of a paused queue: %v", err)
	}
	v, _, err := b.Backend.Get(ctx, "_flow/pause/q")
	if want := `{"at":"2030-01-02T02:04:05Z","by":"w1"}`; err != nil || string(v) != want {
		t.Errorf("record = %s, %v; want %s", v, err, want)
	}
	if err := e.Pause(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Store.Create(ctx, "pause/x/y", nil, 0); err != nil { // no queue name
		t.Fatal(err)
	}
	if got, err := e.Queues(ctx); err != nil || !slices.Equal(got, []string{"a", "q"}) {
		t.Errorf("Queues = %q, %v; want [a q]", got, err)
	}
	if p, err := e.Paused(ctx, "q"); err != nil || !p {
		t.Errorf("Paused(q) = %v, %v; want true", p, err)
	}
	for range 2 { // resuming a queue not paused does nothing
		if err := e.Resume(ctx, "q"); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := e.Paused(ctx, "q"); err != nil || p {
		t.Errorf("Paused(q) after Resume = %v, %v; want false", p, err)
	}
	if got, err := e.Queues(ctx); err != nil || !slices.Equal(got, []string{"a"}) {
		t.Errorf("Queues after Resume = %q, %v; want [a]", got, err)
	}
}

func TestNoStore(t *testing.T) {
	ctx := context.Background()
	why := fmt.Errorf("%w: the backend keeps no shared state", driver.ErrNoStore)
	e := pause.New(pause.Config{NoStore: why, Log: quiet, Poll: poll, Queues: []string{"q"}})
	for name, err := range map[string]error{
		"Pause":      e.Pause(ctx, "q"),
		"Resume":     e.Resume(ctx, "q"),
		"PauseGroup": e.PauseGroup(ctx, "q", "g"),
		"ResumeGroup": func() error {
			_, err := e.ResumeGroup(ctx, "q", "g")
			return err
		}(),
		"Groups": func() error {
			_, err := e.Groups(ctx, "q")
			return err
		}(),
	} {
		if !errors.Is(err, driver.ErrNoStore) || !strings.Contains(fmt.Sprint(err), "keeps no shared state") {
			t.Errorf("%s = %v; want the backend's ErrNoStore", name, err)
		}
	}
	if q, err := e.Queues(ctx); q != nil || err != nil {
		t.Errorf("Queues = %q, %v; want none", q, err)
	}
	if p, err := e.Paused(ctx, "q"); p || err != nil {
		t.Errorf("Paused = %v, %v; want false", p, err)
	}
	if err := e.Start(ctx, ctx); err != nil || e.Gate("q") != nil {
		t.Errorf("Start = %v, gate %v; want nil, no gate", err, e.Gate("q"))
	}
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Error("Run without a store did not return")
	}
	if g := e.Group(ctx, "q", "g", "id"); g != decide.GroupOpen {
		t.Errorf("Group = %v; want open", g)
	}
}

func TestCheckGroup(t *testing.T) {
	long := strings.Repeat("q", driver.MaxQueueLen-len(".held.")-3)
	for _, c := range []struct {
		queue, group string
		ok           bool
	}{
		{"q", "acme", true},
		{"q", "a_b-C9", true},
		{"q", strings.Repeat("g", pause.MaxGroupLen), true},
		{"q", "", false},
		{"q", strings.Repeat("g", pause.MaxGroupLen+1), false},
		{"q", "a.b", false},
		{"q", "a/b", false},
		{"q", "é", false},
		{long, "abc", true},   // QUEUE.held.GROUP is MaxQueueLen bytes
		{long, "abcd", false}, // one more
	} {
		err := pause.CheckGroup(c.queue, c.group)
		if (err == nil) != c.ok {
			t.Errorf("CheckGroup(%q, %q) = %v; want ok %v", c.queue, c.group, err, c.ok)
		}
	}
	if got := pause.HeldQueue("q", "acme"); got != "q.held.acme" {
		t.Errorf("HeldQueue = %q", got)
	}
}

// recorder records the calls of Config.Hold and Config.Wake.
type recorder struct {
	mu    sync.Mutex
	held  []string
	wakes int
}

func (r *recorder) hold(q string) { r.mu.Lock(); r.held = append(r.held, q); r.mu.Unlock() }
func (r *recorder) wake()         { r.mu.Lock(); r.wakes++; r.mu.Unlock() }

func (r *recorder) get() ([]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := slices.Clone(r.held)
	slices.Sort(h)
	return h, r.wakes
}

// eventually fails the test unless cond holds within a second.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Second); !cond(); time.Sleep(poll) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within a second", what)
		}
	}
}

// TestPollHoldsGates: a worker's gates follow the paused queues, a
// priority level with its queue; a queue just paused wakes the fetchers
// and is handed back (the backend's Release, then Hold), one just resumed
// wakes the fetchers.
func TestPollHoldsGates(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := newBackend(t)
	admin := pause.New(config(t, b))
	var r recorder
	cfg := config(t, b)
	cfg.Queues = []string{"a", "a.prio1", "b"}
	cfg.Levels = map[string]string{"a.prio1": "a"}
	cfg.Hold, cfg.Wake = r.hold, r.wake
	w := pause.New(cfg)
	if err := w.Start(ctx, ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()

	open := func() []bool { return []bool{w.Gate("a").OK(), w.Gate("a.prio1").OK(), w.Gate("b").OK()} }
	if got := open(); !slices.Equal(got, []bool{true, true, true}) {
		t.Fatalf("gates open before any pause = %v", got)
	}
	if err := admin.Pause(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a and its level held, b open", func() bool { return slices.Equal(open(), []bool{false, false, true}) })
	eventually(t, "a and its level handed back", func() bool {
		h, _ := r.get()
		rel := b.Released()
		slices.Sort(rel)
		return slices.Equal(h, []string{"a", "a.prio1"}) && slices.Equal(rel, h)
	})
	_, before := r.get()
	if before != 2 {
		t.Errorf("Wake called %d times on pausing a queue and its level; want 2 (a pool cancels its Receive of a paused queue)", before)
	}
	if err := admin.Resume(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every gate open again", func() bool { return slices.Equal(open(), []bool{true, true, true}) })
	if _, wakes := r.get(); wakes-before != 2 {
		t.Errorf("Wake called %d times after resuming a queue and its level; want 2", wakes-before)
	}

	// A worker started while its queue is paused claims nothing.
	if err := admin.Pause(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	late := pause.New(cfg)
	if err := late.Start(ctx, ctx); err != nil {
		t.Fatal(err)
	}
	if late.Gate("b").OK() || !late.Gate("a").OK() {
		t.Errorf("after Start with b paused: a open %v, b open %v", late.Gate("a").OK(), late.Gate("b").OK())
	}

	cancel()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Error("Run did not return when its context ended")
	}
}

// TestReleaseWaitsForReceive: a queue just paused is released by the
// backend only once no Receive of it runs (a RabbitMQ Release beside a
// running Receive does nothing), then handed back.
func TestReleaseWaitsForReceive(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := newBackend(t)
	admin := pause.New(config(t, b))
	var r recorder
	var receiving atomic.Bool
	receiving.Store(true)
	asked := make(chan struct{}, 1)
	cfg := config(t, b)
	cfg.Queues = []string{"a"}
	cfg.Hold, cfg.Wake = r.hold, r.wake
	cfg.Receiving = func(queue string) bool {
		if queue != "a" {
			t.Errorf("Receiving asked of %q, want a", queue)
		}
		select {
		case asked <- struct{}{}:
		default:
		}
		return receiving.Load()
	}
	w := pause.New(cfg)
	if err := w.Start(ctx, ctx); err != nil {
		t.Fatal(err)
	}
	go w.Run(ctx)
	if err := admin.Pause(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	for range 2 { // asked again: still waiting
		select {
		case <-asked:
		case <-time.After(30 * time.Second):
			t.Fatal("the pause never asked whether the queue's Receive runs")
		}
	}
	if rel := b.Released(); len(rel) != 0 {
		t.Fatalf("Release of %v called while the queue's Receive ran", rel)
	}
	if h, _ := r.get(); len(h) != 0 {
		t.Fatalf("Hold of %v called while the queue's Receive ran", h)
	}
	receiving.Store(false)
	eventually(t, "a released, then handed back", func() bool {
		h, _ := r.get()
		return slices.Equal(b.Released(), []string{"a"}) && slices.Equal(h, []string{"a"})
	})
}

// TestGroupState: the gate's view of a job's group is the last poll's,
// read again from the store before a job is set aside.
func TestGroupState(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name         string
		group        string
		polled       bool // paused when the worker last polled
		resumedSince bool // the pause was ended after that poll
		storeDown    bool // the store cannot be read
		want         decide.Group
	}{
		{name: "no group", group: "", polled: true, want: decide.GroupOpen},
		{name: "paused", group: "g", polled: true, want: decide.GroupPaused},
		{name: "other group", group: "h", polled: true, want: decide.GroupOpen},
		{name: "paused since the poll", group: "g", polled: false, want: decide.GroupOpen},
		{name: "resumed since the poll", group: "g", polled: true, resumedSince: true, want: decide.GroupOpen},
		{name: "store down", group: "g", polled: true, storeDown: true, want: decide.GroupUnknown},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBackend(t)
			cfg := config(t, b)
			cfg.Queues = []string{"q"}
			e := pause.New(cfg)
			if c.polled {
				if err := e.PauseGroup(ctx, "q", "g"); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.Start(ctx, ctx); err != nil { // the poll
				t.Fatal(err)
			}
			if !c.polled {
				if err := e.PauseGroup(ctx, "q", "g"); err != nil {
					t.Fatal(err)
				}
			}
			if c.resumedSince {
				if err := cfg.Store.Delete(ctx, "group/q/g", ""); err != nil {
					t.Fatal(err)
				}
			}
			b.down.Store(c.storeDown)
			if got := e.Group(ctx, "q", c.group, "job1"); got != c.want {
				t.Errorf("Group = %v; want %v", got, c.want)
			}
		})
	}
}

func TestPausedGroups(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t)
	cfg := config(t, b)
	e := pause.New(cfg)
	for _, g := range []string{"zeta", "acme", "acme"} {
		if err := e.PauseGroup(ctx, "q", g); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.PauseGroup(ctx, "other", "beta"); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Store.Create(ctx, "group/q/no.group", nil, 0); err != nil { // no group name
		t.Fatal(err)
	}
	if v, _, err := b.Backend.Get(ctx, "_flow/group/q/acme"); err != nil || len(v) != 0 {
		t.Errorf("group key = %q, %v; want an empty value", v, err)
	}
	if got, err := e.Groups(ctx, "q"); err != nil || !slices.Equal(got, []string{"acme", "zeta"}) {
		t.Errorf("Groups(q) = %q, %v; want [acme zeta]", got, err)
	}
}

// TestParkAndResumeGroup: Park writes the held copy before it
// acknowledges; ResumeGroup ends the pause and moves the held jobs back in
// order, a job held twice once, a message that is no job as it is, each
// seen as delivered once.
func TestParkAndResumeGroup(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t)
	cfg := config(t, b)
	var deliveries []int
	var received []string // the bodies in the order ResumeGroup received them
	cfg.MoveBack = func(d *driver.Delivery) (string, driver.Message) {
		deliveries = append(deliveries, d.Deliveries)
		received = append(received, string(d.Body))
		id, ok := strings.CutPrefix(string(d.Body), "job:")
		if !ok {
			return "", driver.Message{ID: "raw", Body: d.Body}
		}
		return id, driver.Message{ID: id + ".back", Body: d.Body}
	}
	e := pause.New(cfg)
	held := pause.HeldQueue("q", "g")
	if err := e.PauseGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"job:1", "job:2", "job:1", "junk"} {
		ack := func() error {
			if st, err := b.Stats(ctx, held); err != nil || st.Ready == 0 {
				return fmt.Errorf("acknowledged before the held copy was written: %+v, %v", st, err)
			}
			return nil
		}
		if err := e.Park(ctx, "q", "g", body, driver.Message{ID: body, Body: []byte(body)}, ack); err != nil {
			t.Fatalf("Park(%s): %v", body, err)
		}
	}

	// A Park whose held copy cannot be written writes nothing and does
	// not acknowledge.
	bad := cfg
	bad.Declare = func(context.Context, string) error { return errors.New("broker down") }
	acked := false
	err := pause.New(bad).Park(ctx, "q", "g", "x", driver.Message{ID: "x", Body: []byte("job:x")}, func() error { acked = true; return nil })
	if !errors.Is(err, pause.ErrNotParked) || acked {
		t.Errorf("Park with the broker down = %v, acknowledged %v; want ErrNotParked, not acknowledged", err, acked)
	}

	// The held jobs were delivered once already, by a process that died
	// (which leaves them in no particular order).
	other := b.broker.Connect()
	if ds, err := other.Receive(ctx, held, 10, time.Minute); err != nil || len(ds) != 4 {
		t.Fatalf("Receive from the held queue = %d, %v", len(ds), err)
	}
	_ = other.Close()

	n, err := e.ResumeGroup(ctx, "q", "g")
	if err != nil || n != 3 {
		t.Fatalf("ResumeGroup = %d, %v; want 3", n, err)
	}
	if !slices.Equal(deliveries, []int{1, 1, 1, 1}) {
		t.Errorf("MoveBack saw deliveries %v; want each 1 (held, not crashed)", deliveries)
	}
	if g, err := e.Groups(ctx, "q"); err != nil || len(g) != 0 {
		t.Errorf("Groups after ResumeGroup = %q, %v; want none", g, err)
	}
	if st, err := b.Stats(ctx, held); err != nil || st.Ready+st.InFlight != 0 {
		t.Errorf("held queue after ResumeGroup = %+v, %v; want empty", st, err)
	}
	ds, err := b.Receive(ctx, "q", 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, string(d.Body))
	}
	var want []string // as received, a job's second copy left out
	for _, r := range received {
		if r == "junk" || !slices.Contains(want, r) {
			want = append(want, r)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("moved back %q; want %q, as received (%q)", got, want, received)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"job:1", "job:2", "junk"}) {
		t.Errorf("moved back %q; want each job once, and the message that is no job", got)
	}
}

func TestResumeGroupContextEnds(t *testing.T) {
	b := newBackend(t)
	e := pause.New(config(t, b))
	ctx, cancel := context.WithTimeout(context.Background(), poll)
	defer cancel()
	if n, err := e.ResumeGroup(ctx, "q", "g"); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ResumeGroup = %d, %v; want 0, the context's error", n, err)
	}
}
