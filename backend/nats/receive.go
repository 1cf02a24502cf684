package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

// errNoConsumer reports a pull request to a consumer that does not exist
// (deleted by DeleteQueue in another process, or never made).
var errNoConsumer = errors.New("consumer not found")

// receipt is the Handle of a Delivery and a DeadDelivery.
//
// The server never checks which delivery an ack belongs to: an ack, a
// progress update or a nak names the stream sequence only, so after a
// redelivery the old delivery's reply subject acts on the new one (checked on
// 2.9.10 and in the 2.15 source). The backend therefore keeps each
// delivery's lease itself: deadline estimates the server's redelivery time
// from below (AckWait after the no-wait pull request was sent, or after a
// long-polled message arrived, or after the last confirmed progress update
// was sent), and nothing is sent for a delivery once less than guard is
// left, which covers a message's transit both ways.
type receipt struct {
	mu       sync.Mutex
	reply    string // the ack subject
	seq      uint64 // stream sequence
	msgID    string // the message's Nats-Msg-Id, if any
	ackWait  time.Duration
	deadline time.Time
	done     bool // settled, or its hold handed back by Close

	claimSubj string // its claim's subject, "" when claims are not made (see claim.go)
	claimSeq  uint64 // its claim's sequence, when this delivery made it

	queue   string // dead letters: the record's queue
	holdSeq uint64 // dead letters: the sequence of its hold marker (see hold.go)
}

// guard is the part of a lease in which nothing is sent any more, so that an
// ack can't reach the server after the redelivery it can't tell apart.
func guard(ackWait time.Duration) time.Duration {
	return min(ackWait/5, 2*time.Second)
}

// live reports whether the delivery may still be acted on. r.mu is held.
func (r *receipt) live() bool {
	return !r.done && time.Until(r.deadline) > guard(r.ackWait)
}

// Receive implements driver.Backend. It makes sure the queue's work
// consumer exists with AckWait = lease (updating it when another lease is
// asked; see the package documentation), then asks for up to max messages
// without waiting and, when there are none, long-polls for one and returns
// it as soon as it comes.
func (b *Backend) Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if max < 1 {
		return nil, fmt.Errorf("nats: receive from %s: max %d: want at least 1", queue, max)
	}
	if lease < 100*time.Millisecond {
		return nil, fmt.Errorf("nats: receive from %s: lease %v: want at least 100ms", queue, lease)
	}
	qs := b.queue(queue)
	for {
		ackWait, err := b.ensureWork(ctx, qs, queue, lease)
		if err != nil {
			return nil, err
		}
		ds, err := b.receive(ctx, qs, queue, max, ackWait)
		if len(ds) == 0 && err == nil {
			continue // every message was dropped (see claim.go)
		}
		if errors.Is(err, errNoConsumer) {
			b.log.Debug("nats: receive: no consumer", "queue", queue)
			qs.mu.Lock()
			qs.ackWait = 0 // make it again
			qs.mu.Unlock()
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return nil, err
			}
			continue
		}
		return ds, err
	}
}

func (b *Backend) receive(ctx context.Context, qs *queueState, queue string, max int, ackWait time.Duration) ([]*driver.Delivery, error) {
	if b.claiming() {
		// Made before anything is pulled: a claims stream that cannot be
		// made is this call's error, not a drop of every delivery.
		if _, err := b.claimStream(ctx); err != nil {
			return nil, err
		}
	}
	msgs, start, err := b.fetch(ctx, b.cfg.Stream, workConsumer(queue), max, b.handBack, qs.sweep)
	if len(msgs) > 0 {
		msgs, subjs, seqs := b.claim(token(queue), msgs, min(ackWait, claimWait))
		return deliveries(queue, msgs, subjs, seqs, start, ackWait), nil
	}
	return nil, err
}

// claimWait bounds the wait for the claims of one Receive (see claim.go).
const claimWait = 10 * time.Second

// errReconnected reports a pull left to drain because the connection
// reconnected meanwhile: pull again.
var errReconnected = errors.New("reconnected during a pull")

