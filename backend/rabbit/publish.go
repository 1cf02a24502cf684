package rabbit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// publisher is the confirm-mode channel that every publish of one
// connection goes through. Returns (mandatory publishes nobody took) are
// buffered by the client in the returns channel before the confirm of the
// same publish is dispatched, so a publisher that sees its confirm can drain
// the buffer and know whether its message came back.
type publisher struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan struct{} // closed once the channel is closed

	mu       sync.Mutex
	returned map[returnKey]returns // the publishes that came back, not yet matched
	users    int                   // publishes under way on ch (see use)
	retired  bool                  // no new publish takes it; ch closes when users is 0
}

// use counts one more publish under way on p, unless p is retired.
func (p *publisher) use() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.retired {
		return false
	}
	p.users++
	return true
}

// done ends a use. The last use of a retired publisher closes its channel.
func (p *publisher) done() {
	p.mu.Lock()
	p.users--
	last := p.retired && p.users == 0
	p.mu.Unlock()
	if last {
		p.ch.Close()
	}
}

// retire keeps new publishes off p and closes its channel once the
// publishes under way on it have their confirms. Closing it at once would
// resolve their confirms as not acked, and publishFor would send them again
// although the broker may have stored them already: two copies of a job.
func (p *publisher) retire() {
	p.mu.Lock()
	p.retired = true
	idle := p.users == 0
	p.mu.Unlock()
	if idle {
		p.ch.Close()
	}
}

// returnBuffer must hold every return that arrives between two drains; the
// publisher also drains it once a second, so it never fills in practice, and
// a full buffer only stalls the connection's reader until the next drain.
const returnBuffer = 1024

// publisher returns the live publisher, opening it when needed, counted as
// in use (see publisher.use): call done once the publishes made on it have
// their confirms.
func (b *Backend) publisher(ctx context.Context) (*publisher, error) {
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	b.mu.Lock()
	p := b.pub
	b.mu.Unlock()
	if p != nil && !p.ch.IsClosed() && p.use() {
		return p, nil
	}
	conn, err := b.connection(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbit: open publishing channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("rabbit: enable publisher confirms: %w", err)
	}
	p = &publisher{
		ch:       ch,
		returns:  ch.NotifyReturn(make(chan amqp.Return, returnBuffer)),
		closed:   make(chan struct{}),
		returned: map[returnKey]returns{},
		users:    1,
	}
	closeCh := ch.NotifyClose(make(chan *amqp.Error, 1))
	b.wg.Add(1)
	go p.watch(b, closeCh)
	b.mu.Lock()
	if b.conn == conn {
		b.pub = p
	}
	b.mu.Unlock()
	return p, nil
}

// watch drains the publisher's returns once a second until its channel
// closes.
func (p *publisher) watch(b *Backend, closeCh <-chan *amqp.Error) {
	defer b.wg.Done()
	defer close(p.closed)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case err, ok := <-closeCh:
			if ok && err != nil {
				b.log.Debug("publishing channel closed", "err", err)
			}
			return
		case <-t.C:
			p.mu.Lock()
			p.drainLocked()
			for k, r := range p.returned {
				if time.Since(r.at) > time.Minute {
					delete(p.returned, k)
				}
			}
			p.mu.Unlock()
		}
	}
}

func (p *publisher) drainLocked() {
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				return
			}
			k := returnKey{queue: r.RoutingKey, id: r.MessageId, inst: instanceOf(r.Headers)}
			p.returned[k] = returns{n: p.returned[k].n + 1, at: time.Now()}
		default:
			return
		}
	}
}

// returnKey names a publish that came back: its queue, message ID and
// instance (see instanceHeader; empty for a publish without one). A
// return is matched to the publish it names, not to another of the same
// message ID: two publishes of one job at once, one to a queue that is
// gone, must not take each other's return (the unroutable one would be
// reported stored, and the message it replaces acked: a lost job).
type returnKey struct{ queue, id, inst string }

