package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/asyncplatform/asyncplatform/driver"
)

// NextDead implements driver.Backend. A durable pull consumer per queue on
// the dead-letter stream (AckWait = Config.DeadHold) hands out records in
// stream order, each to one caller: a record delivered and not yet acked is
// pending on the consumer and not handed out again until it is naked
// (SettleDead keep), or its AckWait runs out (no ExtendDead came: the
// caller stopped renewing or vanished).
func (b *Backend) NextDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	qs := b.queue(queue)
	recreated, rescues, skips := false, 0, 0
	for {
		if err := b.ensureDead(ctx, qs, queue); err != nil {
			return nil, err
		}
		msgs, start, err := b.pull(ctx, b.deadName(), deadConsumer(queue), 1, 0, b.release)
		if errors.Is(err, errReconnected) {
			continue
		}
		if errors.Is(err, errNoConsumer) && !recreated {
			recreated = true
			qs.mu.Lock()
			qs.dead = false
			qs.mu.Unlock()
			continue
		}
		if (err != nil || len(msgs) == 0) && !errors.Is(err, errNoConsumer) && ctx.Err() == nil && b.ctx.Err() == nil && rescues < 2 {
			// Nothing came (or no answer: 2.9 leaves a no-wait pull
			// waiting when it counts a record it cannot find): records
			// the consumer passed by may be stranded.
			rescues++
			if again, rerr := b.rescueDead(ctx, qs, queue); rerr == nil && (again || err != nil) {
				continue
			} else if rerr != nil && err == nil {
				b.log.Warn("nats: look for stranded dead letters", "queue", queue, "err", rerr)
			}
		}
		if err != nil {
			return nil, err
		}
		if len(msgs) == 0 {
			return nil, driver.ErrNoDeadLetters
		}
		m := msgs[0]
		md, err := parseAck(m.Reply)
		if err != nil {
			return nil, err
		}
		hseq, err := b.holdRecord(ctx, queue, m, md.seq)
		if errors.Is(err, errSkip) && skips < maxSkips {
			skips++
			continue
		}
		if err != nil {
			return nil, err
		}
		r := &receipt{reply: m.Reply, seq: md.seq, ackWait: b.cfg.DeadHold, deadline: start.Add(b.cfg.DeadHold),
			queue: queue, holdSeq: hseq}
		if !b.addHeld(r) {
			b.release(m)
			b.dropMarker(hseq)
			return nil, driver.ErrClosed
		}
		return &driver.DeadDelivery{
			DeadMessage: driver.DeadMessage{ID: m.Header.Get(hdrDeadID), Body: m.Data},
			Handle:      r,
		}, nil
	}
}

// errSkip reports a dead letter NextDead pulled and does not hand out: a
// DeleteDead is deleting it, or has deleted it.
var errSkip = errors.New("dead letter being deleted")

// maxSkips bounds the records one NextDead passes over (errSkip) before it
// says there are none.
const maxSkips = 100

// holdRecord marks the dead letter m (at stream sequence seq) held, and
// returns its marker's sequence (see hold.go). A record a DeleteDead is
// deleting is naked until its marker lapses, and one already deleted is
// acked: both errSkip. On any other error, m is handed back.
func (b *Backend) holdRecord(ctx context.Context, queue string, m *gonats.Msg, seq uint64) (uint64, error) {
	hseq, err := b.hold(ctx, queue, seq, b.cfg.DeadHold)
	var del errDeleting
	if errors.As(err, &del) {
		delay := max(time.Until(del.until), 100*time.Millisecond)
		_ = b.nc.Publish(m.Reply, []byte(fmt.Sprintf("%s {\"delay\": %d}", ackNak, delay.Nanoseconds())))
		return 0, errSkip
	}
	if err != nil {
		b.release(m)
		return 0, err
	}
	// A DeleteDead that marked, deleted and unmarked the record between the
	// pull and the hold left no marker: look at the record itself.
	_, err = b.dead.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		_ = b.nc.Publish(m.Reply, ackAck)
		b.dropMarker(hseq)
		return 0, errSkip
	}
	if err != nil {
		b.dropMarkerWait(ctx, hseq) // before the nak: a live marker keeps the next caller off
		b.release(m)
		return 0, fmt.Errorf("nats: read dead letter seq %d: %w", seq, err)
	}
	return hseq, nil
}