// errNoAnswer reports a pull that the server answered neither with a
// message nor with its end in time, left to drain: pull again.
var errNoAnswer = errors.New("no answer from the server")

// fetch returns up to max messages from a consumer, blocking until there is
// at least one, and when their leases start (see pull). It asks without
// waiting first; when nothing is ready it long-polls for one message and
// returns it as soon as it comes: what else is ready by then is the next
// call's, so the first job of a burst does not wait a round trip for the
// rest (the delay mover's first due copy after an idle spell likewise
// moves alone). A pull left to drain (a reconnect, or no answer in time)
// is sent again. Before each pull it has sw sweep the consumer if the
// connection reconnected since its last sweep.
func (b *Backend) fetch(ctx context.Context, stream, consumer string, max int, late func(*gonats.Msg), sw *sweeper) ([]*gonats.Msg, time.Time, error) {
	sw.maybe(ctx, b)
	msgs, start, err := b.pull(ctx, stream, consumer, max, 0, late)
	for len(msgs) == 0 && (err == nil || errors.Is(err, errReconnected) || errors.Is(err, errNoAnswer)) {
		sw.maybe(ctx, b)
		msgs, start, err = b.pull(ctx, stream, consumer, 1, b.cfg.PollWait, late)
	}
	if len(msgs) > 0 {
		return msgs, start, nil
	}
	if ctx.Err() != nil {
		return nil, start, ctx.Err()
	}
	return nil, start, err
}

// deliveries makes the deliveries of msgs, whose claims (none when
// claimSubjs is nil) are claimSubjs and claimSeqs.
func deliveries(queue string, msgs []*gonats.Msg, claimSubjs []string, claimSeqs []uint64, start time.Time, ackWait time.Duration) []*driver.Delivery {
	ds := make([]*driver.Delivery, 0, len(msgs))
	for i, m := range msgs {
		md, err := parseAck(m.Reply)
		if err != nil {
			continue // not a JetStream delivery; can't happen on our inbox
		}
		r := &receipt{reply: m.Reply, seq: md.seq, msgID: m.Header.Get(hdrMsgID), ackWait: ackWait, deadline: start.Add(ackWait)}
		if claimSubjs != nil {
			r.claimSubj, r.claimSeq = claimSubjs[i], claimSeqs[i]
		}
		ds = append(ds, &driver.Delivery{
			Queue:      queue,
			Body:       m.Data,
			Deliveries: int(md.delivered) + base(m),
			Handle:     r,
		})
	}
	return ds
}

// ensureWork makes sure the work consumer of queue exists with the given
// AckWait and returns it.
func (b *Backend) ensureWork(ctx context.Context, qs *queueState, queue string, lease time.Duration) (time.Duration, error) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.ackWait == lease {
		return lease, nil
	}
	c, err := b.work.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       workConsumer(queue),
		Description:   "asyncplatform queue " + queue,
		FilterSubject: b.workSubject(queue),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       lease,
		MaxDeliver:    -1,
		MaxAckPending: -1,
	})
	if err == nil {
		err = waitConsumerLeader(ctx, c)
	}
	if err != nil {
		return 0, fmt.Errorf("nats: consumer for queue %s with AckWait %v: %w", queue, lease, err)
	}
	qs.ackWait = c.CachedInfo().Config.AckWait
	if qs.ackWait != lease {
		return 0, fmt.Errorf("nats: consumer for queue %s has AckWait %v, asked %v", queue, qs.ackWait, lease)
	}
	return lease, nil
}