// returns counts the returns of one returnKey not yet matched.
type returns struct {
	n  int
	at time.Time // the last one's arrival
}

// wasReturned reports whether the broker returned the publish m, and
// matches one return of its key. Call it only after m was confirmed.
func (p *publisher) wasReturned(m outMsg) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drainLocked()
	k := returnKey{queue: m.key, id: m.pub.MessageId, inst: instanceOf(m.pub.Headers)}
	r, ok := p.returned[k]
	switch {
	case !ok:
		return false
	case r.n > 1:
		r.n--
		p.returned[k] = r
	default:
		delete(p.returned, k)
	}
	return true
}

// outMsg is one publish to the default exchange.
type outMsg struct {
	key string // broker queue name
	pub amqp.Publishing
}

// waitUnblocked returns at once unless the broker blocks the connection,
// and then waits for the block to lift, for at most Config.BlockedTimeout.
func (b *Backend) waitUnblocked(ctx context.Context) error {
	b.mu.Lock()
	bs := b.blocked
	b.mu.Unlock()
	if bs == nil {
		return nil
	}
	t := time.NewTimer(b.cfg.BlockedTimeout)
	defer t.Stop()
	select {
	case <-bs.lifted:
		return nil
	case <-t.C:
		return fmt.Errorf("%w for more than %v: %s", ErrBlocked, b.cfg.BlockedTimeout, bs.reason)
	case <-ctx.Done():
		return fmt.Errorf("%w: %s: %w", ErrBlocked, bs.reason, ctx.Err())
	}
}

// publish stores msgs durably: it publishes them with mandatory set, waits
// for every confirm, and publishes again, with the same message IDs, those
// whose channel closed before they were confirmed. It gives up after
// Config.PublishTimeout, when ctx ends, or when the broker keeps the
// connection blocked for Config.BlockedTimeout.
func (b *Backend) publish(ctx context.Context, msgs ...outMsg) error {
	return b.publishFor(ctx, nil, msgs...)
}

// publishFor is publish on behalf of a delivery: before it publishes again
// after a lost channel, it checks that the delivery is still held (held
// returns nil), since a lost delivery comes back by itself and another copy
// would only be a duplicate. Worse than a duplicate: the first publish,
// whose confirm the connection took with it, may be stored, and a second
// one under the same instance is a second message with the same counters,
// so a crash of one is not counted by the other (RandomFaults' wrong
// tries, TestLostConfirmNotSentTwice). Every replacement (Requeue,
// DeadLetter, a hand-back, a delay hop or sweep) passes held.
func (b *Backend) publishFor(ctx context.Context, held func() error, msgs ...outMsg) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()
	pending := msgs
	nacks := 0
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt > 0 {
			if held != nil {
				if err := held(); err != nil {
					return err
				}
			}
			b.log.Debug("publishing again after a lost channel", "messages", len(pending), "attempt", attempt)
			if f := b.traceResend.Load(); f != nil {
				for _, m := range pending {
					(*f)(m, attempt)
				}
			}
		}
		if err := ctx.Err(); err != nil {
			// Not sent: a confirm that came before the wait looked at ctx
			// would otherwise make a publish under an ended ctx succeed
			// now and then (TestFailedRequeueHandsBack).
			return fmt.Errorf("rabbit: publish: %w", err)
		}
		if err := b.waitUnblocked(ctx); err != nil {
			return err
		}
		p, err := b.publisher(ctx)
		if err != nil {
			return err
		}
		retry, nacked, failed, err := b.publishOn(ctx, p, pending)
		p.done()
		if err != nil {
			return err
		}
		if len(nacked) > 0 && failed == nil && nacks < maxNackRetries {
			// A quorum queue nacks now and then, as one just declared did
			// here (RejectStorm): try again shortly, on a new channel. A
			// channel whose first publish to a quorum queue came while the
			// queue elected a leader (its node had just died) went on
			// nacking every publish to it until that node came back
			// (TestCluster/NodeKill); a new channel registers anew.
			b.dropPublisher(p)
			nacks++
			b.log.Debug("publish nacked; trying again", "messages", len(nacked), "retry", nacks)
			t := time.NewTimer(nackBackoff << (nacks - 1))
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("rabbit: publish to %q: %w: %w", nacked[0].key, ErrNacked, ctx.Err())
			case <-t.C:
			}
			retry = append(retry, nacked...)
			nacked = nil
		}
		for _, m := range nacked {
			failed = errors.Join(failed, fmt.Errorf("%w: queue %q", ErrNacked, m.key))
		}
		if failed != nil {
			return failed
		}
		pending = retry
	}
	return nil
}

