package rabbit

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/errgroup"

	"github.com/asyncplatform/asyncplatform/driver"
)

// With Config.Store set, dead letters live in the companion store, not in
// the quorum queue p.q:dead: AMQP has no browse, so a read of a queue costs
// every record in it, while the store reads a record, a page or an ID by
// key. For queue q and Config.Prefix p, every key under "p:dead/q/"
// (deadScope), which the platform's own keys (under "p/") never reach:
//
//   - r/<seq>: a record's head (see encodeHead); its presence is the
//     record's. seq is the time of the DeadLetter in Unix nanoseconds,
//     19 digits, then '-' and 16 hex digits: random for a DeadLetter,
//     derived from the record for a record moved from the queue (so a move
//     done again finds it there). Keys sort by seq: oldest first.
//   - c/<seq>/<i>: the record's body past the head, deadChunk bytes a key
//     (a store value is at most driver.MaxValueLen).
//   - i/<hash>/<seq>: the index by ID, hash the first 32 hex digits of the
//     SHA-256 of the record's ID.
//   - h/<seq>: a hold, with a TTL of Config.DeadHold: the record is handed
//     out to the caller whose revision it is.
//
// A DeadLetter writes the chunks, then the index, then the head, and only
// then acks the delivery: a crash in between leaves keys no head names
// (never read, removed with the queue) or a duplicate, never a loss. A pop
// removes the head first, so a record is gone as soon as its head is;
// DeleteDead and PurgeDead do the same for many records at once
// (takeDeadEach).

const (
	// deadChunk is how many body bytes a head or a chunk key holds, below
	// driver.MaxValueLen with room for the head's fields.
	deadChunk = driver.MaxValueLen - 4<<10

	// deadListPage is how many keys one List of the record heads asks for
	// when NextDead looks past held records, and when PurgeDead and Stats
	// go through them.
	deadListPage = 1000

	// deadWorkers bounds the store calls ListDead (reading the chunks of
	// large records) and DeleteDead (looking IDs up in the index) make at
	// once, and the keys a queue's removal deletes at once.
	deadWorkers = 32

	// deadHeadVersion is the first byte of every head.
	deadHeadVersion = 1

	// maxDeadID bounds a record ID read from the store.
	maxDeadID = 4 << 10
)

// storeHold is the Handle of a DeadDelivery handed out from the store.
type storeHold struct {
	queue   string
	seq     string
	id      string
	chunks  int
	mu      sync.Mutex // guards rev
	rev     string     // the hold key's revision
	settled atomic.Bool
}

// deadScope is the key prefix of queue's dead letters in the store.
func (b *Backend) deadScope(queue string) string { return b.cfg.Prefix + ":dead/" + queue + "/" }

func (b *Backend) headKey(queue, seq string) string { return b.deadScope(queue) + "r/" + seq }
func (b *Backend) holdKey(queue, seq string) string { return b.deadScope(queue) + "h/" + seq }
func (b *Backend) chunkKey(queue, seq string, i int) string {
	return b.deadScope(queue) + "c/" + seq + "/" + strconv.Itoa(i)
}
func (b *Backend) idPrefix(queue, id string) string {
	h := sha256.Sum256([]byte(id))
	return b.deadScope(queue) + "i/" + hex.EncodeToString(h[:16]) + "/"
}
func (b *Backend) idKey(queue, id, seq string) string { return b.idPrefix(queue, id) + seq }

// seqLen is the length of a seq: 19 digits, '-', 16 hex digits.
const seqLen = 19 + 1 + 16

// newSeq returns a seq for a record dead-lettered at t.
func newSeq(t time.Time) string {
	var r [8]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails
	return fmt.Sprintf("%019d-%s", max(t.UnixNano(), 0), hex.EncodeToString(r[:]))
}

// movedSeq returns the seq of a record moved from the queue: its time, and
// a suffix derived from its ID, time and body.
func movedSeq(at int64, id string, body []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d\x00%s\x00", at, id)
	h.Write(body)
	return fmt.Sprintf("%019d-%s", max(at, 0), hex.EncodeToString(h.Sum(nil)[:8]))
}

