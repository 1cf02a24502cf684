package asyncplatform

import (
	"encoding/json"
	"fmt"
	"time"
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
