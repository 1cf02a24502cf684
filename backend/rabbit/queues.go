package rabbit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.QueueLister = (*Backend)(nil)

// AMQP 0-9-1 cannot list a broker's queues (the management plugin's HTTP
// API can, but it is not always there), so the backend keeps a registry: a
// durable quorum queue, <prefix>:registry, replicated like the work queues,
// holding one message per Declare of a queue by a Backend (the message's
// body is the queue's name). Queues reads it whole and compacts it. No
// broker queue of a facade queue can have that name: theirs start with
// "<prefix>." and a queue name has no ':'.
func (b *Backend) registryName() string { return b.cfg.Prefix + ":registry" }

// legacyRegistryName is the registry of the older layout, a classic queue
// on one node, which Queues empties into registryName.
func (b *Backend) legacyRegistryName() string { return b.cfg.Prefix + ":queues" }

// registryArgs declares the registry: a quorum queue, so that Queues works
// while a minority of a cluster's nodes is down.
func registryArgs() amqp.Table { return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum} }

// listLockName is an exclusive queue that one Queues call at a time holds,
// so that no call reads the registry while another holds its messages. An
// exclusive queue is deleted with its connection: a lister that dies
// releases the lock.
func (b *Backend) listLockName() string { return b.cfg.Prefix + ":queues-lock" }

// registryCompactAt is the registry's size at which a Declare compacts it
// (with a Queues call), so that many short-lived producers, each declaring
// its queue once, do not grow it without bound when nobody lists queues.
var registryCompactAt atomic.Int64

func init() { registryCompactAt.Store(1000) }

// register adds queue to the registry: Declare calls it once the queue's
// broker queues exist, and fails when it fails, so that a queue is never
// declared and not listed (ResumeGroup finds a priority level's held queue
// by the listing). The entry's publish is bounded by ctx and
// Config.PublishTimeout. It then compacts the registry when it has grown to
// registryCompactAt messages; a compaction that fails is logged (the entry
// is written, and a later Declare compacts again).
func (b *Backend) register(ctx context.Context, queue string) error {
	if err := b.ensure(ctx, b.registryName(), registryArgs()); err != nil {
		return err
	}
	if err := b.publish(ctx, registryEntry(b.registryName(), queue)); err != nil {
		return err
	}
	var size int
	err := b.withChannel(ctx, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(b.registryName(), true, false, false, false, registryArgs())
		size = q.Messages
		return err
	})
	if err == nil && int64(size) >= registryCompactAt.Load() {
		cctx, cancel := context.WithTimeout(ctx, compactTimeout)
		_, err = b.Queues(cctx)
		cancel()
	}
	if err != nil {
		b.log.Warn("the registry of queues was not compacted", "queue", queue, "err", err)
	}
	return nil
}

// compactTimeout bounds the compaction a Declare makes (a compaction
// probes and republishes every live name: on a broker shared by many
// queues it took long enough to use up the context of the Enqueue that
// declared the queue). A compaction cut short leaves duplicates, never a
// loss; a later Declare compacts again.
const compactTimeout = 10 * time.Second

// registryEntry is the publish that registers queue in the registry key.
func registryEntry(key, queue string) outMsg {
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	return outMsg{key: key, pub: amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    "queue/" + queue + "/" + hex.EncodeToString(id),
		ContentType:  "text/plain",
		Body:         []byte(queue),
	}}
}

// listMu makes the Queues calls of this process take turns: the exclusive
// lock queue does not keep two channels of one connection apart.
var listMu sync.Mutex

// Queues implements driver.QueueLister: every queue in the registry whose
// work queue exists. It takes the lock queue (waiting while another
// process's Queues holds it), takes every registry message without acking
// it, and the messages of the older layout's registry when it exists, checks
// each name's work queue with a passive declare, publishes one new message
// per live name (with confirms), and only then acks every message it took:
// the duplicates, the names of deleted queues and garbage are so dropped,
// and a crash in between leaves duplicates, never a loss. The acks are one
// multiple ack per registry, a single settle, which RabbitMQ 3.10 cannot
// hold back and drop at the channel's close (see settleBarrier), and the
// new messages are in the queue before the lock is let go, where a requeue
// might still be on its way. A queue declared by a version before the
// registry is listed once a Backend declares it again (any worker's Start
// or producer's first Enqueue does). It costs a round trip per queue.
func (b *Backend) Queues(ctx context.Context) ([]string, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	listMu.Lock()
	defer listMu.Unlock()
	conn, err := b.connection(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := lockQueue(ctx, conn, b.listLockName())
	if err != nil {
		return nil, fmt.Errorf("rabbit: list queues: %w", err)
	}
	defer func() {
		if err := unlockQueue(conn, ch, b.listLockName()); err != nil {
			b.log.Warn("the queue listing lock stays held until the connection closes", "err", err)
		}
	}()
	if err := declareQueue(ch, b.registryName(), registryArgs()); err != nil {
		return nil, err
	}
	entries, last, err := takeRegistry(ctx, ch, b.registryName())
	if err != nil {
		return nil, fmt.Errorf("rabbit: list queues: read %q: %w", b.registryName(), err)
	}
	// The older layout's classic registry, on a channel of its own (a
	// missing queue closes it). While its node is down it is skipped, and
	// its names are listed once it is back.
	legacy, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbit: open channel: %w", err)
	}
	defer func() { legacy.Close() }()
	var legacyLast uint64
	if _, err := legacy.QueueDeclarePassive(b.legacyRegistryName(), true, false, false, false, nil); err == nil {
		old, l, err := getAll(legacy, b.legacyRegistryName())
		if err != nil {
			return nil, fmt.Errorf("rabbit: list queues: read %q: %w", b.legacyRegistryName(), err)
		}
		entries, legacyLast = append(entries, old...), l
	} else if !isNotFound(err) {
		b.log.Warn("the older registry could not be read; its names are moved once it can", "queue", b.legacyRegistryName(), "err", err)
	}
	// Which names are live: checked on a channel of their own, which a
	// missing queue closes (inspect opens the next).
	live := map[string]bool{}
	probe, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbit: open channel: %w", err)
	}
	defer func() { probe.Close() }()
	for _, name := range entries {
		if _, seen := live[name]; seen || driver.CheckQueue(name) != nil {
			continue
		}
		_, ok, err := b.inspect(ctx, &probe, b.workName(name))
		if err != nil {
			return nil, err
		}
		live[name] = ok
	}
	var names []string
	var out []outMsg
	for name, ok := range live {
		if ok {
			names = append(names, name)
			out = append(out, registryEntry(b.registryName(), name))
		}
	}
	if len(out) > 0 {
		if err := b.publish(ctx, out...); err != nil {
			return nil, fmt.Errorf("rabbit: list queues: write %q: %w", b.registryName(), err)
		}
	}
	if last > 0 {
		if err := ch.Ack(last, true); err != nil {
			return nil, fmt.Errorf("rabbit: list queues: compact %q: %w", b.registryName(), err)
		}
	}
	if legacyLast > 0 {
		if err := legacy.Ack(legacyLast, true); err != nil {
			return nil, fmt.Errorf("rabbit: list queues: empty %q: %w", b.legacyRegistryName(), err)
		}
	}
	sort.Strings(names)
	return names, nil
}

