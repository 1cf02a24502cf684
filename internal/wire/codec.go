package wire

import (
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Codec writes and reads the platform's messages: envelopes signed with the
// first of Keys (none: unsigned), within MaxBody bytes.
//
// A job signed by a Codec is bound to the queue it is written to and to
// when: before signing, Encode writes the queue in the job's QueueHeader
// and the signing time in its SignedAtHeader, so the signature covers both
// (the plain envelope's format is unchanged: a worker of an earlier
// version verifies and runs it as before). Bound checks them on delivery.
type Codec struct {
	// Keys are the signing key then the further keys a message may be
	// signed with; nil: messages are neither signed nor checked.
	Keys [][]byte
	// MaxBody is the largest message written, signature included.
	MaxBody int
	// RequireBound refuses (Bound) a signed job that carries no queue
	// binding: one signed by a version before bindings.
	RequireBound bool
	// ReplayWindow, when positive, refuses (Bound) a signed job due (its
	// signing time, or its NotBefore when later) more than ReplayWindow
	// ago.
	ReplayWindow time.Duration
	// Dedupe makes DedupeKey compute keys: the backend deduplicates
	// publishes (driver.Capabilities.Deduplicates).
	Dedupe bool
}

// The headers a signed job carries its binding in.
const (
	QueueHeader    = "asyncplatform-queue"     // the queue it was written to
	SignedAtHeader = "asyncplatform-signed-at" // when, in Unix milliseconds
)

// Binding errors, wrapped by Bound's errors.
var (
	ErrWrongQueue = errors.New("signed for another queue")
	ErrUnbound    = errors.New("signed without a queue binding")
	ErrStale      = errors.New("signed too long ago")
)

// Bound checks the binding of a job delivered from queue, signed (the
// Codec has keys) and decoded: it was written to queue; with RequireBound,
// it has a binding; with ReplayWindow, it was due within the window
// before now. Without keys it checks nothing. Its errors say "bad
// signature" for the dead letter they lead to.
func (c Codec) Bound(queue string, j *Job, now time.Time) error {
	if c.Keys == nil {
		return nil
	}
	q, bound := j.Headers[QueueHeader]
	switch {
	case !bound && (c.RequireBound || c.ReplayWindow > 0):
		return fmt.Errorf("bad signature: the message carries no queue binding (signed by an earlier version) and this platform requires one: %w", ErrUnbound)
	case !bound:
		return nil
	case q != queue:
		return fmt.Errorf("bad signature: the message was signed for queue %q and delivered from %q: %w", CutUTF8(q, 100), queue, ErrWrongQueue)
	case c.ReplayWindow <= 0:
		return nil
	}
	ms, err := strconv.ParseInt(j.Headers[SignedAtHeader], 10, 64)
	if err != nil {
		return fmt.Errorf("bad signature: the message's signing time is missing or malformed: %w", ErrUnbound)
	}
	due := time.UnixMilli(ms)
	if j.NotBefore.After(due) {
		due = j.NotBefore
	}
	if now.Sub(due) > c.ReplayWindow {
		return fmt.Errorf("bad signature: the message was due at %s, more than the ReplayWindow of %v ago (replayed, or it waited too long): %w", due.UTC().Format(time.RFC3339), c.ReplayWindow, ErrStale)
	}
	return nil
}

// bind returns j's headers with its binding to queue at now (a copy: j's
// own map may be shared with a handler's view of the job).
func bind(h map[string]string, queue string, now time.Time) map[string]string {
	out := make(map[string]string, len(h)+2)
	for k, v := range h {
		out[k] = v
	}
	out[QueueHeader] = queue
	out[SignedAtHeader] = strconv.FormatInt(now.UnixMilli(), 10)
	return out
}

// Overhead is the most that signing adds to an unsigned job's envelope:
// the signature, and the queue binding's two headers (a queue name is at
// most 100 bytes).
func (c Codec) Overhead() int {
	if c.Keys == nil {
		return 0
	}
	return SignedOverhead + maxBinding
}

// maxBinding is the most the binding's headers add to an envelope: two
// length-prefixed keys and values (the signing time is at most 20 digits),
// and the header count's varint growing by a byte.
const maxBinding = 1 + 2 + len(QueueHeader) + 2 + 100 + 2 + len(SignedAtHeader) + 2 + 20

// Seal signs an envelope when the Codec has a key.
func (c Codec) Seal(body []byte) []byte {
	if c.Keys == nil {
		return body
	}
	return Sign(body, c.Keys[0])
}

// Open returns the plain envelope of a delivered body, checked against the
// Codec's keys. A signature error says so for the dead letter it leads to.
func (c Codec) Open(body []byte) ([]byte, error) {
	b, err := Unwrap(body, c.Keys)
	switch {
	case err == nil:
		return b, nil
	case errors.Is(err, ErrUnsigned):
		return nil, fmt.Errorf("bad signature: the message is not signed (this platform has a SigningKey): %w", err)
	case errors.Is(err, ErrBadSignature):
		return nil, fmt.Errorf("bad signature: the message is not signed with this platform's SigningKey or VerifyKeys: %w", err)
	}
	return nil, err
}

// Encode encodes j as its current copy's message body for queue, sealed
// (and bound to queue, when the Codec signs). A copy that outgrew MaxBody
// (its error history grows with each retry) loses its oldest error lines
// until it fits; j.Errors is cut with them.
func (c Codec) Encode(queue string, j *Job) []byte {
	w := j
	if c.Keys != nil {
		b := *j
		b.Headers = bind(j.Headers, queue, time.Now())
		w = &b
	}
	seal := 0
	if c.Keys != nil {
		seal = SignedOverhead
	}
	body := EncodeJob(w)
	for len(body)+seal > c.MaxBody && len(w.Errors) > 0 {
		w.Errors = w.Errors[1:]
		body = EncodeJob(w)
	}
	j.Errors = w.Errors
	return c.Seal(body)
}

// MessageID names copy n of job id: the ID itself for copy 0, then ID.n.
func MessageID(id string, n uint64) string {
	if n == 0 {
		return id
	}
	return id + "." + strconv.FormatUint(n, 10)
}

// CutUTF8 returns s cut to at most n bytes, not inside a UTF-8 sequence.
func CutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// AppendHistory returns h with line added, keeping at most limit lines (the
// newest) and at most 1 KiB of the line. h itself is never written to: a
// delivered job's history may be shared with the handler's view of it.
func AppendHistory(h []string, line string, limit int) []string {
	if len(line) > 1024 {
		line = CutUTF8(line, 1024) + "…"
	}
	keep := h
	if len(keep) >= limit {
		keep = keep[len(keep)-limit+1:]
	}
	out := make([]string, len(keep), len(keep)+1)
	copy(out, keep)
	return append(out, line)
}

// FirstLine is the first line of s, at most 1 KiB of it, for a log line or
// a history line.
func FirstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 1024 {
		return CutUTF8(s, 1024) + "…"
	}
	return s
}