// rescueDead moves the queue's stranded dead letters, if any, to the end of
// the stream, where the consumer hands them out; it reports whether to pull
// again (something was moved, or the consumer has records to deliver).
//
// nats-server 2.9 (filestore.go and memstore.go, removeSeqPerSubject) keeps
// a subject's last sequence when that message is deleted, and when a later
// delete of the subject's first message leaves one message, it takes that
// stale last sequence as the first: the remaining message is then invisible
// to every lookup by subject (TestDeadInterleavedDeletes: two queues'
// records interleaved, a queue's newest record deleted, then its oldest).
// The consumer, filtered on the subject, does not find it either and moves
// past it for good (its next sequence goes past the end of the stream when
// the lookup fails), so it would never be handed out, even once the index
// is right again. A message published later is found (its sequence is past
// the stale one), hence the move: a copy is published (Nats-Msg-Id
// moved/<seq>, so movers racing store one copy) and the one that stored it
// deletes the original; if someone deleted the original meanwhile, it
// deletes the copy again.
//
// A record is moved only when the consumer can neither hold it nor ever
// deliver it: at or below its delivered sequence when nothing is pending,
// else at or below its ack floor (every pending sequence is above the
// floor); an acknowledged record was deleted before its ack. A stranded
// record above the floor waits until the records held below it are
// settled, and so does one with a live marker (a holder renews it: the
// consumer's figures are not trusted to keep a held record in place). With
// an ack floor of 0 (the oldest record held) nothing is moved. Nothing is
// looked at unless the subject's count (which is right), read after the
// consumer's figures, exceeds what the consumer holds and the consumer has
// nothing left to deliver; then the stream is scanned (one lookup per
// message of any queue) from where the last rescue of this Backend stopped.
func (b *Backend) rescueDead(ctx context.Context, qs *queueState, queue string) (bool, error) {
	subj := b.deadSubject(queue)
	c, err := b.dead.Consumer(ctx, deadConsumer(queue))
	if err != nil {
		return false, fmt.Errorf("nats: dead-letter consumer of %s: %w", queue, err)
	}
	info := c.CachedInfo() // also makes 2.9 recount the consumer's pending records
	if info.NumPending > 0 {
		return true, nil
	}
	// Counted after the consumer's figures: a pop in between then lowers
	// the count, never the figures below it.
	n, err := b.subjectCount(ctx, b.dead, subj)
	if err != nil || n == 0 || uint64(n) <= uint64(info.NumAckPending) {
		return false, err
	}
	limit := info.AckFloor.Stream
	if info.NumAckPending == 0 {
		limit = info.Delivered.Stream
	}
	if limit == 0 {
		return false, nil // nothing at or below the floor (scan's 0 means the end)
	}
	qs.mu.Lock()
	from := qs.rescued + 1
	qs.mu.Unlock()
	if from > limit+1 {
		from = 1 // the consumer was recreated
	}
	var stranded []*jetstream.RawStreamMsg
	err = b.scanDead(ctx, subj, from, limit, func(m *jetstream.RawStreamMsg) bool {
		stranded = append(stranded, m)
		return true
	})
	if err != nil {
		return false, err
	}
	moved, marked := 0, false
	for _, m := range stranded {
		// A live marker means a caller holds the record (or a DeleteDead
		// deletes it), whatever the figures said: a move would hand it
		// out again under a new sequence, without its marker.
		if live, err := b.marked(ctx, queue, m.Sequence); err != nil {
			return false, err
		} else if live {
			marked = true
			continue
		}
		if err := b.moveDead(ctx, m); err != nil {
			return false, err
		}
		moved++
	}
	if !marked {
		qs.mu.Lock()
		qs.rescued = limit
		qs.mu.Unlock()
	}
	if moved > 0 {
		b.log.Warn("nats: moved dead letters the server's subject index had lost", "queue", queue, "moved", moved)
	}
	return moved > 0, nil
}

// marked reports whether the dead letter at seq of queue has a live marker
// (see hold.go).
func (b *Backend) marked(ctx context.Context, queue string, seq uint64) (bool, error) {
	s, err := b.holdStream(ctx)
	if err != nil {
		return false, err
	}
	mk, err := b.readMarker(ctx, s, b.holdSubject(queue, seq))
	return err == nil && mk.live(), err
}