// pull sends one pull request for up to batch messages to a consumer and
// returns what it delivered and when their leases start. wait zero asks
// without waiting, and the start is when the request was sent: a lower
// bound of the server's delivery time. Otherwise the server holds the
// request up to wait, and the start is the first message's arrival: the
// server delivered it one transit earlier, which the guard at the end of
// every lease (see receipt) covers.
//
// A pull request cannot be withdrawn: unsubscribing its inbox stops the
// server from choosing it for new deliveries, but a message the server
// chose just before still arrives, and counts as a delivery. So when ctx
// ends first, pull returns at once and leaves the request to drain, which
// gives each message that still comes to late. On a single server without
// the stale-request bug (see claim.go), pull first drains the inbox's
// subscription: its UNSUB goes out at once, ahead of anything this process
// sends later, such as the copies the platform hands back next, which the
// server would otherwise give to this request (and a process killed while
// it hands one back charges that job a crash); the inbox keeps taking
// messages until a flush comes back. Before 2.10.14 an unsubscribed request
// is a stale one, which makes the server drop a lapsed lease's redelivery
// and count it twice, so the request keeps its inbox until it ends. When
// the Backend closes, the request is abandoned instead, which is the crash
// that Close stands for.
//
// The server ends every request by wait plus 5s (an expiry or a no-wait's
// end). When it has not (a loaded 2.9.10 now and then did not: the
// Delivery/WakesOnEnqueue flake), the request may still be alive there and
// answer late: pull leaves it to a drain like a reconnect's, inbox kept,
// for wait plus 5s more, hands back what still comes, and returns
// errNoAnswer (with the messages it had, if any, instead). Only a message
// the server sends it after that goes to nobody and comes back after its
// AckWait, counted, as before. On the dead-letter stream the request is
// abandoned at once, as before: NextDead looks for stranded records then
// and pulls again without waiting, which a kept request ahead of it would
// beat to a record.
func (b *Backend) pull(ctx context.Context, stream, consumer string, batch int, wait time.Duration, late func(*gonats.Msg)) ([]*gonats.Msg, time.Time, error) {
	ch := make(chan *gonats.Msg, batch+8)
	inbox := b.nc.NewInbox()
	sub, err := b.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("nats: subscribe: %w", err)
	}
	req := pullRequest{Batch: batch, NoWait: wait == 0}
	if wait > 0 {
		req.Expires = wait
	}
	data, _ := json.Marshal(req)
	start := time.Now()
	if err := b.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+stream+"."+consumer, inbox, data); err != nil {
		_ = sub.Unsubscribe()
		return nil, start, fmt.Errorf("nats: pull from %s: %w", consumer, err)
	}
	reconnected := b.reconnects()
	end := start.Add(wait + 5*time.Second) // the server ends the request by then
	timer := time.NewTimer(time.Until(end))
	defer timer.Stop()
	var msgs []*gonats.Msg
	for {
		select {
		case m := <-ch:
			done, err := b.take(&msgs, m)
			if wait > 0 && len(msgs) > 0 {
				// A long poll's message was delivered at some time after
				// the request: count its lease from its arrival.
				start = time.Now()
			}
			if done || len(msgs) == batch {
				_ = sub.Unsubscribe()
				return msgs, start, err
			}
		case <-ctx.Done():
			left := batch - len(msgs)
			// Not in a cluster: there the consumer's leader may be another
			// server, which can still send over a route after the flush
			// (Delivery/CancelledReceiveUncounted failed so on 2.15.2).
			unsub := !b.claiming() && b.nc.ConnectedClusterName() == ""
			if unsub {
				_ = sub.Drain()
			}
			if !b.spawn(func() { b.drain(sub, ch, left, end, late, stream == b.cfg.Stream, unsub) }) {
				return b.abandon(sub, ch, msgs, start, wait > 0, driver.ErrClosed)
			}
			if len(msgs) > 0 {
				return msgs, start, nil
			}
			return nil, start, ctx.Err()
		case <-reconnected:
			// The request may have died with the server the connection
			// left (a cluster node): send a new one, and leave this one,
			// which may live on at its consumer's leader, to drain (its
			// inbox kept).
			left := batch - len(msgs)
			if len(msgs) > 0 || !b.spawn(func() { b.drain(sub, ch, left, end, late, stream == b.cfg.Stream, false) }) {
				reconnected = nil // finish this request as before
				continue
			}
			return nil, start, errReconnected
		case <-b.ctx.Done():
			return b.abandon(sub, ch, msgs, start, wait > 0, driver.ErrClosed)
		case <-timer.C:
			left := batch - len(msgs)
			until := time.Now().Add(wait + 5*time.Second)
			noAnswer := fmt.Errorf("nats: pull from %s: %w", consumer, errNoAnswer)
			if stream == b.deadName() || !b.spawn(func() { b.drain(sub, ch, left, until, late, stream == b.cfg.Stream, false) }) {
				return b.abandon(sub, ch, msgs, start, wait > 0, noAnswer)
			}
			b.log.Warn("nats: pull: no answer from the server in time; left to drain, pulling again", "consumer", consumer, "wait", wait)
			if len(msgs) > 0 {
				return msgs, start, nil
			}
			return nil, start, noAnswer
		}
	}
}