// validSeq reports whether s is a seq this backend writes.
func validSeq(s string) bool {
	if len(s) != seqLen || s[19] != '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 19:
		case i < 19 && c >= '0' && c <= '9':
		case i > 19 && (c >= '0' && c <= '9' || c >= 'a' && c <= 'f'):
		default:
			return false
		}
	}
	return true
}

// encodeHead encodes a record's head: the version byte, the ID's length
// (uvarint) and the ID, the body's length (uvarint), the number of chunk
// keys (uvarint), and the body's first part.
func encodeHead(id string, body []byte, chunks int, first []byte) []byte {
	out := make([]byte, 0, 1+3*binary.MaxVarintLen64+len(id)+len(first))
	out = append(out, deadHeadVersion)
	out = binary.AppendUvarint(out, uint64(len(id)))
	out = append(out, id...)
	out = binary.AppendUvarint(out, uint64(len(body)))
	out = binary.AppendUvarint(out, uint64(chunks))
	return append(out, first...)
}

// errBadHead is what decodeHead returns for a value that is not a head
// this backend wrote.
var errBadHead = errors.New("not a dead-letter head of this backend")

// decodeHead reads a head, bounded: the ID at most maxDeadID bytes, the
// body at most maxBody, the chunk count the one the body's length needs.
func decodeHead(v []byte, maxBody int) (id string, size, chunks int, first []byte, err error) {
	if len(v) < 1 || v[0] != deadHeadVersion {
		return "", 0, 0, nil, errBadHead
	}
	v = v[1:]
	n, k := binary.Uvarint(v)
	if k <= 0 || n > maxDeadID || uint64(len(v)-k) < n {
		return "", 0, 0, nil, errBadHead
	}
	id, v = string(v[k:k+int(n)]), v[k+int(n):]
	sz, k := binary.Uvarint(v)
	if k <= 0 || sz > uint64(maxBody) {
		return "", 0, 0, nil, errBadHead
	}
	v = v[k:]
	c, k := binary.Uvarint(v)
	if k <= 0 {
		return "", 0, 0, nil, errBadHead
	}
	first = v[k:]
	want := 0
	if int(sz) > deadChunk {
		want = (int(sz) - 1) / deadChunk
	}
	if c != uint64(want) || len(first) != min(int(sz), deadChunk) {
		return "", 0, 0, nil, errBadHead
	}
	return id, int(sz), want, first, nil
}

// maxDeadBody bounds a record's body: a dead-letter record carries the job
// (at most MaxBody) with its error history.
func (b *Backend) maxDeadBody() int {
	if b.cfg.MaxBody > 0 {
		return b.cfg.MaxBody + 1<<20
	}
	return 1 << 30
}

// writeDead stores rec as a record of queue's dead letters under seq:
// the chunks, then the index, then the head. It returns driver.ErrKeyExists
// (wrapped) when a head is already there under seq.
func (b *Backend) writeDead(ctx context.Context, queue, seq string, rec driver.DeadMessage) error {
	s := b.cfg.Store
	if len(rec.ID) > maxDeadID {
		return fmt.Errorf("rabbit: dead letter ID is %d bytes, the limit is %d", len(rec.ID), maxDeadID)
	}
	if len(rec.Body) > b.maxDeadBody() {
		return fmt.Errorf("rabbit: dead letter %q is %d bytes, limit %d: %w", rec.ID, len(rec.Body), b.maxDeadBody(), driver.ErrTooLarge)
	}
	first := rec.Body[:min(len(rec.Body), deadChunk)]
	chunks := 0
	for i, off := 1, deadChunk; off < len(rec.Body); i, off = i+1, off+deadChunk {
		part := rec.Body[off:min(len(rec.Body), off+deadChunk)]
		if _, err := s.Create(ctx, b.chunkKey(queue, seq, i), part, 0); err != nil && !errors.Is(err, driver.ErrKeyExists) {
			return fmt.Errorf("rabbit: write dead letter %q of %q to the companion store: %w", rec.ID, queue, err)
		}
		chunks = i
	}
	if _, err := s.Create(ctx, b.idKey(queue, rec.ID, seq), nil, 0); err != nil && !errors.Is(err, driver.ErrKeyExists) {
		return fmt.Errorf("rabbit: write dead letter %q of %q to the companion store: %w", rec.ID, queue, err)
	}
	if _, err := s.Create(ctx, b.headKey(queue, seq), encodeHead(rec.ID, rec.Body, chunks, first), 0); err != nil {
		return fmt.Errorf("rabbit: write dead letter %q of %q to the companion store: %w", rec.ID, queue, err)
	}
	return nil
}