// moveDead publishes a copy of the dead letter m at the end of the stream
// and deletes m (see rescueDead).
func (b *Backend) moveDead(ctx context.Context, m *jetstream.RawStreamMsg) error {
	c := &gonats.Msg{Subject: m.Subject, Data: m.Data, Header: gonats.Header{}}
	for k, v := range m.Header {
		if k != hdrMsgID {
			c.Header[k] = v
		}
	}
	c.Header.Set(hdrMsgID, "moved/"+strconv.FormatUint(m.Sequence, 10))
	ack, err := b.js.PublishMsg(ctx, c, jetstream.WithExpectStream(b.deadName()))
	if err != nil {
		return pubErr(c, err)
	}
	if ack.Duplicate {
		return nil // another mover stored the copy, and deletes the original
	}
	err = b.dead.DeleteMsg(ctx, m.Sequence)
	if gone(err) {
		// Deleted meanwhile (DeleteDead, PurgeDead): so is the copy.
		err = b.dead.DeleteMsg(ctx, ack.Sequence)
	}
	if err != nil && !gone(err) {
		return fmt.Errorf("nats: move dead letter seq %d: %w", m.Sequence, err)
	}
	return nil
}

// addHeld records a held dead letter, for Close to hand back; false when
// the Backend is closed.
func (b *Backend) addHeld(r *receipt) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.held[r] = struct{}{}
	return true
}

// dropHeld forgets a dead letter settled.
func (b *Backend) dropHeld(r *receipt) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.held, r)
}

// releaseHeld hands back every dead letter this Backend holds, at once:
// Close calls it. Each record's marker is deleted and its nak confirmed
// before Close returns (within closeRelease in all), so that a NextDead
// called after Close finds the records: the server takes acks off a queue
// of its own, and a nak only published could still be waiting there.
func (b *Backend) releaseHeld() {
	b.mu.Lock()
	held := b.held
	b.held = map[*receipt]struct{}{}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeRelease)
	defer cancel()
	for r := range held {
		r.mu.Lock()
		if !r.done {
			r.done = true
			b.dropMarkerWait(ctx, r.holdSeq)
			if _, err := b.nc.RequestWithContext(ctx, r.reply, ackNak); err != nil {
				b.log.Debug("nats: hand back a dead letter on close", "seq", r.seq, "err", err)
			}
		}
		r.mu.Unlock()
	}
}

// closeRelease bounds the hand-back of the held dead letters in Close.
const closeRelease = 5 * time.Second

// ExtendDead implements driver.Backend: InProgress on the dead-letter
// consumer restarts the record's AckWait (Config.DeadHold), and its hold
// marker is written again for as long.
func (b *Backend) ExtendDead(ctx context.Context, d *driver.DeadDelivery) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	r, err := deadReceipt(d)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || !r.live() {
		return driver.ErrLeaseLost
	}
	if err := b.extend(ctx, r); err != nil {
		return err
	}
	return b.renewHold(ctx, r)
}

// deadReceipt returns the receipt of a dead letter handed out by NextDead.
func deadReceipt(d *driver.DeadDelivery) (*receipt, error) {
	r, err := handle(d.Handle)
	if err != nil {
		return nil, err
	}
	if r.queue == "" {
		return nil, errors.New("nats: dead letter: the handle is not from NextDead")
	}
	return r, nil
}

// renewHold writes the hold marker of r again, with a new lease; a hold
// that another marker replaced (a DeleteDead took it as lapsed) is lost.
// r.mu is held.
func (b *Backend) renewHold(ctx context.Context, r *receipt) error {
	hseq, err := b.writeMarker(ctx, b.holdSubject(r.queue, r.seq), holdKeep, r.ackWait, r.holdSeq)
	if errors.Is(err, errMarked) {
		r.done = true
		return driver.ErrLeaseLost
	}
	if err != nil {
		return err
	}
	r.holdSeq = hseq
	return nil
}

// release hands a dead letter back at once.
func (b *Backend) release(m *gonats.Msg) {
	_ = b.nc.Publish(m.Reply, ackNak)
}

func (b *Backend) ensureDead(ctx context.Context, qs *queueState, queue string) error {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.dead {
		return nil
	}
	c, err := b.dead.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       deadConsumer(queue),
		Description:   "asyncplatform dead letters of queue " + queue,
		FilterSubject: b.deadSubject(queue),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       b.cfg.DeadHold,
		MaxDeliver:    -1,
		MaxAckPending: -1,
	})
	if err == nil {
		err = waitConsumerLeader(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("nats: dead-letter consumer for queue %s: %w", queue, err)
	}
	qs.dead = true
	return nil
}