// drain hands each message that still arrives for a pull request whose
// caller left to late. When its subscription is draining (unsub), a flush
// that comes back means the server has seen the UNSUB, so it passes the
// request by, and every message it sent before is in ch: drain ends there,
// within a round trip. (In a cluster, a consumer led by another server can
// still send one over a route after that, which is lost and comes back
// counted.) Otherwise, or when the flush fails (the connection is down),
// it waits for the request's end, or until the left messages it may still
// carry have come. On the work stream it keeps waiting when the Backend
// closes (Close waits for it: PollWait at most, unless the server is
// unreachable, then 5s more, or PollWait plus 5s for a request the server
// left unanswered), so that the usual shutdown, the platform's
// Stop and then Close, counts no crash; elsewhere it abandons the request
// at Close.
func (b *Backend) drain(sub *gonats.Subscription, ch chan *gonats.Msg, left int, end time.Time, late func(*gonats.Msg), work, unsub bool) {
	if unsub && b.nc.FlushTimeout(time.Until(end)) == nil {
		var msgs []*gonats.Msg
		for collecting := true; collecting; {
			select {
			case m := <-ch:
				_, _ = b.take(&msgs, m)
			default:
				collecting = false
			}
		}
		_ = sub.Unsubscribe()
		for _, m := range msgs {
			late(m)
		}
		return
	}
	timer := time.NewTimer(time.Until(end))
	defer timer.Stop()
	closing := b.ctx.Done()
	if work {
		closing = nil
	}
	for {
		var msgs []*gonats.Msg
		var done bool
		select {
		case m := <-ch:
			done, _ = b.take(&msgs, m)
		case <-timer.C:
			done = true
		case <-closing:
			msgs, _, _ = b.abandon(sub, ch, nil, time.Time{}, false, nil)
			done = true
		}
		for _, m := range msgs {
			late(m)
		}
		left -= len(msgs)
		if done || left <= 0 {
			_ = sub.Unsubscribe()
			return
		}
	}
}

// spawn runs fn in a goroutine that Close waits for, unless the Backend is
// closing.
func (b *Backend) spawn(fn func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		fn()
	}()
	return true
}

