package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/enqueue"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// published is one call of Reporter.Enqueue.
type published struct {
	id, out, nonce string
	rep            Report
}

func reporter(t *testing.T, limit int) (*Reporter, *[]published) {
	t.Helper()
	var got []published
	return &Reporter{
		Outputs: map[string]string{"q": "out"}, Worker: "w", MaxErrorText: 64 << 10, Lease: time.Minute,
		Enqueue: func(_ context.Context, id, out string, b []byte, nonce string) error {
			if len(b) > limit {
				return fmt.Errorf("%w: %d bytes", enqueue.ErrTooLarge, len(b))
			}
			p := published{id: id, out: out, nonce: nonce}
			if err := json.Unmarshal(b, &p.rep); err != nil {
				t.Fatal(err)
			}
			got = append(got, p)
			return nil
		},
	}, &got
}

// A report goes to the queue's output queue under the key of the copy that
// ended, with the input's nonce and without it in its headers; a queue
// without an output queue reports nothing.
func TestReporterPublishes(t *testing.T) {
	r, got := reporter(t, 1<<20)
	j := &Job{Job: wire.Job{ID: "a", Type: "t", Copy: 2, Headers: map[string]string{wire.StatusHeader: "n1", "h": "v"}}, Queue: "q", TryCount: 1}
	if err := r.Report(j, decide.Decision{Outcome: decide.Succeeded}, "", []byte("res")); err != nil {
		t.Fatal(err)
	}
	if len(*got) != 1 {
		t.Fatalf("%d reports; want 1", len(*got))
	}
	p := (*got)[0]
	if p.id != "a@2" || p.out != "out" || p.nonce != "n1" || p.rep.Outcome != ReportSucceeded || string(p.rep.Result) != "res" || p.rep.TryCount != 1 {
		t.Errorf("report %+v", p)
	}
	if _, ok := p.rep.Headers[wire.StatusHeader]; ok || p.rep.Headers["h"] != "v" || j.Headers[wire.StatusHeader] != "n1" {
		t.Errorf("headers: report %v, job %v", p.rep.Headers, j.Headers)
	}
	j.Queue = "other"
	if err := r.Report(j, decide.Decision{Outcome: decide.Succeeded}, "", nil); err != nil || len(*got) != 1 {
		t.Errorf("a queue without an output queue: %v, %d reports", err, len(*got))
	}
}

// A report too large for the backend is published again without its
// result and with its error text cut.
func TestReporterTooLarge(t *testing.T) {
	r, got := reporter(t, 4096)
	j := &Job{Job: wire.Job{ID: "a", Type: "t"}, Queue: "q"}
	d := decide.Decision{Outcome: decide.DeadLettered, Reason: "permanent", Failures: 1}
	if err := r.Report(j, d, strings.Repeat("e", 8192), nil); err != nil {
		t.Fatal(err)
	}
	if len(*got) != 1 || len((*got)[0].rep.Error) > 1100 || (*got)[0].rep.Outcome != ReportDeadLettered {
		t.Fatalf("reports %+v", *got)
	}
}
