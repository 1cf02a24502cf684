package asyncplatform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/decide"
	"github.com/asyncplatform/asyncplatform/internal/outcomehook"
)

// ReportType is the job type of an outcome report: the job a queue with an
// output queue (QueueConfig.Output) publishes there for every job of its
// that ends. Its payload is an OutcomeReport in JSON; a consumer registers
// a handler for it like any other, JSON[OutcomeReport] decoding it.
const ReportType = "asyncplatform.outcome"

// OutcomeReport is what becomes of a job of a queue with an output queue,
// published there as a job of type ReportType before the job's own message
// is acknowledged (or dead-lettered). Only the two ends are reported: the
// job succeeded (with its result), or it was dead-lettered (with the
// reason, the error, its counters and the worker); retries, rejections and
// hand-backs are not ends.
//
// A report is published at least once: a worker that dies after the
// publish and before the acknowledgement runs the job again, and reports
// again. Key tells the two apart from a new end: the same Key seen twice
// is the same end reported twice, and a consumer that must act once keeps
// the Keys it has acted on (or is idempotent on Key). A job that ends
// again in another copy (redriven after a dead letter, or rerun after such
// a crash and retried) reports under a new Key with the same JobID.
type OutcomeReport struct {
	// Key is the report's deduplication key and its job's ID: the input
	// job's ID and the number of the copy that ended (Job.CopyNumber).
	Key string `json:"key"`
	// JobID, Queue and Type are the input job's.
	JobID string `json:"job_id"`
	Queue string `json:"queue"`
	Type  string `json:"type"`
	// Copy is the input copy that ended (Job.CopyNumber).
	Copy uint64 `json:"copy"`
	// Outcome is OutcomeSucceeded or OutcomeDeadLettered.
	Outcome Outcome `json:"outcome"`
	// Reason is the dead-letter reason (OutcomeDeadLettered).
	Reason Reason `json:"reason,omitempty"`
	// Error is the last error (OutcomeDeadLettered), at most
	// Config.MaxErrorText bytes.
	Error string `json:"error,omitempty"`
	// Result is the handler's result (Job.SetResult), for
	// OutcomeSucceeded. ResultSize is its size; it is larger than
	// len(Result) when the result was too large to travel in the report
	// (the report then has the rest, and ResultDropped is true).
	Result        []byte `json:"result,omitempty"`
	ResultSize    int    `json:"result_size,omitempty"`
	ResultDropped bool   `json:"result_dropped,omitempty"`
	// TryCount, Failures and Crashes are the job's counters at its end
	// (TryCount = Failures + Crashes, and the successful attempt on
	// success).
	TryCount int `json:"tries"`
	Failures int `json:"failures"`
	Crashes  int `json:"crashes"`
	// Worker names the worker that ended the job (Config.WorkerName).
	Worker string `json:"worker"`
	// EnqueuedAt is when the input job was first enqueued; EndedAt when
	// its end was decided.
	EnqueuedAt time.Time `json:"enqueued_at,omitzero"`
	EndedAt    time.Time `json:"ended_at"`
	// Headers are the input job's headers (trace context, say).
	Headers map[string]string `json:"headers,omitempty"`
}

// DecodeReport decodes the payload of a ReportType job.
func DecodeReport(j *Job) (OutcomeReport, error) {
	var r OutcomeReport
	if j.Type != ReportType {
		return r, fmt.Errorf("asyncplatform: job %s is of type %q, not an outcome report (%q)", j.ID, j.Type, ReportType)
	}
	if err := json.Unmarshal(j.Payload, &r); err != nil {
		return r, fmt.Errorf("asyncplatform: decoding the outcome report of job %s: %w", j.ID, err)
	}
	return r, nil
}

// reportKey names the end of copy copyNo of job id: the report's Key and
// the ID of its job.
func reportKey(id string, copyNo uint64) string {
	return fmt.Sprintf("%s@%d", id, copyNo)
}

