package azure

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Azure queue names are 3 to 63 characters of lowercase letters, digits and
// single hyphens, starting and ending with a letter or digit. The facade's
// names are 1 to 100 characters of [A-Za-z0-9._-]. The mapping below is
// injective (up to an 80-bit hash collision) and keeps readable names
// readable:
//
//	work queue:             <prefix> "w" <base>                        (a queue)
//	dead-letter record:     "dead/" <base> "/" <key>                   (a blob in the backend's container)
//	legacy record:          <prefix> "d" <LL> <base> <key>             (a queue per record: the layout before blobs)
//	its overflow chunks:    <prefix> "d" <LL> <base> <key> "x"
//
// base is the facade name itself when it is already a valid Azure name part
// of at most maxBaseLen characters (and does not look like a hashed base);
// otherwise it is a sanitized, truncated form followed by "-h" and 20 hex
// digits of the SHA-256 of the facade name. LL is len(base) in two digits, so
// no queue's legacy prefix is a prefix of another queue's names; a base has
// no "/", so no queue's blob prefix is a prefix of another's. key is keyLen
// characters that sort by creation time.
const (
	maxPrefixLen = 8
	maxBaseLen   = 34
	keyLen       = 17
	hashHexLen   = 20
	sanitizedLen = 12
)

var (
	simpleBaseRe = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	hashedBaseRe = regexp.MustCompile(`(^|-)h[0-9a-f]{20}$`)
	prefixRe     = regexp.MustCompile(`^[a-z0-9]{1,8}$`)
	notAlnumRe   = regexp.MustCompile(`[^a-z0-9]+`)
)

// baseName maps a facade queue name (valid: see driver.CheckQueue) to the
// part every Azure name of that queue shares.
func baseName(queue string) string {
	if len(queue) <= maxBaseLen && simpleBaseRe.MatchString(queue) && !hashedBaseRe.MatchString(queue) {
		return queue
	}
	sum := sha256.Sum256([]byte(queue))
	h := "h" + hex.EncodeToString(sum[:])[:hashHexLen]
	s := notAlnumRe.ReplaceAllString(strings.ToLower(queue), "-")
	s = strings.Trim(s, "-")
	if len(s) > sanitizedLen {
		s = strings.TrimRight(s[:sanitizedLen], "-")
	}
	if s == "" {
		return h
	}
	return s + "-" + h
}

// names are the Azure names of one facade queue.
type names struct {
	work   string // the work queue
	dead   string // the prefix of its dead-letter record blobs
	legacy string // the prefix of its dead-letter record queues in the legacy layout
}

// deadFolder starts the name of every dead-letter blob.
const deadFolder = "dead/"

func (b *Backend) names(queue string) names {
	base := baseName(queue)
	return names{
		work:   b.prefix + "w" + base,
		dead:   deadFolder + base + "/",
		legacy: fmt.Sprintf("%sd%02d%s", b.prefix, len(base), base),
	}
}

// isRecordQueue reports whether name, listed under a legacy prefix, is a
// record's lock queue (not its overflow queue).
func isRecordQueue(prefix, name string) bool {
	return len(name) == len(prefix)+keyLen && strings.HasPrefix(name, prefix)
}

// dataQueue names the overflow queue of a record queue.
func dataQueue(record string) string { return record + "x" }

var keySeq atomic.Uint32

// newKey returns a record key that sorts by creation time: milliseconds since
// the epoch in base 36 (9 digits), a per-process sequence (3 digits) and 5
// random digits.
func newKey() string {
	ms := strconv.FormatInt(time.Now().UnixMilli(), 36)
	seq := strconv.FormatUint(uint64(keySeq.Add(1)%46656), 36)
	var rnd [5]byte
	_, _ = rand.Read(rnd[:])
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	var sb strings.Builder
	sb.Grow(keyLen)
	sb.WriteString(strings.Repeat("0", 9-len(ms)))
	sb.WriteString(ms)
	sb.WriteString(strings.Repeat("0", 3-len(seq)))
	sb.WriteString(seq)
	for _, c := range rnd {
		sb.WriteByte(digits[int(c)%36])
	}
	return sb.String()
}
