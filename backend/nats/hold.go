package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Holds: what keeps DeleteDead off a dead letter that a NextDead caller
// holds.
//
// A record handed out by NextDead is pending on the queue's dead-letter
// consumer, which keeps other NextDead callers off it; but DeleteDead
// deletes by stream sequence, and the server tells no one which sequences
// are pending. So each record in use has a marker on the holds stream
// (S_HOLD, limits retention, one message per subject), on the subject
// S.hold.<queue token>.<record's stream sequence>: "h <lease>" while a
// NextDead caller holds it, "d <lease>" while a DeleteDead deletes it. A
// marker is written with Nats-Expected-Last-Subject-Sequence (the sequence
// of the marker it replaces, 0 for none), so two writers never both win,
// and it stands for its lease from its server timestamp, judged by the
// reader's clock (keep the clocks of the processes in sync, as for
// NotBefore).
//
// NextDead marks the record it pulled "h" over no marker or a lapsed one,
// and then reads the record: a record a DeleteDead deleted meanwhile is
// acked and skipped. A live "d" means a DeleteDead is deleting the record;
// a live "h", that its holder still renews it, though the consumer handed
// it out again (the holder's delivery lapsed on a late renewal, or a
// nats-server before 2.10.14 handed a withdrawn pull's copy out again,
// #5305): either way NextDead naks it until that marker's lease ends and
// takes the next. So a holder hands its marker back before its nak (a
// keep, Close), and a record kept is at once the next caller's. ExtendDead writes the hold again with every InProgress, so a
// renewing holder's marker is never older than a third of its lease; SettleDead
// checks that its marker is still the last one (else the hold was lost,
// ErrLeaseLost) and deletes it once the record is settled, as Close does.
//
// DeleteDead marks each record it deletes "d", over nothing or a lapsed
// marker, and leaves (and does not count) a record with a live "h" or
// another DeleteDead's live "d". The first attempt of every record is one
// conditional publish expecting no marker, all at once; only records that
// have a marker are looked at one by one. Markers are deleted by sequence
// once used, without waiting for the answer; one left behind (a process
// killed in between) names a sequence whose record is gone or lapses.
//
// The holds stream has no consumer, and its subjects hold one message each,
// which keeps 2.9's per-subject index right (see rescueDead) and lets
// DeleteQueue purge a queue's markers.

const (
	holdKeep   = 'h' // held by a NextDead caller
	holdDelete = 'd' // being deleted by DeleteDead
)

func (b *Backend) holdName() string { return b.cfg.Stream + "_HOLD" }

// holdSubject names the marker of the dead letter at stream sequence seq
// of queue.
func (b *Backend) holdSubject(queue string, seq uint64) string {
	return b.cfg.Stream + ".hold." + token(queue) + "." + strconv.FormatUint(seq, 10)
}

// holdStream returns the holds stream, made on first use.
func (b *Backend) holdStream(ctx context.Context) (jetstream.Stream, error) {
	b.holdMu.Lock()
	defer b.holdMu.Unlock()
	if b.holds != nil {
		return b.holds, nil
	}
	s, err := b.ensureStream(ctx, jetstream.StreamConfig{
		Name:              b.holdName(),
		Description:       "asyncplatform markers of dead letters held by NextDead or being deleted by DeleteDead",
		Subjects:          []string{b.cfg.Stream + ".hold.>"},
		Retention:         jetstream.LimitsPolicy,
		Storage:           b.cfg.Storage,
		Replicas:          b.replicas,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardOld,
	})
	if err != nil {
		return nil, err
	}
	b.holds = s
	return s, nil
}

// marker is the last marker of a record.
type marker struct {
	seq   uint64 // its sequence in the holds stream; 0: none
	kind  byte
	until time.Time // when it lapses
}

func (m marker) live() bool { return m.seq != 0 && time.Now().Before(m.until) }

// readMarker returns the last marker on subj (seq 0 when there is none).
func (b *Backend) readMarker(ctx context.Context, s jetstream.Stream, subj string) (marker, error) {
	m, err := s.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return marker{}, nil
	}
	if err != nil {
		return marker{}, fmt.Errorf("nats: read marker %s: %w", subj, err)
	}
	mk := marker{seq: m.Sequence}
	kind, lease, _ := strings.Cut(string(m.Data), " ")
	ns, perr := strconv.ParseInt(lease, 10, 64)
	if len(kind) != 1 || perr != nil {
		return mk, nil // not ours: lapsed
	}
	mk.kind, mk.until = kind[0], m.Time.Add(time.Duration(ns))
	return mk, nil
}

// errMarked reports a conditional marker publish that lost: another marker
// was written since the one expected.
var errMarked = errors.New("marker written meanwhile")

// markerMsg is the marker of kind on subj for lease, replacing the marker
// at sequence expect (0: none).
func markerMsg(subj string, kind byte, lease time.Duration, expect uint64) *gonats.Msg {
	m := &gonats.Msg{Subject: subj, Data: []byte(string(kind) + " " + strconv.FormatInt(int64(lease), 10)), Header: gonats.Header{}}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	return m
}

// markerErr turns a refused conditional publish into errMarked.
func markerErr(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return errMarked
	}
	return err
}

// writeMarker writes a marker over the one at sequence expect and returns
// its sequence; errMarked when another was written since.
func (b *Backend) writeMarker(ctx context.Context, subj string, kind byte, lease time.Duration, expect uint64) (uint64, error) {
	ack, err := b.js.PublishMsg(ctx, markerMsg(subj, kind, lease, expect))
	if err != nil {
		return 0, markerErr(err)
	}
	return ack.Sequence, nil
}