// base is the number of deliveries of the message's copy counted before
// the message was written: zero but for a hand-back.
func base(m *gonats.Msg) int {
	n, err := strconv.Atoi(m.Header.Get(hdrBase))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// handBack returns a work message that reached no caller to its queue
// without counting that delivery: a new copy is published, carrying as its
// base the deliveries before this one (which may have been crashes), then
// the delivery is acked.
func (b *Backend) handBack(m *gonats.Msg) {
	b.log.Debug("nats: hand back", "subject", m.Subject, "reply", m.Reply)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	md, err := parseAck(m.Reply)
	if err != nil {
		return
	}
	// A first delivery may be a second one of a message a live worker
	// holds: claim it like any other (see claim.go).
	claimSubj, claimSeq, ok := b.claimOne(m, 5*time.Second)
	if !ok {
		return
	}
	cp := &gonats.Msg{Subject: m.Subject, Data: m.Data, Header: gonats.Header{}}
	for k, v := range m.Header {
		if !strings.HasPrefix(k, "Nats-") {
			cp.Header[k] = v
		}
	}
	cp.Header.Set(hdrMsgID, m.Header.Get(hdrMsgID)+"~"+strconv.FormatUint(md.seq, 10))
	if n := base(m) + int(md.delivered) - 1; n > 0 {
		cp.Header.Set(hdrBase, strconv.Itoa(n))
	}
	if _, err := b.js.PublishMsg(ctx, cp); err != nil {
		b.log.Warn("nats: hand back a late delivery; it comes back after its lease", "subject", m.Subject, "err", err)
		return
	}
	if _, err := b.nc.RequestWithContext(ctx, m.Reply, ackAck); err != nil {
		b.log.Warn("nats: ack a handed-back delivery; it may come twice", "subject", m.Subject, "err", err)
		return
	}
	b.unclaim(claimSubj, claimSeq)
}

type pullRequest struct {
	Batch   int           `json:"batch"`
	Expires time.Duration `json:"expires,omitempty"`
	NoWait  bool          `json:"no_wait,omitempty"`
}

// take adds m to msgs when it is a message; for a status it reports whether
// the request is over, and its error when it is not an ordinary end.
func (b *Backend) take(msgs *[]*gonats.Msg, m *gonats.Msg) (bool, error) {
	status := ""
	if len(m.Data) == 0 && m.Header != nil {
		status = m.Header.Get("Status")
	}
	switch status {
	case "":
		*msgs = append(*msgs, m)
		return false, nil
	case "100": // heartbeat or flow control
		return false, nil
	case "404", "408": // no messages, request expired
		return true, nil
	case "503":
		return true, errNoConsumer
	case "409":
		desc := m.Header.Get("Description")
		if strings.Contains(strings.ToLower(desc), "deleted") {
			return true, errNoConsumer
		}
		return true, fmt.Errorf("nats: pull: %s", desc)
	default:
		return true, fmt.Errorf("nats: pull: status %s %s", status, m.Header.Get("Description"))
	}
}

// abandon ends a pull early: unsubscribe, flush so that every message the
// server sent before it saw the unsubscribe has arrived, then collect those.
func (b *Backend) abandon(sub *gonats.Subscription, ch chan *gonats.Msg, msgs []*gonats.Msg, start time.Time, long bool, cause error) ([]*gonats.Msg, time.Time, error) {
	_ = sub.Unsubscribe()
	_ = b.nc.FlushTimeout(2 * time.Second)
	for {
		select {
		case m := <-ch:
			_, _ = b.take(&msgs, m)
			if long && len(msgs) > 0 {
				start = time.Now()
			}
		default:
			if len(msgs) > 0 {
				return msgs, start, nil
			}
			return nil, start, cause
		}
	}
}

// ackMeta is what a JetStream ack subject tells.
type ackMeta struct {
	delivered uint64
	seq       uint64
	ts        string // the message's timestamp, unix nanoseconds
}

// parseAck reads $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
// and the newer form with a domain and account hash after $JS.ACK.
func parseAck(reply string) (ackMeta, error) {
	t := strings.Split(reply, ".")
	if len(t) < 9 || t[0] != "$JS" || t[1] != "ACK" {
		return ackMeta{}, fmt.Errorf("nats: %q is not a JetStream ack subject", reply)
	}
	i := 4 // old form: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...
	if len(t) > 9 {
		i = 6 // new form: $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>...
		if len(t) < 11 {
			return ackMeta{}, fmt.Errorf("nats: %q is not a JetStream ack subject", reply)
		}
	}
	dc, err1 := strconv.ParseUint(t[i], 10, 64)
	seq, err2 := strconv.ParseUint(t[i+1], 10, 64)
	if err1 != nil || err2 != nil {
		return ackMeta{}, fmt.Errorf("nats: %q: bad ack subject numbers", reply)
	}
	return ackMeta{delivered: dc, seq: seq, ts: t[i+3]}, nil
}

func handle(h any) (*receipt, error) {
	r, ok := h.(*receipt)
	if !ok || r == nil {
		return nil, fmt.Errorf("nats: delivery handle %T is not from this backend", h)
	}
	return r, nil
}

// ackSync sends an ack-protocol body to the delivery and waits for the
// server's confirmation. It refuses when the lease is (nearly) over.
func (b *Backend) ackSync(ctx context.Context, r *receipt, body []byte) error {
	if !r.live() {
		return driver.ErrLeaseLost
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if _, err := b.nc.RequestWithContext(ctx, r.reply, body); err != nil {
		return fmt.Errorf("nats: %s seq %d: %w", strings.Fields(string(body))[0], r.seq, err)
	}
	return nil
}

var (
	ackAck      = []byte("+ACK")
	ackProgress = []byte("+WPI")
	ackNak      = []byte("-NAK")
)

// Ack implements driver.Backend with a double ack (the server confirms).
func (b *Backend) Ack(ctx context.Context, d *driver.Delivery) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	r, err := handle(d.Handle)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := b.ackSync(ctx, r, ackAck); err != nil {
		return err
	}
	r.done = true
	b.unclaim(r.claimSubj, r.claimSeq)
	return nil
}

// Extend implements driver.Backend with InProgress (+WPI), sent as a
// request so that the server confirms it. JetStream restarts the AckWait
// the consumer was made with; a lease longer than that is capped to it, so
// the caller must extend at least every AckWait (the platform does every
// lease/3).
func (b *Backend) Extend(ctx context.Context, d *driver.Delivery, lease time.Duration) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	r, err := handle(d.Handle)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return b.extend(ctx, r)
}

