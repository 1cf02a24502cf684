package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

func testRoundTripFields(t *testing.T, e *env) {
	got := make(chan ap.Job, 1)
	w := e.worker(e.config()).handle(t, "rt", func(_ context.Context, j *ap.Job) error {
		got <- *j
		return nil
	})
	deadline := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	notBefore := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	job := &ap.Job{
		ID:        "id-" + e.queue,
		Type:      "rt",
		Payload:   []byte("payload \x00\xff"),
		Headers:   map[string]string{"traceparent": "00-abc-def-01", "ünïcode": "välue", "empty": ""},
		NotBefore: notBefore,
		Deadline:  deadline,
		Policy:    ap.Policy{RetryLimit: ap.Limit(7), PoisonLimit: ap.Limit(2), Timeout: 42 * time.Second},
	}
	e.enqueue(w.P, job)
	if job.EnqueuedAt.IsZero() {
		t.Errorf("Enqueue did not set EnqueuedAt")
	}
	w.start(t)
	var j ap.Job
	select {
	case j = <-got:
	case <-time.After(e.opts.Wait):
		t.Fatalf("job never delivered\n%s", e.rec)
	}
	if j.ID != job.ID || j.Type != "rt" || j.Queue != e.queue || !bytes.Equal(j.Payload, job.Payload) {
		t.Errorf("got ID %q Type %q Queue %q Payload %q; want %q %q %q %q", j.ID, j.Type, j.Queue, j.Payload, job.ID, "rt", e.queue, job.Payload)
	}
	if len(j.Headers) != len(job.Headers) {
		t.Errorf("headers: got %v, want %v", j.Headers, job.Headers)
	}
	for k, v := range job.Headers {
		if got, ok := j.Headers[k]; !ok || got != v {
			t.Errorf("header %q: got %q (present %v), want %q", k, got, ok, v)
		}
	}
	if !j.EnqueuedAt.Equal(job.EnqueuedAt) || !j.Deadline.Equal(deadline) || !j.NotBefore.Equal(notBefore) {
		t.Errorf("times: EnqueuedAt %v/%v Deadline %v/%v NotBefore %v/%v", j.EnqueuedAt, job.EnqueuedAt, j.Deadline, deadline, j.NotBefore, notBefore)
	}
	if j.Policy.RetryLimit == nil || *j.Policy.RetryLimit != 7 || j.Policy.PoisonLimit == nil || *j.Policy.PoisonLimit != 2 || j.Policy.Timeout != 42*time.Second {
		t.Errorf("policy did not round-trip: %+v", j.Policy)
	}
	if j.TryCount != 1 || j.Failures != 0 || j.Crashes != 0 || len(j.Errors) != 0 {
		t.Errorf("first attempt: TryCount %d Failures %d Crashes %d Errors %v; want 1 0 0 none", j.TryCount, j.Failures, j.Crashes, j.Errors)
	}
	if job.TryCount != 0 {
		t.Errorf("an enqueued job has TryCount %d, want 0", job.TryCount)
	}
}

func testPayloads(t *testing.T, e *env) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	payloads := map[string][]byte{
		"nil":     nil,
		"empty":   {},
		"binary":  all,
		"invalid": []byte{0xff, 0xfe, 0xc3, 0x28},
		"text":    []byte(`{"hello":"world"}`),
	}
	got := map[string][]byte{}
	done := make(chan struct{}, len(payloads))
	w := e.worker(e.config()).handle(t, "p", func(_ context.Context, j *ap.Job) error {
		e.rec.mu.Lock()
		got[j.ID] = append([]byte{}, j.Payload...)
		e.rec.mu.Unlock()
		done <- struct{}{}
		return nil
	})
	for name, p := range payloads {
		e.enqueue(w.P, &ap.Job{ID: name + "-" + e.queue, Type: "p", Payload: p})
	}
	w.start(t)
	for range payloads {
		select {
		case <-done:
		case <-time.After(e.opts.Wait):
			t.Fatalf("not every payload was delivered\n%s", e.rec)
		}
	}
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	for name, p := range payloads {
		if g := got[name+"-"+e.queue]; !bytes.Equal(g, p) {
			t.Errorf("payload %s: got %x, want %x", name, g, p)
		}
	}
}

func testPayloadLimit(t *testing.T, e *env) {
	cfg := e.config()
	maxBody := e.caps.MaxBody
	if maxBody <= 0 {
		// The backend sets no limit of its own, so the platform's applies
		// (Config.MaxMessage); a 1 MiB one keeps the case light.
		cfg.MaxMessage = 1 << 20
		maxBody = cfg.MaxMessage
	}
	fetch := bodyWithinLease(t, e, maxBody)
	got := make(chan int, 4)
	w := e.worker(cfg).handle(t, "big", func(_ context.Context, j *ap.Job) error {
		for i, c := range j.Payload {
			if c != byte(i*7) {
				return ap.Permanent(fmt.Errorf("byte %d differs", i))
			}
		}
		got <- len(j.Payload)
		return nil
	})
	w.start(t)
	probe := ap.Job{ID: "0190c0de-0000-7000-8000-000000000000", Type: "big", Queue: e.queue}
	limit := w.P.MaxPayload(probe)
	t.Logf("payloads of up to %d bytes fit in a message here (the backend's MaxBody is %d)", limit, e.caps.MaxBody)
	mk := func(n int) *ap.Job {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(i * 7)
		}
		j := probe
		j.ID = fmt.Sprintf("0190c0de-0000-7000-8000-%012d", n%1_000_000_000_000)
		j.Payload = p
		return &j
	}
	e.enqueue(w.P, mk(limit-1))
	e.enqueue(w.P, mk(limit))
	err := w.P.Enqueue(ctxT(t, e.opts.Wait), mk(limit+1))
	if !errors.Is(err, ap.ErrPayloadTooLarge) {
		t.Errorf("a payload one byte over the limit: got %v, want ErrPayloadTooLarge", err)
	}
	seen := map[int]int{}
	for deadline := time.After(e.opts.Wait); seen[limit-1] == 0 || seen[limit] == 0; {
		select {
		case n := <-got:
			seen[n]++
		case <-deadline:
			t.Fatalf("limit-sized payloads not delivered intact (sizes delivered: %v; want %d and %d)%s%s\n%s", seen, limit-1, limit, e.lapses(fetch), e.stallNote(), e.rec)
		}
	}
	switch excuse := e.stallExcuse(); {
	case seen[limit-1] == 1 && seen[limit] == 1:
	case excuse != "":
		t.Logf("deliveries by size %v, duplicates allowed because: %s", seen, excuse)
	default:
		t.Errorf("deliveries by size %v, want one each of %d and %d%s", seen, limit-1, limit, e.lapses(fetch))
	}
}

