package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
)

// A signed envelope is the plain one behind a header of its own:
//
//	magic 0xA5, kind ('J' or 'D'), version 2, HMAC-SHA256 of the plain
//	envelope (32 bytes), the plain envelope
const (
	signedVersion = 2
	macLen        = sha256.Size
)

// SignedOverhead is what Sign adds to a body.
const SignedOverhead = 3 + macLen

// Signature errors, wrapped by Unwrap's errors.
var (
	ErrUnsigned     = errors.New("the message is not signed")
	ErrBadSignature = errors.New("bad signature")
)

// Sign returns body (a plain envelope) signed with key.
func Sign(body, key []byte) []byte {
	out := make([]byte, 3, 3+macLen+len(body))
	out[0], out[1], out[2] = envMagic, body[1], signedVersion
	m := hmac.New(sha256.New, key)
	m.Write(body)
	out = m.Sum(out)
	return append(out, body...)
}

// Signed reports whether b is a signed envelope.
func Signed(b []byte) bool {
	return len(b) >= 3 && b[0] == envMagic && b[2] == signedVersion
}

// Unwrap returns the plain envelope inside b. With no keys it accepts a plain
// envelope and strips a signed one's signature unchecked; with keys, b must
// be signed with one of them, or the error wraps ErrUnsigned or
// ErrBadSignature.
func Unwrap(b []byte, keys [][]byte) ([]byte, error) {
	if !Signed(b) {
		if len(keys) > 0 {
			return nil, ErrUnsigned
		}
		return b, nil
	}
	if len(b) < 3+macLen+3 || b[3+macLen+1] != b[1] {
		return nil, fmt.Errorf("%w: truncated or corrupt signed envelope", ErrEnvelope)
	}
	mac, body := b[3:3+macLen], b[3+macLen:]
	if len(keys) == 0 {
		return body, nil
	}
	for _, k := range keys {
		m := hmac.New(sha256.New, k)
		m.Write(body)
		if hmac.Equal(m.Sum(nil), mac) {
			return body, nil
		}
	}
	return nil, ErrBadSignature
}
