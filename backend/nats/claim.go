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

// Claims: the workaround for a nats-server bug before 2.10.14.
//
// A pull consumer takes a message due for redelivery (a lapsed lease) from
// its redelivery queue, counting the delivery, and then looks for a pull
// request to send it to. When every request it has waiting is stale (its
// client gone, as a killed worker's long poll is until the server next
// looks, or expired), it "redoes" the message with o.sseq--, which is
// right for a new message only: the redelivery is dropped (it comes one
// AckWait later, counted twice), and the consumer's next sequence moves
// back onto the newest message it delivered. If that message is still in
// the stream, held by a live worker, the next request gets it again as a
// first delivery (NumDelivered 1): two live holders, and, if its holder
// had died, an uncounted crash (TestStaleRequestFact; nats-server PR #5305,
// in 2.10.14). No client can keep a killed worker's request off the
// server, so the backend detects the second first delivery instead.
//
// On such a server every first delivery (NumDelivered 1) is claimed before
// it is handed out: a message on the claims stream (S_CLAIM) with subject
// S.claim.<queue token>.<bucket>.<stream sequence>.<timestamp> (the
// bucket is the stream sequence / 1024), published with
// Nats-Expected-Last-Subject-Sequence 0, so only the first publish of a
// subject is stored. A delivery whose claim is refused was handed out
// before: it is dropped, neither acked nor naked, so its lease runs out
// (or its live holder keeps it) and it comes back with one more delivery
// counted. A delivery whose claim fails for another reason is dropped the
// same way. The claims of a Receive are published together and waited for
// together: one round trip per Receive. Once a delivery is settled (its ack
// confirmed, so the message has left the stream and cannot be delivered
// again), its claim is deleted, later and mostly in bulk (see unclaim),
// without waiting for the answer. A claim left
// behind (a worker killed between the two, or a server SIGKILL that
// forgets the delete) is never used again: its subject names a stream
// sequence and timestamp that no later message has.
//
// Every first delivery is claimed, not only those a duplicate could be.
// While a pull request waits valid on the server (unexpired, its inbox
// subscribed) no redelivery is redone, so once one of its first deliveries
// is claimed successfully (the claim stored) the later ones of the same
// request are new. But the claim is also the record that a later duplicate
// collides with: an unclaimed delivery handed out now would be accepted
// when a later redo hands it out again. Each redo moves the consumer back
// one stream sequence, and consecutive redos with no new delivery between
// them have no limit, so no delivery is safe to leave unclaimed while its
// message is in the stream.
//
// The claims also refuse a delivery that a SIGKILLed server forgot and
// hands out again as a first one (see the package documentation), when the
// claim outlived the kill (a stream append does; 2.9 can lose a recent
// delete, which only leaves a claim behind). Not shown by a test.

// claimsFixedIn is the first nats-server version without the bug.
var claimsFixedIn = [3]int{2, 10, 14}

// needsClaims reports whether a server version has the bug: older than
// 2.10.14, or unreadable.
func needsClaims(version string) bool {
	return olderThan(version, claimsFixedIn)
}

// casFixedIn is the first nats-server version whose replicated streams
// check Nats-Expected-Last-Subject-Sequence as part of the write
// (nats-server #4320, PR #4319; TestClusterCASFact).
var casFixedIn = [3]int{2, 9, 21}

// casUnsafe reports whether conditional publishes on a replicated stream
// of a server of this version can all succeed when concurrent: older than
// 2.9.21, or unreadable.
func casUnsafe(version string) bool {
	return olderThan(version, casFixedIn)
}

// olderThan reports whether a server version is older than fixed, or
// unreadable.
func olderThan(version string, fixed [3]int) bool {
	var v [3]int
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return true
	}
	for i, p := range parts {
		n := 0
		for n < len(p) && p[n] >= '0' && p[n] <= '9' {
			n++
		}
		x, err := strconv.Atoi(p[:n])
		if err != nil {
			return true
		}
		v[i] = x
	}
	for i := range v {
		if v[i] != fixed[i] {
			return v[i] < fixed[i]
		}
	}
	return false
}

func (b *Backend) claimName() string { return b.cfg.Stream + "_CLAIM" }

// claimSubject names the claim of the message at stream sequence seq, with
// timestamp ts, on the queue whose subject token is tok. The token after
// the queue's is the sequence's bucket (see unclaim).
func (b *Backend) claimSubject(tok string, seq uint64, ts string) string {
	return b.cfg.Stream + ".claim." + tok + "." + strconv.FormatUint(seq>>claimBucketBits, 10) + "." +
		strconv.FormatUint(seq, 10) + "." + ts
}

