package wire

import (
	crand "crypto/rand"
	"encoding/base64"
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
type Codec struct {
	// Keys are the signing key then the further keys a message may be
	// signed with; nil: messages are neither signed nor checked.
	Keys [][]byte
	// MaxBody is the largest message written, signature included.
	MaxBody int
}

// Overhead is what signing adds to an envelope.
func (c Codec) Overhead() int {
	if c.Keys == nil {
		return 0
	}
	return SignedOverhead
}

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

// Encode encodes j as its current copy's message body, sealed. A copy that
// outgrew MaxBody (its error history grows with each retry) loses its
// oldest error lines until it fits; j.Errors is cut with them.
func (c Codec) Encode(j *Job) []byte {
	body := EncodeJob(j)
	for len(body)+c.Overhead() > c.MaxBody && len(j.Errors) > 0 {
		j.Errors = j.Errors[1:]
		body = EncodeJob(j)
	}
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

// StatusHeader is the header a job of a status-tracked queue carries its
// enqueue's nonce in (internal/status): the job's status record holds the
// same nonce, and a copy with another one does not write the record.
const StatusHeader = "asyncplatform-status"

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