// SettleDead implements driver.Backend. remove deletes the record from the
// stream and acks it on the consumer; keep naks it, which puts it first in
// line for the next NextDead.
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	r, err := deadReceipt(d)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() {
		if r.done {
			b.dropHeld(r)
		}
	}()
	if !r.live() { // lapsed: the receipt is done with, Close has nothing to give back
		r.done = true
		b.dropMarker(r.holdSeq)
		return driver.ErrLeaseLost
	}
	if held, err := b.stillHeld(ctx, r.queue, r.seq, r.holdSeq); err != nil {
		return err
	} else if !held {
		r.done = true
		return driver.ErrLeaseLost
	}
	if remove {
		defer b.dropMarker(r.holdSeq)
		err := b.dead.DeleteMsg(ctx, r.seq)
		if err != nil && !gone(err) {
			return fmt.Errorf("nats: delete dead letter seq %d: %w", r.seq, err)
		}
		err = b.ackSync(ctx, r, ackAck)
		r.done = true // deleted: the consumer skips it even if the ack was lost
		return err
	}
	// Kept: the marker goes before the nak, so the next caller, handed the
	// record at once, finds no live hold on it (see hold.go).
	b.dropMarkerWait(ctx, r.holdSeq)
	if err := b.ackSync(ctx, r, ackNak); err != nil {
		return err
	}
	r.done = true
	return nil
}

// ListDead implements driver.Backend by walking the dead-letter stream's
// messages on the queue's subject, oldest first; the cursor is the next
// stream sequence and how many records the pages before returned
// ("<seq>:<listed>"). When the walk by subject ends with fewer records than
// the subject counts, the server's subject index has lost some (see
// rescueDead): the last pages then scan the whole stream for those
// (cursor "h<seq>:<listed>") and list them after the others, out of order.
// A cursor of a bare sequence (older versions) is still read, without that
// check.
func (b *Backend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	if b.closed.Load() {
		return nil, "", driver.ErrClosed
	}
	if limit < 1 {
		return nil, "", fmt.Errorf("nats: list dead letters of %s: limit %d: want at least 1", queue, limit)
	}
	from, listed, lost, ok := uint64(1), int64(0), false, true
	if cursor != "" {
		c, l, hasListed := strings.Cut(cursor, ":")
		lost = strings.HasPrefix(c, "h")
		n, err := strconv.ParseUint(strings.TrimPrefix(c, "h"), 10, 64)
		ok = err == nil && n > 0
		from = n
		listed = -1
		if hasListed {
			listed, err = strconv.ParseInt(l, 10, 64)
			ok = ok && err == nil && listed >= 0
		} else {
			ok = ok && !lost
		}
		if !ok {
			return nil, "", fmt.Errorf("nats: list dead letters of %s: bad cursor %q", queue, cursor)
		}
	}
	subj := b.deadSubject(queue)
	var recs []driver.DeadMessage
	next := ""
	add := func(m *jetstream.RawStreamMsg) bool {
		if len(recs) == limit {
			next = strconv.FormatUint(m.Sequence, 10)
			if listed >= 0 {
				next += ":" + strconv.FormatInt(listed+int64(limit), 10)
			}
			if lost {
				next = "h" + next
			}
			return false
		}
		recs = append(recs, driver.DeadMessage{ID: m.Header.Get(hdrDeadID), Body: m.Data})
		return true
	}
	if !lost {
		if err := b.walkDead(ctx, queue, from, add); err != nil || next != "" || listed < 0 {
			return recs, next, err
		}
		n, err := b.subjectCount(ctx, b.dead, subj)
		if err != nil || n <= listed+int64(len(recs)) {
			return recs, next, err
		}
		lost, from = true, 1
	}
	var lerr error
	err := b.scanDead(ctx, subj, from, 0, func(m *jetstream.RawStreamMsg) bool {
		h, err := b.hiddenDead(ctx, m)
		if err != nil {
			lerr = err
			return false
		}
		return !h || add(m)
	})
	if err == nil {
		err = lerr
	}
	return recs, next, err
}