// takeRegistry takes every message of the quorum queue name on ch without
// acking them: through a consumer whose prefetch is the count the broker
// reports (a basic.get on a quorum queue is a Raft command each), then
// with basic.get until the queue is empty. It returns their bodies and the
// last delivery tag.
func takeRegistry(ctx context.Context, ch *amqp.Channel, name string) ([]string, uint64, error) {
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, registryArgs())
	if err != nil {
		return nil, 0, err
	}
	var bodies []string
	var last uint64
	if n := min(q.Messages, 65535); n > 0 {
		if err := ch.Qos(n, 0, false); err != nil {
			return nil, 0, err
		}
		tag := fmt.Sprintf("asyncplatform-registry-%d", consumerSeq.Add(1))
		dl, err := ch.Consume(name, tag, false, false, false, false, nil)
		if err != nil {
			return nil, 0, err
		}
		t := time.NewTimer(quietRound)
		defer t.Stop()
	collect:
		for quiet := 0; quiet < 2 && len(bodies) < n; {
			select {
			case d, ok := <-dl:
				if !ok {
					break collect
				}
				bodies, last = append(bodies, string(d.Body)), d.DeliveryTag
				quiet = 0
			case <-t.C:
				quiet++
				t.Reset(quietRound)
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			}
		}
		if err := ch.Cancel(tag, false); err != nil {
			return nil, 0, err
		}
		for d := range dl {
			bodies, last = append(bodies, string(d.Body)), d.DeliveryTag
		}
	}
	more, l, err := getAll(ch, name)
	if err != nil {
		return nil, 0, err
	}
	if l > 0 {
		last = l
	}
	return append(bodies, more...), last, nil
}

// getAll takes every message of queue name on ch with basic.get, without
// acking them, and returns their bodies and the last delivery tag.
func getAll(ch *amqp.Channel, name string) ([]string, uint64, error) {
	var bodies []string
	var last uint64
	for {
		d, ok, err := ch.Get(name, false)
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			return bodies, last, nil
		}
		bodies, last = append(bodies, string(d.Body)), d.DeliveryTag
	}
}

// isNotFound reports whether err is the broker's 404: no such queue.
func isNotFound(err error) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.NotFound
}

// lockQueue returns a channel of conn on which this call holds the lock
// queue name, an exclusive queue, waiting (a few tens of milliseconds at a
// time) while another connection holds it. An exclusive queue keeps
// connections apart, not two channels of one connection: callers of one
// Backend take turns first. The broker deletes it with its connection, so a
// holder that dies releases it.
func lockQueue(ctx context.Context, conn *amqp.Connection, name string) (*amqp.Channel, error) {
	for {
		ch, err := conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("rabbit: open channel: %w", err)
		}
		_, err = ch.QueueDeclare(name, false, true, true, false, nil)
		if err == nil {
			return ch, nil
		}
		ch.Close()
		var aerr *amqp.Error
		if !errors.As(err, &aerr) || aerr.Code != amqp.ResourceLocked {
			return nil, fmt.Errorf("rabbit: lock %q: %w", name, err)
		}
		t := time.NewTimer(time.Duration(10+mathrand.IntN(40)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("rabbit: waiting for lock %q, which another connection holds: %w", name, ctx.Err())
		case <-t.C:
		}
	}
}

// unlockQueue releases the lock queue name that lockQueue took on ch, a
// channel of conn, trying twice. When it fails, the lock stays held until
// conn closes.
func unlockQueue(conn *amqp.Connection, ch *amqp.Channel, name string) error {
	var err error
	for range 2 {
		if ch.IsClosed() {
			if ch, err = conn.Channel(); err != nil {
				return nil // the connection is gone, and the lock with it
			}
		}
		_, err = ch.QueueDelete(name, false, false, false)
		ch.Close()
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("rabbit: release lock %q: %w", name, err)
}