// claimBucketBits sets the size of a claims bucket: 1<<claimBucketBits
// stream sequences.
const claimBucketBits = 10

// parseClaim returns the queue token and bucket of a claim's subject.
func (b *Backend) parseClaim(subj string) (tok string, bucket uint64, ok bool) {
	rest, ok := strings.CutPrefix(subj, b.cfg.Stream+".claim.")
	if !ok {
		return "", 0, false
	}
	t := strings.Split(rest, ".")
	if len(t) != 4 {
		return "", 0, false
	}
	bucket, err := strconv.ParseUint(t[1], 10, 64)
	return t[0], bucket, err == nil
}

// claimStream returns the claims stream, made on first use.
func (b *Backend) claimStream(ctx context.Context) (jetstream.Stream, error) {
	b.claimMu.Lock()
	defer b.claimMu.Unlock()
	if b.claims != nil {
		return b.claims, nil
	}
	s, err := b.ensureStream(ctx, jetstream.StreamConfig{
		Name:        b.claimName(),
		Description: "asyncplatform claims of first deliveries (nats-server before 2.10.14)",
		Subjects:    []string{b.cfg.Stream + ".claim.>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     b.cfg.Storage,
		Replicas:    b.replicas,
		MaxMsgs:     -1,
		MaxBytes:    -1,
	})
	if err != nil {
		return nil, err
	}
	b.claims = s
	return s, nil
}

// claiming reports whether deliveries must be claimed: the connected server
// has the bug.
func (b *Backend) claiming() bool {
	return needsClaims(b.nc.ConnectedServerVersion())
}

// errClaimed reports a claim refused: the message was handed out before.
var errClaimed = errors.New("delivered before: claimed by an earlier delivery")

// claim claims the first deliveries among msgs, all at once, and returns
// the messages that may be handed out with the claims' subjects and
// stream sequences (0 where the delivery is not a first one: its claim,
// if any, was made by an earlier delivery). It drops the others, logging
// why. Nothing is claimed, and every message returned with no subject, on
// a server without the bug.
func (b *Backend) claim(tok string, msgs []*gonats.Msg, wait time.Duration) ([]*gonats.Msg, []string, []uint64) {
	if len(msgs) == 0 || !b.claiming() {
		return msgs, nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	subjs := make([]string, len(msgs))
	seqs := make([]uint64, len(msgs))
	errs := make([]error, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	_, serr := b.claimStream(ctx)
	for i, m := range msgs {
		md, err := parseAck(m.Reply)
		if err != nil {
			errs[i] = err
			continue
		}
		subjs[i] = b.claimSubject(tok, md.seq, md.ts)
		switch {
		case md.delivered != 1:
			continue
		case serr != nil:
			errs[i] = serr
			continue
		}
		cm := &gonats.Msg{Subject: subjs[i], Header: gonats.Header{}}
		cm.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		if futures[i], errs[i] = b.js.PublishMsgAsync(cm); errs[i] != nil {
			futures[i] = nil
		}
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case pa := <-f.Ok():
			seqs[i] = pa.Sequence
		case err := <-f.Err():
			errs[i] = err
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
				apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
				errs[i] = errClaimed
			}
		case <-ctx.Done():
			errs[i] = fmt.Errorf("waiting for the claim: %w", ctx.Err())
		}
	}
	out, outSubjs, outSeqs := msgs[:0], subjs[:0], seqs[:0]
	for i, m := range msgs {
		if errs[i] != nil {
			b.dropped(m, errs[i])
			continue
		}
		out, outSubjs, outSeqs = append(out, m), append(outSubjs, subjs[i]), append(outSeqs, seqs[i])
	}
	return out, outSubjs, outSeqs
}

// dropped logs a delivery that is not handed out because its claim failed.
// Nothing is sent for it: it comes back when its lease runs out, unless
// the holder of an earlier delivery keeps it.
func (b *Backend) dropped(m *gonats.Msg, err error) {
	if errors.Is(err, errClaimed) {
		b.log.Warn("nats: the server handed out a message again as a first delivery; not handed out (nats-server before 2.10.14, fixed in 2.10.14)",
			"subject", m.Subject, "reply", m.Reply)
		return
	}
	b.log.Warn("nats: claim a first delivery; not handed out, it comes back after its lease", "subject", m.Subject, "err", err)
}

// claimOne claims one late first delivery (see handBack): it returns the
// claim's subject and sequence, or false when m must be dropped.
func (b *Backend) claimOne(m *gonats.Msg, wait time.Duration) (string, uint64, bool) {
	tok := strings.TrimPrefix(m.Subject, b.cfg.Stream+".q.")
	out, subjs, seqs := b.claim(tok, []*gonats.Msg{m}, wait)
	switch {
	case len(out) == 0:
		return "", 0, false
	case subjs == nil:
		return "", 0, true
	}
	return subjs[0], seqs[0], true
}

// unclaim deletes the claim of a settled delivery, if claims were made,
// later and mostly in bulk: it queues the claim, and a loop (unclaimLoop)
// deletes the queued claims every claimFlushEvery, none of them waited
// for (the answers go to a subscription that logs failures). A claim left
// behind is never used again.
//
// A claim is useless once its message has left the work stream: a message
// at or below the ack floor of its queue's consumer was acked, and so is
// gone. The loop reads the floor (one consumer info a queue) and deletes
// with one filtered purge each bucket of the queue (claims of 1024 stream
// sequences, the bucket token of claimSubject) whose sequences all lie at
// or below it. When the consumer has nothing pending at all, every claim
// written before the newest one queued belongs to a settled delivery, so
// one purge of the queue's claims up to that one deletes them all. A
// claim still queued after claimKeepMax (a long-held message keeps the
// floor down), or when the Backend closes, is deleted on its own: by its
// sequence when this delivery made it, else by subject (an earlier
// delivery made it).
func (b *Backend) unclaim(subj string, seq uint64) {
	if subj == "" {
		return
	}
	tok, bucket, ok := b.parseClaim(subj)
	if !ok {
		b.deleteClaim(subj, seq)
		return
	}
	b.unclaimMu.Lock()
	if b.unclaimed == nil {
		b.unclaimed = map[string][]settledClaim{}
	}
	b.unclaimed[tok] = append(b.unclaimed[tok], settledClaim{subj: subj, seq: seq, bucket: bucket, at: time.Now()})
	start := !b.unclaiming
	b.unclaiming = true
	b.unclaimMu.Unlock()
	if start && !b.spawn(b.unclaimLoop) {
		b.unclaimMu.Lock()
		left := b.unclaimed
		b.unclaimed, b.unclaiming = nil, false
		b.unclaimMu.Unlock()
		for _, cs := range left {
			for _, c := range cs {
				b.deleteClaim(c.subj, c.seq)
			}
		}
	}
}

// settledClaim is a claim queued for deletion (see unclaim).
type settledClaim struct {
	subj   string
	seq    uint64 // its sequence in the claims stream; 0: made by an earlier delivery
	bucket uint64
	at     time.Time // when it was queued
}

const (
	// claimFlushEvery is how often queued claims are deleted.
	claimFlushEvery = 100 * time.Millisecond
	// claimKeepMax is how long a claim waits for its bucket's purge.
	claimKeepMax = 5 * time.Second
)

// unclaimLoop deletes the queued claims every claimFlushEvery until there
// are none, and all of them when the Backend closes (see unclaim).
func (b *Backend) unclaimLoop() {
	t := time.NewTicker(claimFlushEvery)
	defer t.Stop()
	for {
		closing := false
		select {
		case <-t.C:
		case <-b.ctx.Done():
			closing = true
		}
		b.unclaimMu.Lock()
		queued := b.unclaimed
		b.unclaimed = nil
		b.unclaimMu.Unlock()
		kept := map[string][]settledClaim{}
		for tok, cs := range queued {
			if cs = b.flushClaims(tok, cs, closing); len(cs) > 0 {
				kept[tok] = cs
			}
		}
		b.unclaimMu.Lock()
		for tok, cs := range b.unclaimed {
			kept[tok] = append(kept[tok], cs...)
		}
		b.unclaimed = kept
		if len(kept) == 0 || closing {
			b.unclaiming = false
			b.unclaimMu.Unlock()
			return
		}
		b.unclaimMu.Unlock()
	}
}

// flushClaims deletes the queued claims of the queue whose token is tok
// that it can (see unclaim), and returns the others. closing deletes them
// all, one by one.
func (b *Backend) flushClaims(tok string, cs []settledClaim, closing bool) []settledClaim {
	var floor uint64
	idle := false
	if !closing {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		c, err := b.work.Consumer(ctx, "w_"+tok)
		cancel()
		if err == nil {
			info := c.CachedInfo()
			floor, idle = info.AckFloor.Stream, info.NumAckPending == 0
		} else {
			b.log.Debug("nats: read a consumer's ack floor to delete claims", "consumer", "w_"+tok, "err", err)
		}
	}
	if idle {
		// Every claim made up to the newest one queued here was made for a
		// delivery that is settled now.
		var last uint64
		for _, c := range cs {
			last = max(last, c.seq)
		}
		if last > 0 {
			b.purgeClaims(b.cfg.Stream+".claim."+tok+".>", last+1)
			var rest []settledClaim
			for _, c := range cs {
				if c.seq == 0 {
					rest = append(rest, c)
				}
			}
			cs = rest
		}
	}
	purged := map[uint64]bool{}
	var kept []settledClaim
	for _, c := range cs {
		switch {
		case (c.bucket+1)<<claimBucketBits-1 <= floor:
			if !purged[c.bucket] {
				purged[c.bucket] = true
				b.purgeClaims(b.cfg.Stream+".claim."+tok+"."+strconv.FormatUint(c.bucket, 10)+".>", 0)
			}
		case closing || time.Since(c.at) > claimKeepMax:
			b.deleteClaim(c.subj, c.seq)
		default:
			kept = append(kept, c)
		}
	}
	return kept
}

// purgeClaims purges the claims on filter, below the claims stream's
// sequence below when it is not 0, without waiting for the answer. On
// 2.9.10 a filtered purge moves the stream's consumers past every message
// (TestFilteredPurgeFact), but the claims stream has none.
func (b *Backend) purgeClaims(filter string, below uint64) {
	inbox, err := b.claimReplies()
	if err != nil {
		b.log.Debug("nats: purge claims", "filter", filter, "err", err)
		return
	}
	req, _ := json.Marshal(struct {
		Filter string `json:"filter"`
		Seq    uint64 `json:"seq,omitempty"`
	}{filter, below})
	if err := b.nc.PublishRequest("$JS.API.STREAM.PURGE."+b.claimName(), inbox, req); err != nil {
		b.log.Debug("nats: purge claims", "filter", filter, "err", err)
	}
}

// deleteClaim deletes one claim without waiting: by its sequence when the
// delivery made it, else by subject (an earlier delivery made it).
func (b *Backend) deleteClaim(subj string, seq uint64) {
	if seq == 0 {
		b.purgeClaims(subj, 0)
		return
	}
	inbox, err := b.claimReplies()
	if err != nil {
		b.log.Debug("nats: delete a claim", "subject", subj, "err", err)
		return
	}
	req, _ := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NoErase bool   `json:"no_erase"`
	}{seq, true})
	if err := b.nc.PublishRequest("$JS.API.STREAM.MSG.DELETE."+b.claimName(), inbox, req); err != nil {
		b.log.Debug("nats: delete a claim", "subject", subj, "err", err)
	}
}

