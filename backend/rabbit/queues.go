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
// durable classic queue, <prefix>:queues, holding one message per Declare
// of a queue by a Backend (the message's body is the queue's name). Queues
// reads it whole and compacts it. No broker queue of a facade queue can
// have that name: theirs start with "<prefix>." and a queue name has no ':'.
func (b *Backend) registryName() string { return b.cfg.Prefix + ":queues" }

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
// broker queues exist. It compacts the registry when it has grown to
// registryCompactAt messages.
func (b *Backend) register(ctx context.Context, queue string) error {
	if err := b.ensure(ctx, b.registryName(), amqp.Table{}); err != nil {
		return err
	}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	err := b.publish(ctx, outMsg{key: b.registryName(), pub: amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    "queue/" + queue + "/" + hex.EncodeToString(id),
		ContentType:  "text/plain",
		Body:         []byte(queue),
	}})
	if err != nil {
		return err
	}
	var size int
	err = b.withChannel(ctx, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(b.registryName(), true, false, false, false, nil)
		size = q.Messages
		return err
	})
	if err == nil && int64(size) >= registryCompactAt.Load() {
		_, err = b.Queues(ctx)
	}
	return err
}

// listMu makes the Queues calls of this process take turns: the exclusive
// lock queue does not keep two channels of one connection apart.
var listMu sync.Mutex

// Queues implements driver.QueueLister: every queue in the registry whose
// work queue exists. It takes the lock queue (waiting while another
// process's Queues holds it), gets every registry message without acking
// it, checks each name's work queue with a passive declare, acks the
// duplicates and the names of deleted queues, and hands the rest back. A
// queue declared by a version before the registry is listed once a Backend
// declares it again (any worker's Start or producer's first Enqueue does).
// It costs a round trip per registry message and per queue.
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
	if err := declareQueue(ch, b.registryName(), amqp.Table{}); err != nil {
		return nil, err
	}
	type entry struct {
		tag  uint64
		name string
	}
	var entries []entry
	for {
		d, ok, err := ch.Get(b.registryName(), false)
		if err != nil {
			return nil, fmt.Errorf("rabbit: list queues: read %q: %w", b.registryName(), err)
		}
		if !ok {
			break
		}
		entries = append(entries, entry{d.DeliveryTag, string(d.Body)})
	}
	// Which names are live: checked on a channel of their own, which a
	// missing queue closes (inspect opens the next).
	live := map[string]bool{}
	probe, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbit: open channel: %w", err)
	}
	defer func() { probe.Close() }()
	for _, e := range entries {
		if _, seen := live[e.name]; seen || driver.CheckQueue(e.name) != nil {
			continue
		}
		_, ok, err := b.inspect(ctx, &probe, b.workName(e.name))
		if err != nil {
			return nil, err
		}
		live[e.name] = ok
	}
	// Keep one message per live name; ack the rest; hand the kept back.
	kept := map[string]bool{}
	var names []string
	var last uint64 // the last message kept
	for _, e := range entries {
		if live[e.name] && !kept[e.name] {
			kept[e.name] = true
			names = append(names, e.name)
			last = e.tag
			continue
		}
		if err := ch.Ack(e.tag, false); err != nil {
			return nil, fmt.Errorf("rabbit: list queues: compact %q: %w", b.registryName(), err)
		}
	}
	if len(names) > 0 {
		if err := ch.Nack(last, true, true); err != nil {
			return nil, fmt.Errorf("rabbit: list queues: hand back %q: %w", b.registryName(), err)
		}
	}
	sort.Strings(names)
	return names, nil
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