// storeDeadLetter stores rec as a new record of queue's dead letters.
func (b *Backend) storeDeadLetter(ctx context.Context, queue string, rec driver.DeadMessage) error {
	return b.writeDead(ctx, queue, newSeq(time.Now()), rec)
}

// readDead reads the record under seq. It returns driver.ErrKeyNotFound
// (wrapped) when its head is gone. A head that is not one this backend
// wrote, or whose parts do not match it, is read as a record of its own:
// its ID the seq, its body the head's bytes (at most a store value), which
// the platform hands out as undecodable, so that it can be popped; it is
// never skipped nor left to block the records behind it.
func (b *Backend) readDead(ctx context.Context, queue, seq string) (driver.DeadMessage, int, error) {
	s := b.cfg.Store
	v, _, err := s.Get(ctx, b.headKey(queue, seq))
	if err != nil {
		return driver.DeadMessage{}, 0, fmt.Errorf("rabbit: read dead letter %s of %q: %w", seq, queue, err)
	}
	return b.recordOf(ctx, queue, seq, v)
}

// recordOf returns the record whose head, under seq, is v, reading the
// rest of its body; a head of another writer is read as readDead says.
func (b *Backend) recordOf(ctx context.Context, queue, seq string, v []byte) (driver.DeadMessage, int, error) {
	rec, chunks, err := b.readParts(ctx, queue, seq, v)
	if errors.Is(err, errBadHead) {
		b.log.Warn("a dead letter in the companion store is not one this backend wrote; it is handed out as undecodable", "queue", queue, "seq", seq, "err", err)
		return driver.DeadMessage{ID: seq, Body: v}, 0, nil
	}
	return rec, chunks, err
}

// readParts decodes the head v of the record under seq and reads the rest
// of its body.
func (b *Backend) readParts(ctx context.Context, queue, seq string, v []byte) (driver.DeadMessage, int, error) {
	s := b.cfg.Store
	id, size, chunks, first, err := decodeHead(v, b.maxDeadBody())
	if err != nil {
		return driver.DeadMessage{}, 0, fmt.Errorf("rabbit: dead letter %s of %q in the companion store: %w", seq, queue, err)
	}
	body := make([]byte, 0, size)
	body = append(body, first...)
	for i := 1; i <= chunks; i++ {
		part, _, err := s.Get(ctx, b.chunkKey(queue, seq, i))
		if errors.Is(err, driver.ErrKeyNotFound) {
			if _, _, herr := s.Get(ctx, b.headKey(queue, seq)); errors.Is(herr, driver.ErrKeyNotFound) {
				return driver.DeadMessage{}, 0, fmt.Errorf("rabbit: read dead letter %s of %q: %w", seq, queue, herr) // removed meanwhile
			}
		}
		if err != nil {
			return driver.DeadMessage{}, 0, fmt.Errorf("rabbit: read part %d of dead letter %s of %q: %w", i, seq, queue, err)
		}
		if want := min(size-len(body), deadChunk); len(part) != want {
			return driver.DeadMessage{}, 0, fmt.Errorf("rabbit: part %d of dead letter %s of %q is %d bytes, want %d: %w", i, seq, queue, len(part), want, errBadHead)
		}
		body = append(body, part...)
	}
	if len(body) == 0 {
		body = nil
	}
	return driver.DeadMessage{ID: id, Body: body}, chunks, nil
}