// walkDead calls fn with each record of the queue from sequence from on
// that a lookup by subject finds, until fn returns false or the records
// end. It can miss records (see rescueDead); scanDead finds them.
func (b *Backend) walkDead(ctx context.Context, queue string, from uint64, fn func(*jetstream.RawStreamMsg) bool) error {
	subj := b.deadSubject(queue)
	for seq := from; ; {
		m, err := b.dead.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("nats: read dead letters of %s at seq %d: %w", queue, seq, err)
		}
		if !fn(m) {
			return nil
		}
		seq = m.Sequence + 1
	}
}

// scanDead is scan on the dead-letter stream.
func (b *Backend) scanDead(ctx context.Context, subj string, from, to uint64, fn func(*jetstream.RawStreamMsg) bool) error {
	return scan(ctx, b.dead, subj, from, to, fn)
}

// scan calls fn with each message of s on subj ("" for any) from sequence
// from to sequence to (0: to the end) until fn returns false, looking at every
// message of the stream, whatever its subject, with lookups on ">" (which
// the server answers by scanning, not from its subject index): one round
// trip per message.
func scan(ctx context.Context, s jetstream.Stream, subj string, from, to uint64, fn func(*jetstream.RawStreamMsg) bool) error {
	for seq := max(from, 1); to == 0 || seq <= to; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("nats: scan %s at seq %d: %w", s.CachedInfo().Config.Name, seq, err)
		}
		if to != 0 && m.Sequence > to {
			return nil
		}
		if (subj == "" || m.Subject == subj) && !fn(m) {
			return nil
		}
		seq = m.Sequence + 1
	}
	return nil
}

// hiddenDead reports whether a lookup by subject from m's own sequence
// misses m: whether walkDead cannot find it.
func (b *Backend) hiddenDead(ctx context.Context, m *jetstream.RawStreamMsg) (bool, error) {
	got, err := b.dead.GetMsg(ctx, m.Sequence, jetstream.WithGetMsgSubject(m.Subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("nats: read dead letter at seq %d: %w", m.Sequence, err)
	}
	return got.Sequence != m.Sequence, nil
}

// DeleteDead implements driver.Backend: it walks the queue's records and
// deletes those whose ID is among ids, but for those a NextDead caller
// holds (see hold.go), which it neither deletes nor counts. When the
// subject count then says the walk missed records (see rescueDead), it
// scans the stream for them. When a record was gone before its delete (it
// may have been moved by rescueDead), it walks again.
func (b *Backend) DeleteDead(ctx context.Context, queue string, ids []string) (int, error) {
	if b.closed.Load() {
		return 0, driver.ErrClosed
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	subj := b.deadSubject(queue)
	n := 0
	var seqs []uint64
	seen := int64(0)
	collect := func(m *jetstream.RawStreamMsg) bool { // the wanted records' sequences
		seen++
		if want[m.Header.Get(hdrDeadID)] {
			seqs = append(seqs, m.Sequence)
		}
		return true
	}
	for round := 0; round < 3; round++ {
		seqs, seen = seqs[:0], 0
		err := b.streamDead(ctx, queue, collect)
		if err != nil {
			return n, err
		}
		deleted, gone, err := b.deleteUnheld(ctx, queue, seqs)
		n += deleted
		if err != nil {
			return n, err
		}
		if round == 0 {
			count, err := b.subjectCount(ctx, b.dead, subj)
			if err != nil {
				return n, err
			}
			if count > seen-int64(deleted+gone) {
				seqs = seqs[:0]
				if err := b.scanDead(ctx, subj, 1, 0, collect); err != nil {
					return n, err
				}
				d, g, err := b.deleteUnheld(ctx, queue, seqs)
				n, gone = n+d, gone+g
				if err != nil {
					return n, err
				}
			}
		}
		if gone == 0 {
			break
		}
	}
	return n, nil
}

// streamDead calls fn with each record of the queue that walkDead finds,
// in the same order, but read through an ephemeral consumer filtered on
// the queue's subject: the server streams the records in pulls of
// deadStreamBatch, a handful of API calls for the whole walk where
// walkDead makes one a record. fn cannot stop the walk.
func (b *Backend) streamDead(ctx context.Context, queue string, fn func(*jetstream.RawStreamMsg) bool) error {
	subj := b.deadSubject(queue)
	c, err := b.dead.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Description:       "asyncplatform DeleteDead walk of queue " + queue,
		FilterSubject:     subj,
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	})
	if err != nil {
		return fmt.Errorf("nats: walk dead letters of %s: %w", queue, err)
	}
	name := c.CachedInfo().Name
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := b.dead.DeleteConsumer(dctx, name); err != nil {
			b.log.Debug("nats: delete a walk's consumer (it lapses after a minute)", "consumer", name, "err", err)
		}
	}()
	left := c.CachedInfo().NumPending
	for left > 0 {
		got, pending, err := fetchDead(ctx, c, int(min(left, deadStreamBatch)), fn)
		if err != nil {
			return fmt.Errorf("nats: walk dead letters of %s: %w", queue, err)
		}
		if got > 0 {
			left = pending
			continue
		}
		// Nothing came: the rest may have been deleted meanwhile.
		info, err := c.Info(ctx)
		if err != nil {
			return fmt.Errorf("nats: walk dead letters of %s: %w", queue, err)
		}
		if info.NumPending == left {
			return fmt.Errorf("nats: walk dead letters of %s: %d records left, none delivered", queue, left)
		}
		left = info.NumPending
	}
	return nil
}

