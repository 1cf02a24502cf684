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
// S.claim.<queue token>.<stream sequence>.<timestamp>, published with
// Nats-Expected-Last-Subject-Sequence 0, so only the first publish of a
// subject is stored. A delivery whose claim is refused was handed out
// before: it is dropped, neither acked nor naked, so its lease runs out
// (or its live holder keeps it) and it comes back with one more delivery
// counted. A delivery whose claim fails for another reason is dropped the
// same way. The claims of a Receive are published together and waited for
// together: one round trip per Receive. Once a delivery is settled (its ack
// confirmed, so the message has left the stream and cannot be delivered
// again), its claim is deleted without waiting for the answer. A claim left
// behind (a worker killed between the two, or a server SIGKILL that
// forgets the delete) is never used again: its subject names a stream
// sequence and timestamp that no later message has.
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
// timestamp ts, on the queue whose subject token is tok.
func (b *Backend) claimSubject(tok string, seq uint64, ts string) string {
	return b.cfg.Stream + ".claim." + tok + "." + strconv.FormatUint(seq, 10) + "." + ts
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

// unclaim deletes the claim of a settled delivery, if claims were made:
// by its sequence when this delivery made it, else by subject (an earlier
// delivery made it). It does not wait: the answer goes to a subscription
// that logs failures. A claim left behind is never used again.
func (b *Backend) unclaim(subj string, seq uint64) {
	if subj == "" {
		return
	}
	inbox, err := b.claimReplies()
	if err != nil {
		b.log.Debug("nats: delete a claim", "subject", subj, "err", err)
		return
	}
	var api string
	var req []byte
	if seq > 0 {
		api = "$JS.API.STREAM.MSG.DELETE." + b.claimName()
		req, _ = json.Marshal(struct {
			Seq     uint64 `json:"seq"`
			NoErase bool   `json:"no_erase"`
		}{seq, true})
	} else {
		// A purge of one subject: on 2.9.10 a filtered purge moves the
		// stream's consumers past every message (TestFilteredPurgeFact),
		// but the claims stream has none.
		api = "$JS.API.STREAM.PURGE." + b.claimName()
		req, _ = json.Marshal(struct {
			Filter string `json:"filter"`
		}{subj})
	}
	if err := b.nc.PublishRequest(api, inbox, req); err != nil {
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