// bodyWithinLease checks the backend's side of the payload limit: Enqueue
// refuses a body over MaxBody with driver.ErrTooLarge, and a body of
// maxBody bytes is handed out intact well within the lease. The lease runs
// from the claim, and the platform renews it first a third to a half of a
// lease after Receive returns: a Receive that takes half the lease to bring
// the body lets it lapse. It returns how long that Receive took.
func bodyWithinLease(t *testing.T, e *env, maxBody int) time.Duration {
	b := e.declared()
	ctx := ctxT(t, e.opts.Wait)
	if e.caps.MaxBody > 0 {
		over := make([]byte, e.caps.MaxBody+1)
		err := b.Enqueue(ctx, e.queue, []driver.Message{{ID: e.queue + "-over", Body: over}})
		if !errors.Is(err, driver.ErrTooLarge) {
			t.Errorf("Enqueue of a body of MaxBody+1 = %d bytes: got %v, want driver.ErrTooLarge", len(over), err)
		}
		// The same body second in a batch, on a queue of its own: the small
		// first message may be stored before the refusal.
		side := e.queue + "-batch"
		e.alsoDelete(side)
		sctx := ctxT(t, e.opts.Wait)
		if err := b.Declare(sctx, side); err != nil {
			t.Fatalf("Declare(%q): %v", side, err)
		}
		err = b.Enqueue(sctx, side, []driver.Message{{ID: side + "-small", Body: []byte("small")}, {ID: side + "-over", Body: over}})
		if !errors.Is(err, driver.ErrTooLarge) {
			t.Errorf("Enqueue of a batch whose second body is MaxBody+1 = %d bytes: got %v, want driver.ErrTooLarge: every message of a batch is checked", len(over), err)
		}
	}
	// A Receive is timed twice at most: one slow round on a loaded machine
	// (another process's burst, a GC of the race detector) is not the
	// backend's; two in a row are.
	var took time.Duration
	for round := range 2 {
		body := randomPayload(maxBody)
		ctx = ctxT(t, e.opts.Wait) // the checks above may have spent some of the first
		id := fmt.Sprintf("%s-max-%d", e.queue, round)
		if err := b.Enqueue(ctx, e.queue, []driver.Message{{ID: id, Body: body}}); err != nil {
			t.Fatalf("Enqueue of a body of %d bytes (the limit): %v", maxBody, err)
		}
		start := time.Now()
		ds, err := b.Receive(ctx, e.queue, 1, e.lease)
		took = time.Since(start)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Receive of a body of %d bytes: %d deliveries, %v", maxBody, len(ds), err)
		}
		if !bytes.Equal(ds[0].Body, body) {
			t.Errorf("a body of %d bytes came back as %d different bytes", maxBody, len(ds[0].Body))
		}
		e.ack(b, ds...)
		// Half a lease, stretched by the load factor (a loaded broker is slow
		// to send a megabyte) but never past nine tenths of the lease, where
		// the platform would get the delivery with its lease all but spent.
		// A Disconnecter's leases last as long as the connection.
		if _, cut := e.h.(Disconnecter); cut || took <= min(e.bound(e.lease/2), e.lease*9/10) {
			return took
		}
		if round == 0 {
			t.Logf("a body of %d bytes took %v to Receive, with a lease of %v; timing it once more", maxBody, took.Round(time.Millisecond), e.lease)
		}
	}
	t.Errorf("a body of %d bytes took %v to Receive twice in a row, with a lease of %v: the lease runs from the claim and the platform "+
		"renews it first up to half a lease after Receive returns, so a body of MaxBody bytes must be deliverable within half of "+
		"Options.Lease (raise Options.Lease, or lower MaxBody)%s", maxBody, took.Round(time.Millisecond), e.lease, e.stallNote())
	return took
}

// lapses explains, for a failure of RoundTrip/PayloadLimit, the deliveries
// whose lease lapsed before the platform could renew it.
func (e *env) lapses(fetch time.Duration) string {
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	lost := 0
	for _, a := range e.rec.results {
		if a.Outcome == ap.OutcomeLeaseLost {
			lost++
		}
	}
	if lost == 0 {
		return ""
	}
	return fmt.Sprintf("; %d attempts lost their lease before Extend (a body of the limit took %v to Receive, lease %v): "+
		"the limit must be deliverable within half of Options.Lease", lost, fetch.Round(time.Millisecond), e.lease)
}