// removeDead deletes the record under seq: its head first (the record is
// gone from then on), then its chunks, its index key and the keys in
// also (a hold), at once.
func (b *Backend) removeDead(ctx context.Context, queue, seq, id string, chunks int, also ...storeKey) error {
	s := b.cfg.Store
	if err := s.Delete(ctx, b.headKey(queue, seq), ""); err != nil {
		return fmt.Errorf("rabbit: remove dead letter %q of %q: %w", id, queue, err)
	}
	rest := append(also, storeKey{key: b.idKey(queue, id, seq)})
	for i := 1; i <= chunks; i++ {
		rest = append(rest, storeKey{key: b.chunkKey(queue, seq, i)})
	}
	var wg sync.WaitGroup
	for _, k := range rest {
		wg.Go(func() {
			if err := s.Delete(ctx, k.key, k.rev); err != nil && !errors.Is(err, driver.ErrRevision) {
				b.log.Warn("a key of a removed dead letter stays in the companion store", "queue", queue, "key", k.key, "err", err)
			}
		})
	}
	wg.Wait()
	return nil
}

// storeKey is a key to delete, at a revision when rev is set.
type storeKey struct{ key, rev string }

// holdToken returns a value for a hold key: who holds it, for an operator
// reading the store.
func (b *Backend) holdToken() []byte {
	var r [8]byte
	_, _ = rand.Read(r[:])
	return []byte(b.cfg.Prefix + " " + hex.EncodeToString(r[:]))
}

// nextStoreDead is NextDead on the store: the first record in key order
// whose hold it can take.
func (b *Backend) nextStoreDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	s := b.cfg.Store
	prefix := b.deadScope(queue) + "r/"
	after := ""
	for {
		keys, err := s.List(ctx, prefix, after, 32)
		if err != nil {
			return nil, fmt.Errorf("rabbit: list dead letters of %q: %w", queue, err)
		}
		if len(keys) == 0 {
			return nil, driver.ErrNoDeadLetters
		}
		for _, k := range keys {
			seq := k[len(prefix):]
			if !validSeq(seq) {
				continue // not a key of this layout
			}
			rev, err := s.Create(ctx, b.holdKey(queue, seq), b.holdToken(), b.cfg.DeadHold)
			if errors.Is(err, driver.ErrKeyExists) {
				continue // another caller holds it
			}
			if err != nil {
				return nil, fmt.Errorf("rabbit: hold dead letter %s of %q: %w", seq, queue, err)
			}
			rec, chunks, err := b.readDead(ctx, queue, seq)
			if err != nil {
				_ = s.Delete(ctx, b.holdKey(queue, seq), rev)
				if errors.Is(err, driver.ErrKeyNotFound) {
					continue // popped between the listing and the hold
				}
				return nil, err
			}
			h := &storeHold{queue: queue, seq: seq, id: rec.ID, chunks: chunks, rev: rev}
			b.mu.Lock()
			b.holds[h] = true
			b.mu.Unlock()
			return &driver.DeadDelivery{DeadMessage: rec, Handle: h}, nil
		}
		after = keys[len(keys)-1]
	}
}

// storeHoldOf returns the store hold of d.
func storeHoldOf(d *driver.DeadDelivery) (*storeHold, error) {
	if d == nil {
		return nil, errors.New("rabbit: nil dead delivery")
	}
	h, ok := d.Handle.(*storeHold)
	if !ok {
		return nil, fmt.Errorf("rabbit: dead delivery handle is %T, not one of this backend's", d.Handle)
	}
	return h, nil
}

// renewHold renews h's hold for another DeadHold. It returns ErrLeaseLost
// when the hold lapsed or was taken.
func (b *Backend) renewHold(ctx context.Context, h *storeHold) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	rev, err := b.cfg.Store.Update(ctx, b.holdKey(h.queue, h.seq), b.holdToken(), h.rev, b.cfg.DeadHold)
	if errors.Is(err, driver.ErrRevision) {
		return fmt.Errorf("rabbit: dead letter %q is no longer held: %w", h.id, driver.ErrLeaseLost)
	}
	if err != nil {
		return fmt.Errorf("rabbit: renew the hold on dead letter %q: %w", h.id, err)
	}
	h.rev = rev
	return nil
}

