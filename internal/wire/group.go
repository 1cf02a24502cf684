package wire

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxGroupLen bounds a group name, in bytes.
const MaxGroupLen = 64

// ErrBadGroup is matched by the errors of CheckGroup.
var ErrBadGroup = errors.New("bad group name")

// CheckGroup reports whether group is a group name: 1 to MaxGroupLen bytes
// of [A-Za-z0-9_-]. The error matches ErrBadGroup and shows at most the
// name's first 80 bytes, quoted. Every GroupHeader read off a message is
// checked with it before it is taken for the job's group: any writer to
// the broker writes that header.
func CheckGroup(group string) error {
	if group == "" || len(group) > MaxGroupLen {
		return fmt.Errorf("%w: group %q is %d bytes; it must be 1 to %d", ErrBadGroup, cutGroup(group), len(group), MaxGroupLen)
	}
	for i := 0; i < len(group); i++ {
		c := group[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: group %q: byte %d is not one of [A-Za-z0-9_-]", ErrBadGroup, cutGroup(group), i)
		}
	}
	return nil
}

// cutGroup returns s cut to at most 80 bytes, not inside a UTF-8 sequence.
func cutGroup(s string) string {
	n := 80
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
