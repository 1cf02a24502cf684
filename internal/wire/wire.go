// Package wire is the envelope: a job as stored in a backend message body,
// and a dead-letter record. Backends never read it; everything decoded here
// came off a broker and is untrusted, so every length and count is checked
// against the bytes that remain.
package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// The envelope is the job as stored in a backend message body: a compact
// binary form, versioned by its first two bytes. Backends never read it.
//
//	magic 0xA5, kind 'J', version 1
//	ID, Type: string (uvarint length + bytes)
//	Payload: bytes
//	Headers: uvarint count, then key/value strings
//	EnqueuedAt, NotBefore, Deadline: varint Unix nanoseconds (0 = zero time)
//	Failures, Crashes, unhandled, copyNo: uvarint
//	flags byte: 1 retry limit set, 2 poison limit set, 4 suspect; then the
//	        Policy: two uvarint limits, BackoffBase, BackoffCap, Timeout as
//	        varint nanoseconds
//	Errors: uvarint count, then strings
//	payload reference: string (empty unless the payload was offloaded; the
//	        Payload field is then empty)
//
// A dead-letter record has kind 'D': reason, error, worker, queue, dead-at,
// a flag byte (1 = raw: the message was not a job), then the raw bytes or the
// job envelope.
const (
	envMagic   = 0xA5
	kindJob    = 'J'
	kindDead   = 'D'
	envVersion = 1
)

// Bounds on what a decoded envelope may hold, whatever its counts claim: a
// message over them is not a job. With every count also checked against the
// bytes that remain, decoding a message allocates at most a small multiple
// of its size.
const (
	MaxHeaders = 10_000
	MaxErrors  = 10_000
)

// ErrEnvelope is wrapped by every decoding error.
var ErrEnvelope = errors.New("not an asyncplatform envelope")

// Policy is the job's own failure-handling policy, as the root package's
// Policy (the same fields, so the two convert).
type Policy struct {
	RetryLimit  *int
	PoisonLimit *int
	BackoffBase time.Duration
	BackoffCap  time.Duration
	Timeout     time.Duration
}

// Job is the envelope's job: the root Job's fields plus the platform's own.
type Job struct {
	ID, Type   string
	Payload    []byte
	Headers    map[string]string
	EnqueuedAt time.Time
	NotBefore  time.Time
	Deadline   time.Time
	Failures   int
	Crashes    int
	Unhandled  int    // requeues for want of a handler
	Copy       uint64 // the copy number
	// Suspect marks a copy whose newest delivery ended with no outcome (its
	// worker died or lost the lease) and that has reported none since.
	Suspect    bool
	Policy     Policy
	Errors     []string
	PayloadRef string // set when the payload lives in the PayloadStore
}

// Dead is a dead-letter record.
type Dead struct {
	Reason, Error, Worker, Queue string
	DeadAt                       time.Time
	Raw                          []byte // set when the message was not a job; Job is then unused
	Job                          Job
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.AppendVarint(b, 0)
	}
	return binary.AppendVarint(b, t.UnixNano())
}

// encodedSize estimates the envelope size, so one allocation usually fits it.
func encodedSize(j *Job) int {
	n := 64 + len(j.ID) + len(j.Type) + len(j.Payload)
	for k, v := range j.Headers {
		n += len(k) + len(v) + 4
	}
	for _, e := range j.Errors {
		n += len(e) + 3
	}
	return n
}

func appendJob(b []byte, j *Job) []byte {
	b = append(b, envMagic, kindJob, envVersion)
	b = appendString(b, j.ID)
	b = appendString(b, j.Type)
	if j.PayloadRef != "" {
		b = appendBytes(b, nil) // the payload lives in the PayloadStore
	} else {
		b = appendBytes(b, j.Payload)
	}
	b = binary.AppendUvarint(b, uint64(len(j.Headers)))
	for k, v := range j.Headers {
		b = appendString(b, k)
		b = appendString(b, v)
	}
	b = appendTime(b, j.EnqueuedAt)
	b = appendTime(b, j.NotBefore)
	b = appendTime(b, j.Deadline)
	b = binary.AppendUvarint(b, uint64(j.Failures))
	b = binary.AppendUvarint(b, uint64(j.Crashes))
	b = binary.AppendUvarint(b, uint64(j.Unhandled))
	b = binary.AppendUvarint(b, j.Copy)
	var flags byte
	var retry, poison int
	if j.Policy.RetryLimit != nil {
		flags |= 1
		retry = *j.Policy.RetryLimit
	}
	if j.Policy.PoisonLimit != nil {
		flags |= 2
		poison = *j.Policy.PoisonLimit
	}
	if j.Suspect {
		flags |= 4
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(retry))
	b = binary.AppendUvarint(b, uint64(poison))
	b = binary.AppendVarint(b, int64(j.Policy.BackoffBase))
	b = binary.AppendVarint(b, int64(j.Policy.BackoffCap))
	b = binary.AppendVarint(b, int64(j.Policy.Timeout))
	b = binary.AppendUvarint(b, uint64(len(j.Errors)))
	for _, e := range j.Errors {
		b = appendString(b, e)
	}
	return appendString(b, j.PayloadRef)
}