// extendStoreDead is ExtendDead on the store.
func (b *Backend) extendStoreDead(ctx context.Context, d *driver.DeadDelivery) error {
	h, err := storeHoldOf(d)
	if err != nil {
		return err
	}
	if h.settled.Load() {
		return fmt.Errorf("rabbit: dead letter %q already settled: %w", d.ID, driver.ErrLeaseLost)
	}
	return b.renewHold(ctx, h)
}

// settleStoreDead is SettleDead on the store. A pop first reads the hold
// (ErrLeaseLost unless it is still this caller's: the platform renews it
// every DeadHold/3, so two thirds of DeadHold at least are left), then
// removes the head, and then the rest of the record's keys and the hold
// at once. A keep deletes the hold at its revision.
func (b *Backend) settleStoreDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	h, err := storeHoldOf(d)
	if err != nil {
		return err
	}
	if !h.settled.CompareAndSwap(false, true) {
		return fmt.Errorf("rabbit: dead letter %q already settled: %w", d.ID, driver.ErrLeaseLost)
	}
	b.mu.Lock()
	delete(b.holds, h)
	b.mu.Unlock()
	h.mu.Lock()
	rev := h.rev
	h.mu.Unlock()
	hold := b.holdKey(h.queue, h.seq)
	if !remove {
		err := b.cfg.Store.Delete(ctx, hold, rev)
		if errors.Is(err, driver.ErrRevision) {
			return fmt.Errorf("rabbit: dead letter %q is no longer held: %w", d.ID, driver.ErrLeaseLost)
		}
		if err != nil {
			return fmt.Errorf("rabbit: let go of dead letter %q: %w", d.ID, err)
		}
		return nil
	}
	_, cur, err := b.cfg.Store.Get(ctx, hold)
	if errors.Is(err, driver.ErrKeyNotFound) || err == nil && cur != rev {
		return fmt.Errorf("rabbit: dead letter %q is no longer held: %w", d.ID, driver.ErrLeaseLost)
	}
	if err != nil {
		return fmt.Errorf("rabbit: read the hold on dead letter %q: %w", d.ID, err)
	}
	return b.removeDead(ctx, h.queue, h.seq, h.id, h.chunks, storeKey{key: hold, rev: rev})
}