// claimReplies returns the inbox the answers to claim deletes go to,
// subscribed on first use.
func (b *Backend) claimReplies() (string, error) {
	b.claimMu.Lock()
	defer b.claimMu.Unlock()
	if b.claimInbox != "" {
		return b.claimInbox, nil
	}
	inbox := b.nc.NewInbox()
	if _, err := b.nc.Subscribe(inbox, func(m *gonats.Msg) {
		var resp struct {
			Error *jetstream.APIError `json:"error"`
		}
		if json.Unmarshal(m.Data, &resp) == nil && resp.Error != nil && resp.Error.ErrorCode != jetstream.JSErrCodeMessageNotFound {
			b.log.Debug("nats: delete a claim", "err", resp.Error)
		}
	}); err != nil {
		return "", err
	}
	b.claimInbox = inbox
	return inbox, nil
}

// deleteClaims deletes the queue's claims, if the claims stream exists. It
// purges: the 2.9.10 purge bug (TestFilteredPurgeFact) moves consumers, and
// the claims stream has none.
func (b *Backend) deleteClaims(ctx context.Context, queue string) error {
	s, err := b.js.Stream(ctx, b.claimName())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err == nil {
		err = s.Purge(ctx, jetstream.WithPurgeSubject(b.cfg.Stream+".claim."+token(queue)+".>"))
	}
	if err != nil {
		return fmt.Errorf("nats: delete the claims of queue %s: %w", queue, err)
	}
	return nil
}
