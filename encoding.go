package asyncplatform

import (
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// toWire is j as the envelope carries it.
func toWire(j *Job) wire.Job {
	return wire.Job{
		ID: j.ID, Type: j.Type, Payload: j.Payload, Headers: j.Headers,
		EnqueuedAt: j.EnqueuedAt, NotBefore: j.NotBefore, Deadline: j.Deadline,
		Failures: j.Failures, Crashes: j.Crashes, Unhandled: j.unhandled, Copy: j.copyNo, Suspect: j.suspect,
		Policy: wire.Policy(j.Policy), Errors: j.Errors, PayloadRef: j.payloadRef,
	}
}

// fromWire sets j, a zero Job, from the envelope's job; TryCount and
// Queue are the caller's to set. It writes the fields one by one: j is
// new memory (a handler's view, a dead letter), and a composite literal
// would be built aside and then copied whole.
func fromWire(w *wire.Job, j *Job) {
	j.ID, j.Type, j.Payload, j.Headers = w.ID, w.Type, w.Payload, w.Headers
	j.EnqueuedAt, j.NotBefore, j.Deadline = w.EnqueuedAt, w.NotBefore, w.Deadline
	j.Failures, j.Crashes, j.unhandled, j.copyNo, j.suspect = w.Failures, w.Crashes, w.Unhandled, w.Copy, w.Suspect
	j.Policy, j.Errors, j.payloadRef = Policy(w.Policy), w.Errors, w.PayloadRef
	j.delivered = true
}

// decodeJob decodes an envelope into j; names, when set, holds the
// registered types' names.
func decodeJob(b []byte, j *Job, names map[string]string) error {
	var w wire.Job
	if err := wire.DecodeJob(b, &w, names); err != nil {
		return err
	}
	fromWire(&w, j)
	return nil
}

func decodeDead(b []byte, d *DeadLetter) error {
	var w wire.Dead
	if err := wire.DecodeDead(b, &w); err != nil {
		return err
	}
	d.Reason, d.Error, d.Worker, d.Queue, d.DeadAt = Reason(w.Reason), w.Error, w.Worker, w.Queue, w.DeadAt
	if w.Raw != nil {
		d.Raw = w.Raw
		return nil
	}
	fromWire(&w.Job, &d.Job)
	d.Job.Queue = d.Queue
	d.Job.TryCount = d.Job.Failures + d.Job.Crashes
	d.PayloadRef = d.Job.payloadRef
	return nil
}