// fetchDead pulls up to n records from a walk's consumer, calls fn with
// each, and returns how many came and how many the consumer had left
// after the last.
func fetchDead(ctx context.Context, c jetstream.Consumer, n int, fn func(*jetstream.RawStreamMsg) bool) (got int, left uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	batch, err := c.Fetch(n, jetstream.FetchContext(ctx))
	if err != nil {
		return 0, 0, err
	}
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			return got, 0, err
		}
		got++
		left = md.NumPending
		fn(&jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: md.Sequence.Stream, Header: m.Headers(), Data: m.Data(), Time: md.Timestamp})
	}
	if err := batch.Error(); err != nil && got == 0 && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
		return 0, 0, err
	}
	return got, left, nil
}

// deadStreamBatch is the pull size of streamDead.
const deadStreamBatch = 1000

// deleteUnheld deletes the dead letters at seqs of queue that no NextDead
// caller holds (see hold.go): it marks them as being deleted, deletes
// those it could mark, and removes the markers. It returns how many it
// deleted, and how many were gone already.
func (b *Backend) deleteUnheld(ctx context.Context, queue string, seqs []uint64) (deleted, gone int, err error) {
	marks, err := b.markDeleting(ctx, queue, seqs)
	if err != nil {
		return 0, 0, err
	}
	free := make([]uint64, 0, len(seqs))
	for i, seq := range seqs {
		if marks[i] != 0 {
			free = append(free, seq)
		}
	}
	defer func() {
		for _, hseq := range marks {
			b.dropMarker(hseq)
		}
	}()
	return b.deleteDeadSeqs(ctx, queue, free)
}

// deleteDeadSeqs deletes the dead stream's messages at seqs; it returns how
// many it deleted, and how many were gone already.
//
// The deletes are sent deleteInFlight at a time, so that a batch costs
// about len(seqs)/deleteInFlight round trips.
func (b *Backend) deleteDeadSeqs(ctx context.Context, queue string, seqs []uint64) (deleted, already int, err error) {
	errs := make([]error, len(seqs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(deleteInFlight)
	for i, seq := range seqs {
		g.Go(func() error {
			errs[i] = b.dead.DeleteMsg(gctx, seq)
			if errs[i] != nil && !gone(errs[i]) {
				return errs[i]
			}
			return nil
		})
	}
	_ = g.Wait()
	for i, err := range errs {
		switch {
		case err == nil:
			deleted++
		case gone(err):
			already++ // deleted meanwhile by someone else, or moved
		case errors.Is(err, context.Canceled) && ctx.Err() == nil:
			// Not sent: an earlier delete of this batch failed.
		default:
			return deleted, already, fmt.Errorf("nats: delete dead letter of %s at seq %d: %w", queue, seqs[i], err)
		}
	}
	return deleted, already, nil
}

// deleteInFlight is how many dead letters deleteDeadSeqs deletes at once.
const deleteInFlight = 32

// gone reports whether a DeleteMsg failed because the message was not
// there: ErrMsgNotFound from one server; a replicated stream's leader
// answers "sequence not found" (error code 10043) or "no message found"
// (10057, a failed delete), which the client passes on as text only.
func gone(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "err_code=10043") || strings.Contains(s, "err_code=10057") && strings.Contains(s, "no message found")
}

// PurgeDead implements driver.Backend by deleting the queue's records one
// by one (see deleteAll).
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if b.closed.Load() {
		return 0, driver.ErrClosed
	}
	return b.deleteAll(ctx, b.dead, b.deadSubject(queue))
}
