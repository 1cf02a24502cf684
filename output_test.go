package asyncplatform

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// failingOutput is a backend whose Enqueue to one queue fails while fail
// is set.
type failingOutput struct {
	driver.Backend
	queue string
	fail  atomic.Bool
	tries atomic.Int32
}

func (b *failingOutput) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if queue == b.queue {
		b.tries.Add(1)
		if b.fail.Load() {
			return errors.New("the broker refused the write")
		}
	}
	return b.Backend.Enqueue(ctx, queue, msgs)
}

// collect registers a consumer of ReportType on p and returns what it saw.
func collect(t *testing.T, p *Platform) func() []OutcomeReport {
	var mu sync.Mutex
	var got []OutcomeReport
	err := p.Handle(ReportType, JSON(func(_ context.Context, _ *Job, r OutcomeReport) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	return func() []OutcomeReport {
		mu.Lock()
		defer mu.Unlock()
		return append([]OutcomeReport(nil), got...)
	}
}

// TestReportPublishFailure: while the output queue refuses the report, the
// job is not acknowledged: it is requeued uncounted and ends again, and its
// report is published once the output queue takes it.
func TestReportPublishFailure(t *testing.T) {
	b := &failingOutput{Backend: memory.NewBroker().Connect(), queue: "out"}
	b.fail.Store(true)
	p, err := New(b, Config{
		Logger:      quietLog,
		RejectDelay: 20 * time.Millisecond,
		Queues:      map[string]QueueConfig{"in": {Concurrency: 1, Output: "out"}, "out": {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	var lastTry atomic.Int32
	if err := p.Handle("t", func(_ context.Context, j *Job) error {
		if runs.Add(1) == 2 {
			b.fail.Store(false) // the output queue is back
		}
		lastTry.Store(int32(j.TryCount))
		j.SetResult([]byte("r"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	reports := collect(t, p)
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	job := &Job{Type: "t", Queue: "in"}
	if err := p.Enqueue(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the report", func() bool { return len(reports()) == 1 })
	time.Sleep(100 * time.Millisecond)
	if n := runs.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2 (the first end could not be reported)", n)
	}
	if tr := lastTry.Load(); tr != 1 {
		t.Errorf("the second run had TryCount %d, want 1: the requeue must not count", tr)
	}
	r := reports()
	if len(r) != 1 || r[0].JobID != job.ID || string(r[0].Result) != "r" || r[0].Failures != 0 || r[0].Copy != 1 || r[0].Key != job.ID+"@1" {
		t.Errorf("reports %+v; want one, succeeded with the result, of copy 1", r)
	}
	if st, _ := p.Stats(context.Background(), "in"); st.Ready+st.Scheduled+st.InFlight != 0 {
		t.Errorf("the input queue still holds the job: %+v", st)
	}
}

// TestReportResultTooLarge: a result too large for a message leaves the
// report without it, saying so; the report is still published.
func TestReportResultTooLarge(t *testing.T) {
	p := startPlatform(t, Config{
		MaxMessage: 8 << 10,
		Queues:     map[string]QueueConfig{"in": {Output: "out"}, "out": {}},
	}, map[string]Handler{"big": func(_ context.Context, j *Job) error {
		j.SetResult(bytes.Repeat([]byte("x"), 20<<10))
		return nil
	}})
	reports := collect(t, p)
	if err := p.Enqueue(context.Background(), &Job{Type: "big", Queue: "in"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the report", func() bool { return len(reports()) == 1 })
	r := reports()[0]
	if !r.ResultDropped || r.Result != nil || r.ResultSize != 20<<10 || r.Outcome != OutcomeSucceeded {
		t.Errorf("report %+v; want succeeded, the result dropped, its size 20 KiB", r)
	}
}

func TestOutputConfig(t *testing.T) {
	for _, q := range []QueueConfig{{Output: "in"}, {Output: "bad name"}} {
		_, err := New(memory.NewBroker().Connect(), Config{Queues: map[string]QueueConfig{"in": q}})
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Output %q: %v, want ErrInvalidConfig", q.Output, err)
		}
	}
}

func TestDecodeReport(t *testing.T) {
	if _, err := DecodeReport(&Job{Type: "other", Payload: []byte("{}")}); err == nil {
		t.Error("a job of another type decoded as a report")
	}
	if _, err := DecodeReport(&Job{Type: ReportType, Payload: []byte("not json")}); err == nil {
		t.Error("a bad payload decoded as a report")
	}
	r, err := DecodeReport(&Job{Type: ReportType, Payload: []byte(`{"key":"a@0","outcome":"succeeded"}`)})
	if err != nil || r.Key != "a@0" || r.Outcome != OutcomeSucceeded {
		t.Errorf("DecodeReport: %+v, %v", r, err)
	}
}
