package driver

import (
	"errors"
	"fmt"
)

// MaxQueueLen is the longest queue name, in bytes.
const MaxQueueLen = 100

// ErrBadQueue is matched (errors.Is) by the errors of CheckQueue.
var ErrBadQueue = errors.New("bad queue name")

// badQueue is an error of CheckQueue: its text names the problem, and it
// matches ErrBadQueue.
type badQueue string

func (e badQueue) Error() string        { return string(e) }
func (e badQueue) Is(target error) bool { return target == ErrBadQueue }

// CheckQueue reports whether name is a valid queue name: 1 to MaxQueueLen
// bytes of [A-Za-z0-9._-]. The error matches ErrBadQueue and names the first
// byte that is not allowed, and its offset.
//
// This is the one definition of the grammar. The platform checks every
// queue name with it before the name reaches a backend, so a backend never
// checks names itself: it may map any valid name to names of its own
// (keys, subjects, queues) and assume the input is valid.
func CheckQueue(name string) error {
	if name == "" {
		return badQueue("queue name is empty")
	}
	if len(name) > MaxQueueLen {
		return badQueue(fmt.Sprintf("queue name %.20q... is %d bytes, the limit is %d", name, len(name), MaxQueueLen))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !queueByte(c) {
			return badQueue(fmt.Sprintf("queue name %q has %s at byte %d; use letters, digits, '.', '_' and '-'", name, quoteByte(c), i))
		}
	}
	return nil
}

// quoteByte writes c quoted when it is printable ASCII, else in hex (a
// byte of a multi-byte character is not that character).
func quoteByte(c byte) string {
	if c < 0x20 || c >= 0x7f {
		return fmt.Sprintf("%#02x", c)
	}
	return fmt.Sprintf("%q", c)
}

// queueByte reports whether c may appear in a queue name.
func queueByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

// CheckPrefix reports whether prefix is a valid name prefix for a backend's
// keys, queues or subjects (Config.Prefix, the URL's prefix=): 1 to
// MaxQueueLen bytes of [A-Za-z0-9._:-]. The error matches ErrBadQueue. A
// backend adds rules of its broker's own (RabbitMQ reserves "amq.").
func CheckPrefix(prefix string) error {
	if prefix == "" {
		return badQueue("prefix is empty")
	}
	if len(prefix) > MaxQueueLen {
		return badQueue(fmt.Sprintf("prefix %.20q... is %d bytes, the limit is %d", prefix, len(prefix), MaxQueueLen))
	}
	for i := 0; i < len(prefix); i++ {
		if c := prefix[i]; !queueByte(c) && c != ':' {
			return badQueue(fmt.Sprintf("prefix %q has %s at byte %d; use letters, digits, '.', '_', ':' and '-'", prefix, quoteByte(c), i))
		}
	}
	return nil
}
