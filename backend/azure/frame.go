package azure

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Message text limits. Azure accepts 64 KiB of message text; we always send
// base64, so 48 KiB of bytes fit, less our framing.
const (
	maxText      = 64 * 1024
	maxRaw       = maxText / 4 * 3 // 49152 bytes before base64
	workHeader   = 15              // magic(2) version(1) base(4) notBefore(8)
	maxBody      = maxRaw - workHeader
	chunkHeader  = 7 // magic(2) version(1) index(2) total(2)
	maxChunkData = maxRaw - chunkHeader
	maxChunks    = 32 // Peek returns at most 32 messages (legacy layout)
	lockHeader   = 4  // magic(2) version(1) kind(1), then uvarint id length and id
)

const frameVersion = 1

var (
	workMagic  = [2]byte{'a', 'w'}
	lockMagic  = [2]byte{'a', 'd'}
	chunkMagic = [2]byte{'a', 'c'}
)

var errNotFrame = errors.New("not an asyncplatform frame")

// workFrame is our framing of a work message: the platform's body plus the
// base subtracted from DequeueCount and the earliest delivery time.
type workFrame struct {
	base      uint32
	notBefore time.Time // zero: none
	body      []byte
}

func (f workFrame) encode() string {
	buf := make([]byte, workHeader+len(f.body))
	buf[0], buf[1], buf[2] = workMagic[0], workMagic[1], frameVersion
	binary.BigEndian.PutUint32(buf[3:7], f.base)
	var nb int64
	if !f.notBefore.IsZero() {
		// Round up: a message must never be delivered before its NotBefore.
		nb = f.notBefore.Add(time.Millisecond - time.Nanosecond).UnixMilli()
	}
	binary.BigEndian.PutUint64(buf[7:15], uint64(nb))
	copy(buf[workHeader:], f.body)
	return base64.StdEncoding.EncodeToString(buf)
}

func decodeWork(text string) (workFrame, error) {
	buf, err := base64.StdEncoding.DecodeString(text)
	if err != nil {
		return workFrame{}, fmt.Errorf("%w: %v", errNotFrame, err)
	}
	if len(buf) < workHeader || buf[0] != workMagic[0] || buf[1] != workMagic[1] || buf[2] != frameVersion {
		return workFrame{}, errNotFrame
	}
	f := workFrame{base: binary.BigEndian.Uint32(buf[3:7]), body: buf[workHeader:]}
	if nb := int64(binary.BigEndian.Uint64(buf[7:15])); nb != 0 {
		f.notBefore = time.UnixMilli(nb)
	}
	return f, nil
}

// Lock kinds: the record is inside the frame, or (legacy layout only) in
// the overflow queue.
const (
	lockInline  = 0
	lockChunked = 1
)

// lockFrame is a dead-letter record's frame: the content of its blob, with
// kind lockInline. In the legacy layout (a queue per record, see
// legacy.go) its base64 text was the record queue's single "lock" message,
// holding the record or, with kind lockChunked, the number of overflow
// chunks.
type lockFrame struct {
	id     string
	kind   byte
	body   []byte // lockInline only
	chunks int    // lockChunked only
}

// raw is the frame's bytes.
func (f lockFrame) raw() []byte {
	buf := make([]byte, 0, lockHeader+binary.MaxVarintLen64+len(f.id)+2+len(f.body))
	buf = append(buf, lockMagic[0], lockMagic[1], frameVersion, f.kind)
	buf = binary.AppendUvarint(buf, uint64(len(f.id)))
	buf = append(buf, f.id...)
	if f.kind == lockChunked {
		buf = binary.BigEndian.AppendUint16(buf, uint16(f.chunks))
	} else {
		buf = append(buf, f.body...)
	}
	return buf
}

// decodeLock decodes a legacy lock message's text.
func decodeLock(text string) (lockFrame, error) {
	buf, err := base64.StdEncoding.DecodeString(text)
	if err != nil {
		return lockFrame{}, fmt.Errorf("%w: %v", errNotFrame, err)
	}
	return decodeLockRaw(buf)
}

// decodeLockRaw decodes a frame's bytes. The body aliases buf.
func decodeLockRaw(buf []byte) (lockFrame, error) {
	if len(buf) < lockHeader || buf[0] != lockMagic[0] || buf[1] != lockMagic[1] || buf[2] != frameVersion {
		return lockFrame{}, errNotFrame
	}
	f := lockFrame{kind: buf[3]}
	rest := buf[lockHeader:]
	n, k := binary.Uvarint(rest)
	if k <= 0 || uint64(len(rest)-k) < n {
		return lockFrame{}, errNotFrame
	}
	f.id = string(rest[k : k+int(n)])
	rest = rest[k+int(n):]
	switch f.kind {
	case lockInline:
		f.body = rest
	case lockChunked:
		if len(rest) != 2 {
			return lockFrame{}, errNotFrame
		}
		f.chunks = int(binary.BigEndian.Uint16(rest))
	default:
		return lockFrame{}, errNotFrame
	}
	return f, nil
}

// decodeChunk decodes a legacy overflow chunk.
func decodeChunk(text string) (index, total int, data []byte, err error) {
	buf, err := base64.StdEncoding.DecodeString(text)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("%w: %v", errNotFrame, err)
	}
	if len(buf) < chunkHeader || buf[0] != chunkMagic[0] || buf[1] != chunkMagic[1] || buf[2] != frameVersion {
		return 0, 0, nil, errNotFrame
	}
	return int(binary.BigEndian.Uint16(buf[3:5])), int(binary.BigEndian.Uint16(buf[5:7])), buf[chunkHeader:], nil
}

// visibility converts a duration to whole seconds for a visibility timeout,
// rounding up (a message must never surface early) and capping at 7 days.
func visibility(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	s := (d + time.Second - 1) / time.Second
	if s > maxVisibility {
		s = maxVisibility
	}
	return int32(s)
}

// maxVisibility is Azure's cap on visibility timeouts, in seconds (7 days).
const maxVisibility = 7 * 24 * 60 * 60