// publishOn publishes msgs on p and waits for their confirms. It returns
// those to send again on another channel (p closed before they were
// confirmed), those nacked, and the returned ones as failed.
func (b *Backend) publishOn(ctx context.Context, p *publisher, msgs []outMsg) (retry, nacked []outMsg, failed, err error) {
	type inflight struct {
		m  outMsg
		dc *amqp.DeferredConfirmation
	}
	fl := make([]inflight, 0, len(msgs))
	for i, m := range msgs {
		dc, err := p.ch.PublishWithDeferredConfirm("", m.key, true, false, m.pub)
		if err != nil {
			if p.ch.IsClosed() {
				retry = append(retry, msgs[i:]...)
				break
			}
			return nil, nil, nil, fmt.Errorf("rabbit: publish to %q: %w", m.key, err)
		}
		fl = append(fl, inflight{m, dc})
	}
	for _, f := range fl {
		if err := b.waitConfirm(ctx, f.dc); err != nil {
			return nil, nil, nil, fmt.Errorf("rabbit: publish to %q: %w", f.m.key, err)
		}
		switch {
		case f.dc.Acked():
			if p.wasReturned(f.m) {
				b.forget(f.m.key)
				failed = errors.Join(failed, fmt.Errorf("%w: no queue %q", ErrUnroutable, f.m.key))
			}
		case p.ch.IsClosed():
			retry = append(retry, f.m)
		default:
			nacked = append(nacked, f.m)
		}
	}
	return retry, nacked, failed, nil
}

// dropPublisher makes the next publish open a new publisher and retires p:
// it closes once the publishes under way on it have their confirms.
func (b *Backend) dropPublisher(p *publisher) {
	b.mu.Lock()
	if b.pub == p {
		b.pub = nil
	}
	b.mu.Unlock()
	p.retire()
}

// A nacked publish is tried again up to maxNackRetries times, after
// nackBackoff, then twice that, and so on.
const (
	maxNackRetries = 3
	nackBackoff    = 25 * time.Millisecond
)

// waitConfirm waits for one confirm (or the channel's close), failing with
// ErrBlocked when the broker blocks the connection for longer than
// Config.BlockedTimeout meanwhile.
func (b *Backend) waitConfirm(ctx context.Context, dc *amqp.DeferredConfirmation) error {
	for {
		b.mu.Lock()
		sig, bs := b.blockSig, b.blocked
		b.mu.Unlock()
		if bs == nil {
			select {
			case <-dc.Done():
				return nil
			case <-ctx.Done():
				return fmt.Errorf("waiting for the confirm: %w", ctx.Err())
			case <-sig:
				continue // blocked: wait with a bound
			}
		}
		t := time.NewTimer(b.cfg.BlockedTimeout - time.Since(bs.since))
		select {
		case <-dc.Done():
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %s: %w", ErrBlocked, bs.reason, ctx.Err())
		case <-bs.lifted:
			t.Stop()
		case <-t.C:
			return fmt.Errorf("%w for more than %v: %s", ErrBlocked, b.cfg.BlockedTimeout, bs.reason)
		}
	}
}

// forget drops a broker queue from the set this backend declared, so the
// next use declares it again.
func (b *Backend) forget(name string) {
	b.mu.Lock()
	delete(b.declared, name)
	clear(b.known)
	b.mu.Unlock()
}
