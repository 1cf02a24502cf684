package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/enqueue"
	"github.com/asyncplatform/asyncplatform/internal/outcomehook"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// Report is an outcome report as published: the root package's
// OutcomeReport, field for field and tag for tag (a root test holds the
// two together).
type Report struct {
	Key           string            `json:"key"`
	JobID         string            `json:"job_id"`
	Queue         string            `json:"queue"`
	Type          string            `json:"type"`
	Copy          uint64            `json:"copy"`
	Outcome       string            `json:"outcome"`
	Reason        string            `json:"reason,omitempty"`
	Error         string            `json:"error,omitempty"`
	Result        []byte            `json:"result,omitempty"`
	ResultSize    int               `json:"result_size,omitempty"`
	ResultDropped bool              `json:"result_dropped,omitempty"`
	TryCount      int               `json:"tries"`
	Failures      int               `json:"failures"`
	Crashes       int               `json:"crashes"`
	Worker        string            `json:"worker"`
	EnqueuedAt    time.Time         `json:"enqueued_at,omitzero"`
	EndedAt       time.Time         `json:"ended_at"`
	Headers       map[string]string `json:"headers,omitempty"`
}

// The report outcomes (the root package's OutcomeSucceeded and
// OutcomeDeadLettered).
const (
	ReportSucceeded    = "succeeded"
	ReportDeadLettered = "dead_lettered"
)

// ReportKey names the end of copy n of job id: the report's Key and the ID
// of its job.
func ReportKey(id string, n uint64) string { return fmt.Sprintf("%s@%d", id, n) }

// Reporter publishes the reports of the jobs of queues with an output
// queue; its Report is Config.Report.
type Reporter struct {
	Outputs      map[string]string // each queue's output queue
	Worker       string            // names this worker in the reports
	MaxErrorText int               // error text kept in a report
	Lease        time.Duration     // bounds one publish
	// Enqueue enqueues the report's job (ID id, the payload b) on queue
	// out, with nonce as its enqueue's nonce; an error matching
	// enqueue.ErrTooLarge has the report published again smaller.
	Enqueue func(ctx context.Context, id, out string, b []byte, nonce string) error
}

// Report publishes the report of decision d that ends j on its queue's
// output queue, when it has one: text is the handler's error text, result
// its result.
func (r *Reporter) Report(j *Job, d decide.Decision, text string, result []byte) error {
	out := r.Outputs[j.Queue]
	if out == "" {
		return nil
	}
	rep := Report{
		Key: ReportKey(j.ID, j.Copy), JobID: j.ID, Queue: j.Queue, Type: j.Type, Copy: j.Copy,
		Failures: d.Failures, Crashes: d.Crashes, Worker: r.Worker,
		EnqueuedAt: j.EnqueuedAt, EndedAt: time.Now(), Headers: j.Headers,
	}
	rep.TryCount = rep.Failures + rep.Crashes
	if d.Outcome == decide.Succeeded {
		rep.Outcome, rep.Result, rep.ResultSize = ReportSucceeded, result, len(result)
		rep.TryCount = max(rep.TryCount, j.TryCount) // the successful attempt
	} else {
		rep.Outcome, rep.Reason = ReportDeadLettered, string(d.Reason)
		if text == "" {
			text = d.Why
		}
		rep.Error = text
		if len(rep.Error) > r.MaxErrorText {
			rep.Error = wire.CutUTF8(rep.Error, r.MaxErrorText) + " …(cut)"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.Lease)
	defer cancel()
	if err := r.publish(ctx, out, &rep); err != nil {
		return fmt.Errorf("output queue %q: %w", out, err)
	}
	if hook := outcomehook.Published.Load(); hook != nil {
		(*hook)(j.Queue, rep.JobID)
	}
	return nil
}

// publish enqueues rep on the output queue as a job whose ID is rep.Key,
// with the input's enqueue nonce (a backend that deduplicates publishes
// then drops a second publish of the same end). A result too large for
// the backend is left out, the report saying so, and a long error text
// cut.
func (r *Reporter) publish(ctx context.Context, out string, rep *Report) error {
	// The report's enqueue nonce is the input's: every worker that reports
	// this end derives the same deduplication key, and a writer who has not
	// read the input cannot. It is the platform's, not a header the
	// report's readers get (as the handler's Job.Headers leave it out).
	nonce, ok := rep.Headers[wire.StatusHeader]
	if ok {
		rep.Headers = maps.Clone(rep.Headers)
		delete(rep.Headers, wire.StatusHeader)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("asyncplatform: encoding an outcome report: %w", err)
	}
	err = r.Enqueue(ctx, rep.Key, out, b, nonce)
	if !errors.Is(err, enqueue.ErrTooLarge) {
		return err
	}
	// Too large for the backend: the result goes, then the error text is
	// cut to its first KiB (the dead letter keeps all of it).
	rep.Result, rep.ResultDropped = nil, len(rep.Result) > 0
	if len(rep.Error) > 1024 {
		rep.Error = wire.CutUTF8(rep.Error, 1024) + " …(cut to fit)"
	}
	b, _ = json.Marshal(rep)
	return r.Enqueue(ctx, rep.Key, out, b, nonce)
}
