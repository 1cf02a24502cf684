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
)

// runMover moves due delayed copies from the delay stream to the work
// stream until Close. Every Backend runs one; the delay stream's work-queue
// retention and its single durable consumer give each delayed copy to one
// mover at a time.
func (b *Backend) runMover() {
	backoff := 100 * time.Millisecond
	for b.ctx.Err() == nil {
		msgs, _, err := b.fetch(b.ctx, b.delayName(), moverConsumer, DefaultMoverBatch, b.moveOne, b.moverSweep)
		if err != nil {
			if b.ctx.Err() != nil {
				return
			}
			b.log.Warn("nats: mover: pull from the delay stream", "stream", b.delayName(), "err", err)
			if errors.Is(err, errNoConsumer) {
				b.recreateMover()
			}
			_ = sleepCtx(b.ctx, backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		b.move(msgs)
	}
}

func (b *Backend) recreateMover() {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	_, delay, _ := b.streamConfigs()
	if _, err := b.ensureStream(ctx, delay); err != nil {
		b.log.Warn("nats: mover: recreate the delay stream", "err", err)
		return
	}
	if err := b.ensureMover(ctx); err != nil {
		b.log.Warn("nats: mover: recreate the mover consumer", "err", err)
	}
}

func (b *Backend) moveOne(m *gonats.Msg) { b.move([]*gonats.Msg{m}) }

// move publishes the due messages to the work stream, waits for their acks,
// then acks them; it naks the others with their remaining delay, so they
// come back to a mover when due and never before. A publish that fails is
// naked for a retry a second later; its Nats-Msg-Id makes a repeat harmless.
func (b *Backend) move(msgs []*gonats.Msg) {
	now := time.Now()
	var src []*gonats.Msg
	var futures []jetstream.PubAckFuture
	for _, m := range msgs {
		if nb, ok := notBefore(m); ok && now.Before(nb) {
			b.log.Debug("nats: mover: not due", "subject", m.Subject, "reply", m.Reply, "in", nb.Sub(now))
			b.nak(m, nb.Sub(now)+time.Millisecond)
			continue
		}
		b.log.Debug("nats: mover: due", "subject", m.Subject, "reply", m.Reply)
		f, err := b.js.PublishMsgAsync(b.workCopy(m))
		if err != nil {
			b.log.Warn("nats: mover: publish", "subject", m.Subject, "err", err)
			b.nak(m, time.Second)
			continue
		}
		src, futures = append(src, m), append(futures, f)
	}
	timeout := time.NewTimer(b.cfg.MoverAckWait / 2)
	defer timeout.Stop()
	for i, f := range futures {
		select {
		case <-f.Ok():
			_ = b.nc.Publish(src[i].Reply, ackAck)
		case err := <-f.Err():
			b.log.Warn("nats: mover: publish", "subject", src[i].Subject, "err", err)
			b.nak(src[i], time.Second)
		case <-timeout.C:
			for _, m := range src[i:] {
				b.nak(m, time.Second)
			}
			return
		}
	}
}

// workCopy is the work-stream message for a delayed copy: same body and
// headers, without the not-before header.
func (b *Backend) workCopy(m *gonats.Msg) *gonats.Msg {
	tok := strings.TrimPrefix(m.Subject, b.cfg.Stream+".delay.")
	out := &gonats.Msg{Subject: b.cfg.Stream + ".q." + tok, Data: m.Data, Header: gonats.Header{}}
	for k, v := range m.Header {
		if k != hdrNotBefore && !strings.HasPrefix(k, "Nats-") {
			out.Header[k] = v
		}
	}
	id := m.Header.Get(hdrMsgID)
	if id == "" {
		if md, err := parseAck(m.Reply); err == nil {
			id = "delayed-" + strconv.FormatUint(md.seq, 10)
		}
	}
	if id != "" {
		out.Header.Set(hdrMsgID, id)
	}
	return out
}

func notBefore(m *gonats.Msg) (time.Time, bool) {
	v := m.Header.Get(hdrNotBefore)
	if v == "" {
		return time.Time{}, false
	}
	ns, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// nak hands m back to the delay stream's consumer, to be redelivered after d.
func (b *Backend) nak(m *gonats.Msg, d time.Duration) {
	body := fmt.Appendf(nil, `-NAK {"delay": %d}`, d.Nanoseconds())
	if err := b.nc.Publish(m.Reply, body); err != nil {
		b.log.Warn("nats: mover: nak", "subject", m.Subject, "err", err)
	}
}