// dropMarker deletes the marker at seq without waiting for the answer
// (logged by claimReplies' subscription when it fails).
func (b *Backend) dropMarker(seq uint64) {
	if seq == 0 {
		return
	}
	inbox, err := b.claimReplies()
	if err != nil {
		b.log.Debug("nats: delete a marker", "seq", seq, "err", err)
		return
	}
	req, _ := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NoErase bool   `json:"no_erase"`
	}{seq, true})
	if err := b.nc.PublishRequest("$JS.API.STREAM.MSG.DELETE."+b.holdName(), inbox, req); err != nil {
		b.log.Debug("nats: delete a marker", "seq", seq, "err", err)
	}
}

// dropMarkerWait deletes the hold marker at seq, waiting for the server's
// answer (or ctx).
func (b *Backend) dropMarkerWait(ctx context.Context, seq uint64) {
	if seq == 0 {
		return
	}
	req, _ := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NoErase bool   `json:"no_erase"`
	}{seq, true})
	if _, err := b.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.DELETE."+b.holdName(), req); err != nil {
		b.log.Debug("nats: delete a marker", "seq", seq, "err", err)
	}
}

// errDeleting reports a record that a DeleteDead is deleting or another
// NextDead caller holds (a live marker); until is when its marker lapses.
type errDeleting struct{ until time.Time }

func (e errDeleting) Error() string { return "the dead letter is held or being deleted" }

// hold marks the dead letter at seq of queue held for lease and returns
// the marker's sequence: over no marker or a lapsed one. A live marker (a
// holder that renews it, or a deletion) is errDeleting.
func (b *Backend) hold(ctx context.Context, queue string, seq uint64, lease time.Duration) (uint64, error) {
	s, err := b.holdStream(ctx)
	if err != nil {
		return 0, err
	}
	subj := b.holdSubject(queue, seq)
	for {
		mk, err := b.readMarker(ctx, s, subj)
		if err != nil {
			return 0, err
		}
		if mk.live() {
			// A live "d": a DeleteDead is deleting the record. A live "h":
			// its holder renews it, so the consumer handed the record out
			// while that holder still has it (its delivery lapsed on a
			// slow renewal, or nats-server before 2.10.14 handed a
			// withdrawn pull's copy out again, #5305): not this caller's.
			return 0, errDeleting{until: mk.until}
		}
		hseq, err := b.writeMarker(ctx, subj, holdKeep, lease, mk.seq)
		if errors.Is(err, errMarked) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("nats: hold dead letter seq %d: %w", seq, err)
		}
		return hseq, nil
	}
}

// stillHeld reports whether the hold at sequence hseq is the last marker
// of the record.
func (b *Backend) stillHeld(ctx context.Context, queue string, seq, hseq uint64) (bool, error) {
	s, err := b.holdStream(ctx)
	if err != nil {
		return false, err
	}
	mk, err := b.readMarker(ctx, s, b.holdSubject(queue, seq))
	return err == nil && mk.seq == hseq, err
}

// markDeleting marks the records at seqs of queue as being deleted and
// returns, for each, its marker's sequence, or 0 when a live marker (a
// NextDead caller's hold, or another DeleteDead) keeps it.
func (b *Backend) markDeleting(ctx context.Context, queue string, seqs []uint64) ([]uint64, error) {
	out := make([]uint64, len(seqs))
	if len(seqs) == 0 {
		return out, nil
	}
	s, err := b.holdStream(ctx)
	if err != nil {
		return nil, err
	}
	lease := b.cfg.DeadHold
	// First every record at once, expecting no marker: the usual case.
	futures := make([]jetstream.PubAckFuture, len(seqs))
	for i, seq := range seqs {
		if futures[i], err = b.js.PublishMsgAsync(markerMsg(b.holdSubject(queue, seq), holdDelete, lease, 0)); err != nil {
			return nil, fmt.Errorf("nats: mark dead letter seq %d: %w", seq, err)
		}
	}
	var slow []int
	for i, f := range futures {
		select {
		case pa := <-f.Ok():
			out[i] = pa.Sequence
		case err := <-f.Err():
			if !errors.Is(markerErr(err), errMarked) {
				return nil, fmt.Errorf("nats: mark dead letter seq %d: %w", seqs[i], err)
			}
			slow = append(slow, i)
		case <-ctx.Done():
			return nil, fmt.Errorf("nats: mark dead letters: %w", ctx.Err())
		}
	}
	// Then those with a marker, one by one.
	for _, i := range slow {
		subj := b.holdSubject(queue, seqs[i])
		for {
			mk, err := b.readMarker(ctx, s, subj)
			if err != nil {
				return nil, err
			}
			if mk.live() {
				break // held, or another DeleteDead's
			}
			hseq, err := b.writeMarker(ctx, subj, holdDelete, lease, mk.seq)
			if errors.Is(err, errMarked) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("nats: mark dead letter seq %d: %w", seqs[i], err)
			}
			out[i] = hseq
			break
		}
	}
	return out, nil
}

// deleteHolds deletes the markers of queue, if the holds stream exists. It
// purges: the stream has no consumer (see deleteClaims).
func (b *Backend) deleteHolds(ctx context.Context, queue string) error {
	s, err := b.js.Stream(ctx, b.holdName())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err == nil {
		err = s.Purge(ctx, jetstream.WithPurgeSubject(b.cfg.Stream+".hold."+token(queue)+".*"))
	}
	if err != nil {
		return fmt.Errorf("nats: delete the dead-letter markers of queue %s: %w", queue, err)
	}
	return nil
}