// StatusHeader is the header a job carries its enqueue's nonce in (see
// NewNonce), on a status-tracked queue and on a backend that deduplicates
// publishes. Every copy of the job carries it unchanged. The job's status
// record holds the same nonce, and a copy with another one does not write
// the record (internal/status); DedupeKey derives each copy's
// deduplication key from it.
const StatusHeader = "asyncplatform-status"

// DedupeKey returns the driver.Message.Dedupe of j's current copy: a hash
// of j's enqueue nonce (StatusHeader), ID and copy number, keyed with the
// signing key when the Codec has one. Every worker that writes the same
// copy of the same job computes the same key; a writer to the broker who
// has not read the job's nonce cannot, nor, with a signing key, one who
// has. The ID and nonce are length-prefixed, so job x's copy 1 and job
// x.1's copy 0 get different keys. It returns "" when the Codec does not
// dedupe or j carries no nonce (a job written by an earlier version).
func (c Codec) DedupeKey(j *Job) string {
	nonce := j.Headers[StatusHeader]
	if !c.Dedupe || nonce == "" {
		return ""
	}
	in := make([]byte, 0, len(dedupeDomain)+len(nonce)+len(j.ID)+3*binary.MaxVarintLen64)
	in = append(in, dedupeDomain...)
	in = appendString(in, nonce)
	in = appendString(in, j.ID)
	in = binary.AppendUvarint(in, j.Copy)
	var sum []byte
	if len(c.Keys) > 0 {
		mac := hmac.New(sha256.New, c.Keys[0])
		mac.Write(in)
		sum = mac.Sum(nil)
	} else {
		s := sha256.Sum256(in)
		sum = s[:]
	}
	return base64.RawURLEncoding.EncodeToString(sum[:dedupeBytes])
}

const (
	dedupeDomain = "asyncplatform dedupe v1\x00"
	dedupeBytes  = 18 // 144 bits: 24 characters
)

// NewNonce returns 16 random bytes from crypto/rand, unpadded base64url:
// a value no writer to the broker can guess.
func NewNonce() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// GroupHeader is the header a job carries its group in.
const GroupHeader = "asyncplatform-group"

// NewID returns a UUIDv7: time-ordered, with 74 random bits.
func NewID(now time.Time) string {
	var b [16]byte
	ms := uint64(now.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	r1, r2 := rand.Uint64(), rand.Uint64()
	for i := range 2 {
		b[6+i] = byte(r1 >> (8 * i))
	}
	for i := range 8 {
		b[8+i] = byte(r2 >> (8 * i))
	}
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	const hexdigits = "0123456789abcdef"
	var s [36]byte
	j := 0
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s[j] = '-'
			j++
		}
		s[j], s[j+1] = hexdigits[c>>4], hexdigits[c&0xf]
		j += 2
	}
	return string(s[:])
}