// listStoreDead is ListDead on the store: the cursor is the seq of the
// last record of the page before. It reads a page's records deadWorkers
// at once.
func (b *Backend) listStoreDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	prefix := b.deadScope(queue) + "r/"
	after := ""
	if cursor != "" {
		if !validSeq(cursor) {
			return nil, "", fmt.Errorf("rabbit: ListDead cursor %q is not one this backend returned", cursor)
		}
		after = prefix + cursor
	}
	var recs []driver.DeadMessage
	last := ""
	for {
		keys, err := b.cfg.Store.List(ctx, prefix, after, limit-len(recs)+1)
		if err != nil {
			return nil, "", fmt.Errorf("rabbit: list dead letters of %q: %w", queue, err)
		}
		if len(keys) == 0 {
			return recs, "", nil
		}
		after = keys[len(keys)-1]
		var seqs []string
		for _, k := range keys {
			if seq := k[len(prefix):]; validSeq(seq) {
				seqs = append(seqs, seq)
			}
		}
		more := len(recs)+len(seqs) > limit // a record follows the page
		seqs = seqs[:min(len(seqs), limit-len(recs))]
		heads := make([]string, len(seqs))
		for i, seq := range seqs {
			heads[i] = b.headKey(queue, seq)
		}
		hs := make([]driver.BatchResult, 0, len(heads))
		for part := heads; len(part) > 0; part = part[min(len(part), driver.MaxBatch):] { // a batch holds driver.MaxBatch keys at most
			r, err := driver.GetEach(ctx, b.cfg.Store, part[:min(len(part), driver.MaxBatch)])
			if err != nil {
				return nil, "", fmt.Errorf("rabbit: read dead letters of %q: %w", queue, err)
			}
			hs = append(hs, r...)
		}
		got := make([]*driver.DeadMessage, len(seqs))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(deadWorkers)
		for i, seq := range seqs {
			if hs[i].Err != nil {
				continue // popped meanwhile
			}
			g.Go(func() error {
				rec, _, err := b.recordOf(gctx, queue, seq, hs[i].Value)
				if errors.Is(err, driver.ErrKeyNotFound) {
					return nil // popped meanwhile
				}
				if err != nil {
					return err
				}
				got[i] = &rec
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return nil, "", err
		}
		for i, rec := range got {
			if rec != nil {
				recs = append(recs, *rec)
				last = seqs[i]
			}
		}
		if more && len(recs) > 0 {
			return recs, last, nil
		}
	}
}

// deadCand is a record DeleteDead or PurgeDead means to remove: its seq,
// and the ID it must have (empty: any).
type deadCand struct{ seq, id string }

// deadBatch is how many records one round of takeDeadEach holds, reads
// and removes together: on a store with batches (driver.StoreBatcher),
// four calls a round whatever its size.
const deadBatch = 500

// takeDeadEach removes the records of cands that no NextDead caller holds,
// deadBatch at a time, and returns how many it removed. Each round keeps
// the order of a pop, on many records at once: it holds them (a record a
// caller holds already is left alone), reads their heads, removes the
// heads (each record is gone from then on), and only then the rest of
// their keys and the holds. A crash in between leaves a held record that
// reappears when its hold lapses, or keys no head names, never half a
// record. Cands have distinct seqs.
func (b *Backend) takeDeadEach(ctx context.Context, queue string, cands []deadCand) (int, error) {
	removed := 0
	for len(cands) > 0 {
		round := cands[:min(len(cands), deadBatch)]
		cands = cands[len(round):]
		n, err := b.takeDeadRound(ctx, queue, round)
		removed += n
		if err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// takeDeadRound is one round of takeDeadEach.
func (b *Backend) takeDeadRound(ctx context.Context, queue string, round []deadCand) (int, error) {
	s := b.cfg.Store
	holds := make([]driver.BatchItem, len(round))
	for i, c := range round {
		holds[i] = driver.BatchItem{Key: b.holdKey(queue, c.seq), Value: b.holdToken(), TTL: b.cfg.DeadHold}
	}
	made, err := driver.CreateEach(ctx, s, holds)
	if err != nil {
		return 0, fmt.Errorf("rabbit: hold dead letters of %q: %w", queue, err)
	}
	var (
		held  []int    // the indexes in round of the records held
		heads []string // their heads
		ours  []driver.BatchItem
	)
	for i, r := range made {
		if r.Err != nil {
			continue // another caller holds it: left alone
		}
		held = append(held, i)
		heads = append(heads, b.headKey(queue, round[i].seq))
		ours = append(ours, driver.BatchItem{Key: holds[i].Key, Rev: r.Rev})
	}
	if len(held) == 0 {
		return 0, nil
	}
	got, err := driver.GetEach(ctx, s, heads)
	if err != nil {
		b.dropKeys(ctx, queue, ours)
		return 0, fmt.Errorf("rabbit: read dead letters of %q: %w", queue, err)
	}
	var (
		gone  []driver.BatchItem   // heads to remove, at the revision read
		after [][]driver.BatchItem // the rest of each one's keys, its hold last
		rest  []driver.BatchItem   // holds let go and stale index keys
	)
	for j, i := range held {
		c := round[i]
		if got[j].Err != nil { // popped between the listing and the hold
			rest = append(rest, ours[j])
			if c.id != "" {
				rest = append(rest, driver.BatchItem{Key: b.idKey(queue, c.id, c.seq)}) // an index key whose record is gone
			}
			continue
		}
		id, _, chunks, _, err := decodeHead(got[j].Value, b.maxDeadBody())
		if err != nil { // a head of another writer: its ID is its seq (see readDead)
			id, chunks = c.seq, 0
		}
		if c.id != "" && id != c.id {
			rest = append(rest, ours[j]) // another ID with the same hash
			continue
		}
		gone = append(gone, driver.BatchItem{Key: heads[j], Rev: got[j].Rev})
		keys := []driver.BatchItem{{Key: b.idKey(queue, id, c.seq)}}
		for k := 1; k <= chunks; k++ {
			keys = append(keys, driver.BatchItem{Key: b.chunkKey(queue, c.seq, k)})
		}
		after = append(after, append(keys, ours[j]))
	}
	removed := 0
	if len(gone) > 0 {
		res, err := driver.DeleteEach(ctx, s, gone)
		if err != nil {
			b.dropKeys(ctx, queue, ours)
			return 0, fmt.Errorf("rabbit: remove dead letters of %q: %w", queue, err)
		}
		for k, r := range res {
			if r.Err == nil {
				removed++
				rest = append(rest, after[k]...)
			} else { // removed meanwhile, by whoever removes the rest
				rest = append(rest, after[k][len(after[k])-1])
			}
		}
	}
	b.dropKeys(ctx, queue, rest)
	return removed, nil
}

// dropKeys deletes keys (at their revisions, when set), driver.MaxBatch a
// call; a key that stays is logged: a hold lapses, and a key no head names
// is never read and goes with the queue.
func (b *Backend) dropKeys(ctx context.Context, queue string, keys []driver.BatchItem) {
	for len(keys) > 0 {
		part := keys[:min(len(keys), driver.MaxBatch)]
		keys = keys[len(part):]
		if _, err := driver.DeleteEach(ctx, b.cfg.Store, part); err != nil {
			b.log.Warn("keys of removed or let-go dead letters stay in the companion store", "queue", queue, "keys", len(part), "first", part[0].Key, "err", err)
		}
	}
}

// deleteStoreDead is DeleteDead on the store: each ID's records through
// the index (driver.MaxBatch look-ups a call), then removed deadBatch at a
// time (takeDeadEach).
func (b *Backend) deleteStoreDead(ctx context.Context, queue string, ids []string) (int, error) {
	var (
		cands []deadCand
		seen  = make(map[string]bool)
	)
	add := func(c deadCand) {
		if !seen[c.seq] {
			seen[c.seq] = true
			cands = append(cands, c)
		}
	}
	var asked []string
	seenID := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seenID[id] {
			continue
		}
		seenID[id] = true
		asked = append(asked, id)
		if validSeq(id) { // a head of another writer, handed out under its seq (see readDead)
			add(deadCand{seq: id, id: id})
		}
	}
	for len(asked) > 0 {
		part := asked[:min(len(asked), driver.MaxBatch)]
		asked = asked[len(part):]
		prefixes := make([]string, len(part))
		for i, id := range part {
			prefixes[i] = b.idPrefix(queue, id)
		}
		lists, err := driver.ListEach(ctx, b.cfg.Store, prefixes, deadListPage)
		if err != nil {
			return 0, fmt.Errorf("rabbit: look up dead letters of %q: %w", queue, err)
		}
		for i, keys := range lists {
			for _, k := range keys {
				if seq := k[len(prefixes[i]):]; validSeq(seq) {
					add(deadCand{seq: seq, id: part[i]})
				}
			}
		}
	}
	return b.takeDeadEach(ctx, queue, cands)
}

// purgeStoreDead is PurgeDead on the store: every record not held, a page
// of keys at a time (takeDeadEach).
func (b *Backend) purgeStoreDead(ctx context.Context, queue string) (int, error) {
	prefix := b.deadScope(queue) + "r/"
	removed := 0
	for after := ""; ; {
		keys, err := b.cfg.Store.List(ctx, prefix, after, deadListPage)
		if err != nil {
			return removed, fmt.Errorf("rabbit: list dead letters of %q: %w", queue, err)
		}
		if len(keys) == 0 {
			return removed, nil
		}
		after = keys[len(keys)-1]
		var cands []deadCand
		for _, k := range keys {
			if seq := k[len(prefix):]; validSeq(seq) {
				cands = append(cands, deadCand{seq: seq})
			}
		}
		n, err := b.takeDeadEach(ctx, queue, cands)
		removed += n
		if err != nil {
			return removed, err
		}
	}
}

// countStoreDead returns how many records queue has in the store: one
// count query on a store with driver.StoreCounter.
func (b *Backend) countStoreDead(ctx context.Context, queue string) (int64, error) {
	n, err := driver.CountKeys(ctx, b.cfg.Store, b.deadScope(queue)+"r/")
	if err != nil {
		return 0, fmt.Errorf("rabbit: count dead letters of %q: %w", queue, err)
	}
	return n, nil
}

// dropStoreDead removes every key of queue's dead letters, held or not.
func (b *Backend) dropStoreDead(ctx context.Context, queue string) error {
	prefix := b.deadScope(queue)
	for {
		keys, err := b.cfg.Store.List(ctx, prefix, "", deadListPage)
		if err != nil {
			return fmt.Errorf("rabbit: remove the dead letters of %q from the companion store: %w", queue, err)
		}
		if len(keys) == 0 {
			return nil
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(deadWorkers)
		for _, k := range keys {
			g.Go(func() error { return b.cfg.Store.Delete(gctx, k, "") })
		}
		if err := g.Wait(); err != nil {
			return fmt.Errorf("rabbit: remove the dead letters of %q from the companion store: %w", queue, err)
		}
	}
}

// moveQueueDead moves the records of the quorum dead-letter queue p.q:dead
// (the layout without a store, or one an older version still writes to)
// into the store, once the queue counts ready records: each is taken with
// basic.get, written under movedSeq (its order: deadSeq), and only then
// acked, so a crash in between leaves it in the queue, and the move done
// again finds it written. A record a NextDead caller of the queue layout
// holds is moved by a later call, once it is let go.
func (b *Backend) moveQueueDead(ctx context.Context, queue string) error {
	name := b.deadName(queue)
	if n := b.ready(ctx, name); n == 0 {
		return nil
	}
	b.migMu.Lock()
	defer b.migMu.Unlock()
	moved := 0
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(name, false)
			if err != nil {
				return fmt.Errorf("rabbit: get from %q: %w", name, err)
			}
			if !ok {
				return nil
			}
			at := deadSeq(d)
			rec := driver.DeadMessage{ID: d.MessageId, Body: d.Body}
			err = b.writeDead(ctx, queue, movedSeq(at, d.MessageId, d.Body), rec)
			if err != nil && !errors.Is(err, driver.ErrKeyExists) {
				return err // closing ch puts the record back
			}
			if err := ch.Ack(d.DeliveryTag, false); err != nil {
				return fmt.Errorf("rabbit: ack %q in %q after its move: %w", d.MessageId, name, err)
			}
			moved++
		}
	})
	if moved > 0 {
		b.log.Info("moved dead letters from the dead-letter queue to the companion store", "queue", queue, "from", name, "records", moved)
	}
	if err != nil {
		return fmt.Errorf("rabbit: moving the dead letters of %q to the companion store (moved %d): %w", queue, moved, err)
	}
	return nil
}