// extend renews r's lease. r.mu is held.
func (b *Backend) extend(ctx context.Context, r *receipt) error {
	sent := time.Now()
	if err := b.ackSync(ctx, r, ackProgress); err != nil {
		return err
	}
	if time.Now().After(r.deadline) {
		// Confirmed too late to know it reached our delivery.
		r.done = true
		return driver.ErrLeaseLost
	}
	r.deadline = sent.Add(r.ackWait)
	return nil
}

// Requeue implements driver.Backend: publish the new copy (to the delay
// stream when msg.NotBefore is ahead), wait for its ack, then ack the
// delivery. A lease lost in between leaves a duplicate, never a loss.
func (b *Backend) Requeue(ctx context.Context, d *driver.Delivery, msg driver.Message) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	r, err := handle(d.Handle)
	if err != nil {
		return err
	}
	m, err := b.newMsg(d.Queue, &msg)
	if err != nil {
		return err
	}
	return b.replace(ctx, r, m)
}

// DeadLetter implements driver.Backend: publish the record to the dead
// stream, wait for its ack, then ack the delivery. The record's Nats-Msg-Id
// is derived from the delivered message's own ID and stream sequence, so a
// retried DeadLetter of the same message is stored once.
func (b *Backend) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	r, err := handle(d.Handle)
	if err != nil {
		return err
	}
	if len(rec.ID) > MaxIDLen {
		return fmt.Errorf("nats: dead letter ID of %d bytes, limit %d", len(rec.ID), MaxIDLen)
	}
	m := &gonats.Msg{Subject: b.deadSubject(d.Queue), Data: rec.Body, Header: gonats.Header{}}
	m.Header.Set(hdrDeadID, rec.ID)
	m.Header.Set(hdrMsgID, "dead/"+r.msgID+"/"+strconv.FormatUint(r.seq, 10))
	return b.replace(ctx, r, m)
}

func (b *Backend) replace(ctx context.Context, r *receipt, m *gonats.Msg) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.live() {
		return driver.ErrLeaseLost
	}
	if err := b.publish(ctx, []*gonats.Msg{m}); err != nil {
		return err
	}
	if err := b.ackSync(ctx, r, ackAck); err != nil {
		return err
	}
	r.done = true
	b.unclaim(r.claimSubj, r.claimSeq)
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