// report publishes, for a queue with an output queue, the report of a
// decision that ends the job (success or dead letter), before the caller
// settles the delivery. It returns the job and decision to settle: the same
// ones, or, when the report could not be published, the job as delivered
// and a rejection (requeued uncounted after Config.RejectDelay): the input
// is never acknowledged before its report is stored.
func (p *Platform) report(f *inflight, j *Job, d decide.Decision, text string) (*Job, decide.Decision) {
	out := p.cfg.Queues[f.D.Queue].Output
	if out == "" || (d.Outcome != decide.Succeeded && d.Outcome != decide.DeadLettered) {
		return j, d
	}
	r := p.newReport(f, j, d, text)
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Lease)
	defer cancel()
	err := p.publishReport(ctx, out, &r)
	if err == nil {
		if hook := outcomehook.Published.Load(); hook != nil {
			(*hook)(f.D.Queue, r.JobID)
		}
		return j, d
	}
	p.log.Warn("asyncplatform: publishing an outcome report failed; the job is requeued uncounted and will end again",
		"queue", f.D.Queue, "output", out, "id", r.JobID, "outcome", r.Outcome, "error", err)
	var next Job
	if derr := p.decodeDelivery(f.D, &next, nil); derr != nil { // it decoded once already
		return j, d
	}
	next.TryCount = next.Failures + next.Crashes
	if d.Outcome == decide.Succeeded {
		next.suspect = false // it ran and reported an outcome
	}
	back := decide.Decision{Outcome: decide.Rejected, RetryAt: time.Now().Add(p.cfg.RejectDelay),
		Failures: next.Failures, Crashes: next.Crashes, Unhandled: next.unhandled}
	return &next, back
}

// newReport builds the report of a decision that ends j.
func (p *Platform) newReport(f *inflight, j *Job, d decide.Decision, text string) OutcomeReport {
	r := OutcomeReport{
		Key: reportKey(j.ID, j.copyNo), JobID: j.ID, Queue: f.D.Queue, Type: j.Type, Copy: j.copyNo,
		Failures: d.Failures, Crashes: d.Crashes, Worker: p.cfg.WorkerName,
		EnqueuedAt: j.EnqueuedAt, EndedAt: time.Now(), Headers: j.Headers,
	}
	r.TryCount = r.Failures + r.Crashes
	if d.Outcome == decide.Succeeded {
		r.Outcome, r.Result, r.ResultSize = OutcomeSucceeded, j.result, len(j.result)
		if j.TryCount > r.TryCount { // the successful attempt
			r.TryCount = j.TryCount
		}
		return r
	}
	r.Outcome, r.Reason = OutcomeDeadLettered, Reason(d.Reason)
	if text == "" {
		text = d.Why
	}
	r.Error = text
	if len(r.Error) > p.cfg.MaxErrorText {
		r.Error = cutUTF8(r.Error, p.cfg.MaxErrorText) + " …(cut)"
	}
	return r
}

// publishReport enqueues r on the output queue as a ReportType job whose ID
// is r.Key (a backend that deduplicates message IDs then drops a second
// publish of the same end). A result too large for the backend is left
// out, the report saying so, and a long error text cut.
func (p *Platform) publishReport(ctx context.Context, out string, r *OutcomeReport) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("asyncplatform: encoding an outcome report: %w", err)
	}
	job := &Job{ID: r.Key, Type: ReportType, Queue: out, Payload: b}
	err = p.enqueue(ctx, []*Job{job})
	if !errors.Is(err, ErrPayloadTooLarge) {
		return err
	}
	// Too large for the backend: the result goes, then the error text is
	// cut to its first KiB (the dead letter keeps all of it).
	r.Result, r.ResultDropped = nil, len(r.Result) > 0
	if len(r.Error) > 1024 {
		r.Error = cutUTF8(r.Error, 1024) + " …(cut to fit)"
	}
	b, _ = json.Marshal(r)
	job = &Job{ID: r.Key, Type: ReportType, Queue: out, Payload: b}
	return p.enqueue(ctx, []*Job{job})
}