// EncodeJob encodes j.
func EncodeJob(j *Job) []byte { return appendJob(make([]byte, 0, encodedSize(j)), j) }

// reader decodes the envelope; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: truncated or corrupt %s", ErrEnvelope, what)
	}
}

func (r *reader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// small reads a counter or a limit: at most MaxInt32, so no sum of them
// overflows an int.
func (r *reader) small(what string) int {
	v := r.uvarint(what)
	if v > math.MaxInt32 {
		r.fail(what)
		return 0
	}
	return int(v)
}

func (r *reader) count(what string) int {
	v := r.uvarint(what)
	if v > uint64(len(r.b)) { // every counted item takes at least a byte
		r.fail(what)
		return 0
	}
	return int(v)
}

// bytes returns the next length-prefixed field, aliasing the input.
func (r *reader) bytes(what string) []byte {
	n := r.uvarint(what)
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail(what)
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) string(what string) string { return string(r.bytes(what)) }

func (r *reader) time(what string) time.Time {
	ns := r.varint(what)
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func (r *reader) byte(what string) byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.fail(what)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) header(kind byte) {
	if len(r.b) < 3 || r.b[0] != envMagic || r.b[1] != kind {
		r.err = ErrEnvelope
		return
	}
	if r.b[2] != envVersion {
		r.err = fmt.Errorf("%w: version %d is not known to this build", ErrEnvelope, r.b[2])
		return
	}
	r.b = r.b[3:]
}

// DecodeJob decodes an envelope into j. The payload aliases b. A type found
// in names takes its string from there (a registered type reuses the
// handler's copy: one allocation less); names may be nil.
func DecodeJob(b []byte, j *Job, names map[string]string) error {
	r := reader{b: b}
	r.header(kindJob)
	j.ID = r.string("ID")
	typ := r.bytes("Type")
	if name, ok := names[string(typ)]; ok {
		j.Type = name
	} else {
		j.Type = string(typ)
	}
	j.Payload = r.bytes("Payload")
	if n := r.count("Headers"); n > MaxHeaders {
		r.err = fmt.Errorf("%w: %d headers; at most %d are decoded", ErrEnvelope, n, MaxHeaders)
	} else if n > 0 {
		j.Headers = make(map[string]string, n) // grown as the headers are read

		for range n {
			k := r.string("header key")
			j.Headers[k] = r.string("header value")
		}
	}
	j.EnqueuedAt = r.time("EnqueuedAt")
	j.NotBefore = r.time("NotBefore")
	j.Deadline = r.time("Deadline")
	j.Failures = r.small("Failures")
	j.Crashes = r.small("Crashes")
	j.Unhandled = r.small("unhandled")
	j.Copy = r.uvarint("copy")
	flags := r.byte("flags")
	j.Suspect = flags&4 != 0
	retry, poison := r.small("RetryLimit"), r.small("PoisonLimit")
	if flags&1 != 0 { // a limit that is not set takes no allocation
		v := retry
		j.Policy.RetryLimit = &v
	}
	if flags&2 != 0 {
		v := poison
		j.Policy.PoisonLimit = &v
	}
	j.Policy.BackoffBase = time.Duration(r.varint("BackoffBase"))
	j.Policy.BackoffCap = time.Duration(r.varint("BackoffCap"))
	j.Policy.Timeout = time.Duration(r.varint("Timeout"))
	if n := r.count("Errors"); n > MaxErrors {
		r.err = fmt.Errorf("%w: %d error lines; at most %d are decoded", ErrEnvelope, n, MaxErrors)
	} else if n > 0 {
		j.Errors = make([]string, n)
		for i := range j.Errors {
			j.Errors[i] = r.string("error line")
		}
	}
	j.PayloadRef = r.string("payload reference")
	if r.err == nil && len(r.b) != 0 {
		r.fail("trailer")
	}
	return r.err
}

// EncodeDead encodes a dead-letter record.
func EncodeDead(d *Dead) []byte {
	b := []byte{envMagic, kindDead, envVersion}
	b = appendString(b, string(d.Reason))
	b = appendString(b, d.Error)
	b = appendString(b, d.Worker)
	b = appendString(b, d.Queue)
	b = appendTime(b, d.DeadAt)
	if d.Raw != nil {
		b = append(b, 1)
		return appendBytes(b, d.Raw)
	}
	b = append(b, 0)
	return appendBytes(b, EncodeJob(&d.Job))
}

// DecodeDead decodes a dead-letter record; the job's payload and Raw are
// copies, free of b.
func DecodeDead(b []byte, d *Dead) error {
	r := reader{b: b}
	r.header(kindDead)
	d.Reason = r.string("reason")
	d.Error = r.string("error")
	d.Worker = r.string("worker")
	d.Queue = r.string("queue")
	d.DeadAt = r.time("dead-at")
	raw := r.byte("raw flag")
	body := r.bytes("body")
	if r.err != nil {
		return r.err
	}
	if raw == 1 {
		d.Raw = append([]byte{}, body...)
		return nil
	}
	if err := DecodeJob(body, &d.Job, nil); err != nil {
		return err
	}
	d.Job.Payload = bytes.Clone(d.Job.Payload) // the caller may keep or change it
	return nil
}