// toStore moves queue's dead letters of the older layouts into the store:
// those of the classic queue p.q.dead into the quorum queue (migrateDead),
// then those of the quorum queue into the store (moveQueueDead).
func (b *Backend) toStore(ctx context.Context, queue string) error {
	b.migrateDead(ctx, queue)
	return b.moveQueueDead(ctx, queue)
}

// letGoTimeout bounds how long Close spends letting go of the holds.
const letGoTimeout = 5 * time.Second

// letGoHolds lets go of the dead letters this Backend holds in the store
// and has not settled, so that other callers see them at once rather than
// after DeadHold: Close abandons a hold as a dying process would, but
// need not keep its record hidden.
func (b *Backend) letGoHolds() {
	b.mu.Lock()
	holds := b.holds
	b.holds = map[*storeHold]bool{}
	b.mu.Unlock()
	if len(holds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), letGoTimeout)
	defer cancel()
	for h := range holds {
		if !h.settled.CompareAndSwap(false, true) {
			continue
		}
		h.mu.Lock()
		rev := h.rev
		h.mu.Unlock()
		if err := b.cfg.Store.Delete(ctx, b.holdKey(h.queue, h.seq), rev); err != nil && !errors.Is(err, driver.ErrRevision) {
			b.log.Warn("a dead letter stays hidden until its hold ends", "queue", h.queue, "id", h.id, "hold", b.cfg.DeadHold, "err", err)
		}
	}
}
