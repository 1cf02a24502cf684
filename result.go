package asyncplatform

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
)

// SetResult records the result of the job's attempt: bytes the handler
// leaves for whoever reads the job's outcome. It is kept in the job's status
// (see Config.TrackStatus and Platform.Status) when the attempt succeeds,
// and is shown to Hooks.AfterAttempt as Attempt.Result. The bytes are
// copied; a later call replaces an earlier one; nil clears it. A result is
// kept only with a success: a failed attempt's result is dropped.
//
// The result travels with the *Job the handler is given rather than in its
// context: a handler (or a middleware, or jobtest) already holds that job,
// a context lookup could silently find nothing, and it costs a job that
// sets no result nothing at all.
func (j *Job) SetResult(b []byte) {
	if b == nil {
		j.result = nil
		return
	}
	j.result = bytes.Clone(b)
}

// Result returns the result SetResult recorded, or nil.
func (j *Job) Result() []byte { return j.result }

// JSONResult adapts a function taking a decoded JSON payload and returning a
// value to a Handler: on success the value, encoded as JSON, is the job's
// result (SetResult). A payload that does not decode into T is dead-lettered
// at once with reason ReasonInvalid, as with JSON; a value that does not
// encode is a failure, retried.
func JSONResult[T, R any](fn func(ctx context.Context, job *Job, args T) (R, error)) Handler {
	return JSON(func(ctx context.Context, job *Job, args T) error {
		r, err := fn(ctx, job, args)
		if err != nil {
			return err
		}
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encoding %s result as JSON: %w", job.Type, err)
		}
		job.SetResult(b)
		return nil
	})
}

// DecodeResult decodes a JSON result (JobStatus.Result) into a value of
// type R.
func DecodeResult[R any](b []byte) (R, error) {
	var r R
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("asyncplatform: decoding a result as %T: %w", r, err)
	}
	return r, nil
}
