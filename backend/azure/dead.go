package azure

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"sort"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"

	"github.com/asyncplatform/asyncplatform/driver"
)

// idMeta is the queue metadata key that carries a record's job ID (base64url),
// so DeleteDead can match IDs from the listing alone.
const (
	idMeta      = "apid"
	doneMeta    = "apdone" // set once the lock message is written: the record is complete
	maxIDMeta   = 4096
	maxDeadBody = maxChunks * maxChunkData
)

// deadReceipt is DeadDelivery.Handle: the held lock message of a record.
type deadReceipt struct {
	record  string // the record's lock queue
	chunked bool
	id      string
	pop     string
	content string
	closed  chan struct{}
}

// DeadLetter implements driver.Backend. It renews the lease (which checks
// the pop receipt, so a stale delivery writes nothing), writes the record as
// a queue of its own (overflow chunks first, then the lock message that makes
// the record visible) and then deletes the delivered message. When the delete finds the
// lease lost, ErrLeaseLost is returned and the record stays (a duplicate of
// whatever the job's next holder does); a crash before the delete also
// leaves a duplicate, never a loss.
func (b *Backend) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	r, err := b.receipt(d)
	if err != nil {
		return err
	}
	n := b.names(d.Queue)
	// Check the lease first (and renew it for the write): a stale receipt
	// must not write a record.
	_, content, err := r.current(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	lease := r.lease
	r.mu.Unlock()
	if err := r.update(ctx, content, max32(visibility(lease), 1), 0); err != nil {
		return wrapSettle("dead-letter", err)
	}
	if _, err := b.writeDead(ctx, n.dead, rec); err != nil {
		return err
	}
	pop, _, err := r.current(ctx)
	if err != nil {
		return err
	}
	// The record stays even when the delete finds the lease lost: the
	// delete may have succeeded on an earlier try of the SDK's retry, so
	// removing the record could lose the job. A duplicate record is the
	// price.
	_, err = r.q.DeleteMessage(ctx, r.id, pop, nil)
	return wrapSettle("dead-letter", err)
}

// writeDead stores one record and returns its lock queue's name.
func (b *Backend) writeDead(ctx context.Context, prefix string, rec driver.DeadMessage) (string, error) {
	if len(rec.Body) > maxDeadBody {
		return "", fmt.Errorf("azure: %w: dead-letter record of %d bytes exceeds the limit of %d bytes (%d messages of 48 KiB)",
			driver.ErrTooLarge, len(rec.Body), maxDeadBody, maxChunks)
	}
	record := prefix + newKey()
	lock := lockFrame{id: rec.ID, kind: lockInline, body: rec.Body}
	if len(rec.Body) > lockInlineMax(rec.ID) {
		if lockInlineMax(rec.ID) < 2 {
			return "", fmt.Errorf("azure: dead-letter record: job ID of %d bytes is too long", len(rec.ID))
		}
		chunks := slices.Collect(slices.Chunk(rec.Body, maxChunkData))
		data := dataQueue(record)
		if _, err := b.svc.CreateQueue(ctx, data, nil); err != nil {
			return "", fmt.Errorf("azure: dead-letter record: create %s: %w", data, err)
		}
		dq := b.svc.NewQueueClient(data)
		for i, c := range chunks {
			if _, err := dq.EnqueueMessage(ctx, encodeChunk(i, len(chunks), c), &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))}); err != nil {
				b.removeRecord(context.WithoutCancel(ctx), record, true)
				return "", fmt.Errorf("azure: dead-letter record: write chunk %d to %s: %w", i, data, err)
			}
		}
		lock = lockFrame{id: rec.ID, kind: lockChunked, chunks: len(chunks)}
	}
	metadata := map[string]*string{}
	if meta := base64.RawURLEncoding.EncodeToString([]byte(rec.ID)); len(meta) <= maxIDMeta {
		metadata[idMeta] = &meta
	}
	if _, err := b.svc.CreateQueue(ctx, record, &azqueue.CreateOptions{Metadata: metadata}); err != nil {
		b.removeRecord(context.WithoutCancel(ctx), record, true)
		return "", fmt.Errorf("azure: dead-letter record: create %s: %w", record, err)
	}
	rq := b.svc.NewQueueClient(record)
	if _, err := rq.EnqueueMessage(ctx, lock.encode(), &azqueue.EnqueueMessageOptions{TimeToLive: to.Ptr(int32(-1))}); err != nil {
		b.removeRecord(context.WithoutCancel(ctx), record, true)
		return "", fmt.Errorf("azure: dead-letter record: write %s: %w", record, err)
	}
	// Only now is the record complete. A crash before this point leaves an
	// incomplete record queue that every reader skips (purge removes it);
	// the delivered message is still there and is dead-lettered again.
	done := "1"
	metadata[doneMeta] = &done
	if _, err := rq.SetMetadata(ctx, &azqueue.SetMetadataOptions{Metadata: metadata}); err != nil {
		b.removeRecord(context.WithoutCancel(ctx), record, true)
		return "", fmt.Errorf("azure: dead-letter record: complete %s: %w", record, err)
	}
	return record, nil
}

// removeRecord deletes a record's queues, lock queue first, ignoring queues
// already gone. It reports whether the lock queue was deleted by this call.
func (b *Backend) removeRecord(ctx context.Context, record string, chunked bool) (bool, error) {
	deleted := true
	if _, err := b.svc.DeleteQueue(ctx, record, nil); err != nil {
		if !queueerror.HasCode(err, queueerror.QueueNotFound) {
			return false, fmt.Errorf("azure: delete dead-letter record %s: %w", record, err)
		}
		deleted = false
	}
	if !chunked {
		return deleted, nil
	}
	if _, err := b.svc.DeleteQueue(ctx, dataQueue(record), nil); err != nil && !queueerror.HasCode(err, queueerror.QueueNotFound) {
		return deleted, fmt.Errorf("azure: delete dead-letter record %s: %w", dataQueue(record), err)
	}
	return deleted, nil
}

// listed is one entry of a dead-letter listing.
type listed struct {
	name string
	id   *string // from metadata, when present
}

// eachRecord calls fn for the record queues under prefix whose names sort
// after after ("" for all), in name order, until fn says stop. It does not
// use the service's continuation marker as a cursor of its own: Azurite's
// marker is an insertion index that skips names when insertion and name order
// differ, so pages are walked from the start with names compared here.
// Only complete records are passed to fn (see writeDead).
func (b *Backend) eachRecord(ctx context.Context, prefix, after string, fn func(listed) (stop bool, err error)) error {
	pager := b.svc.NewListQueuesPager(&azqueue.ListQueuesOptions{Prefix: &prefix, Include: azqueue.ListQueuesInclude{Metadata: true}})
	for pager.More() {
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("azure: list dead-letter queues %s*: %w", prefix, err)
		}
		for _, q := range resp.Queues {
			if q.Name == nil || !isRecordQueue(prefix, *q.Name) || *q.Name <= after || q.Metadata[doneMeta] == nil {
				continue
			}
			l := listed{name: *q.Name}
			if v := q.Metadata[idMeta]; v != nil {
				if id, err := base64.RawURLEncoding.DecodeString(*v); err == nil {
					l.id = to.Ptr(string(id))
				}
			}
			stop, err := fn(l)
			if err != nil || stop {
				return err
			}
		}
	}
	return nil
}

// readRecord assembles a record from its lock message text, peeking at the
// overflow queue for a chunked one.
func (b *Backend) readRecord(ctx context.Context, record string, lock lockFrame) ([]byte, error) {
	if lock.kind == lockInline {
		return lock.body, nil
	}
	resp, err := b.svc.NewQueueClient(dataQueue(record)).PeekMessages(ctx, &azqueue.PeekMessagesOptions{NumberOfMessages: to.Ptr(int32(maxChunks))})
	if err != nil {
		return nil, fmt.Errorf("azure: read dead-letter record %s: %w", record, err)
	}
	parts := make([][]byte, lock.chunks)
	for _, m := range resp.Messages {
		if m.MessageText == nil {
			continue
		}
		i, total, data, err := decodeChunk(*m.MessageText)
		if err != nil || total != lock.chunks || i >= total {
			return nil, fmt.Errorf("azure: dead-letter record %s has a bad chunk", record)
		}
		parts[i] = data
	}
	var body []byte
	for i, p := range parts {
		if p == nil {
			return nil, fmt.Errorf("azure: dead-letter record %s lacks chunk %d of %d", record, i, lock.chunks)
		}
		body = append(body, p...)
	}
	return body, nil
}

// NextDead implements driver.Backend. It walks the queue's record queues in
// name (creation) order and dequeues the first lock message it can; holding
// the lock message is holding the record, until SettleDead or until
// Config.DeadLease passes.
func (b *Backend) NextDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	n := b.names(queue)
	var dd *driver.DeadDelivery
	err := b.eachRecord(ctx, n.dead, "", func(l listed) (bool, error) {
		var err error
		dd, err = b.tryHold(ctx, l.name)
		return dd != nil, err
	})
	switch {
	case err != nil:
		return nil, err
	case dd == nil:
		return nil, driver.ErrNoDeadLetters
	}
	return dd, nil
}

// tryHold dequeues the lock message of one record; nil when someone else
// holds it or it is gone or incomplete.
func (b *Backend) tryHold(ctx context.Context, record string) (*driver.DeadDelivery, error) {
	q := b.svc.NewQueueClient(record)
	resp, err := q.DequeueMessage(ctx, &azqueue.DequeueMessageOptions{VisibilityTimeout: to.Ptr(visibility(b.deadLease))})
	if queueerror.HasCode(err, queueerror.QueueNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("azure: next dead letter from %s: %w", record, err)
	}
	if len(resp.Messages) == 0 {
		return nil, nil
	}
	m := resp.Messages[0]
	r := &deadReceipt{record: record, id: *m.MessageID, pop: *m.PopReceipt, closed: b.closed}
	if m.MessageText != nil {
		r.content = *m.MessageText
	}
	lock, err := decodeLock(r.content)
	if err != nil {
		b.log.Warn("azure: skipping a dead-letter queue whose message is not a record", "queue", record)
		return nil, nil
	}
	body, err := b.readRecord(ctx, record, lock)
	if err != nil {
		// Release it at once; it stays where it is.
		_, _ = q.UpdateMessage(context.WithoutCancel(ctx), r.id, r.pop, r.content, &azqueue.UpdateMessageOptions{VisibilityTimeout: to.Ptr(int32(0))})
		return nil, err
	}
	r.chunked = lock.kind == lockChunked
	return &driver.DeadDelivery{DeadMessage: driver.DeadMessage{ID: lock.id, Body: body}, Handle: r}, nil
}

// SettleDead implements driver.Backend. Remove deletes the lock message
// (checking the pop receipt) and then the record's queues; keep makes the
// lock message visible again, and since records are ordered by queue name the
// record keeps its place.
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	r, ok := d.Handle.(*deadReceipt)
	if !ok || r == nil {
		return fmt.Errorf("azure: dead delivery handle %T is not this backend's", d.Handle)
	}
	q := b.svc.NewQueueClient(r.record)
	if !remove {
		_, err := q.UpdateMessage(ctx, r.id, r.pop, r.content, &azqueue.UpdateMessageOptions{VisibilityTimeout: to.Ptr(int32(0))})
		return wrapSettle("settle dead letter", err)
	}
	if _, err := q.DeleteMessage(ctx, r.id, r.pop, nil); err != nil {
		if !queueerror.HasCode(err, queueerror.MessageNotFound) || !b.lockGone(ctx, q) {
			return wrapSettle("settle dead letter", err)
		}
		// The lock message is gone (an earlier try of the SDK's retry
		// deleted it): finish the removal.
	}
	_, err := b.removeRecord(ctx, r.record, r.chunked)
	return err
}

// lockGone reports whether a record queue holds no message at all, visible
// or held.
func (b *Backend) lockGone(ctx context.Context, q *azqueue.QueueClient) bool {
	props, err := q.GetProperties(ctx, nil)
	return err == nil && props.ApproximateMessagesCount != nil && *props.ApproximateMessagesCount == 0
}

// ListDead implements driver.Backend by listing record queues in name order
// and peeking at each; records held by a NextDead caller are invisible to
// Peek and left out. The cursor is the last record queue's name. It changes
// nothing.
func (b *Backend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	if b.isClosed() {
		return nil, "", driver.ErrClosed
	}
	n := b.names(queue)
	if limit <= 0 {
		return nil, "", fmt.Errorf("azure: list dead letters: limit %d: want a positive number", limit)
	}
	if cursor != "" && !isRecordQueue(n.dead, cursor) {
		return nil, "", fmt.Errorf("azure: list dead letters: cursor %q is not one of queue %q's", cursor, queue)
	}
	var (
		recs []driver.DeadMessage
		last string
		more bool
	)
	err := b.eachRecord(ctx, n.dead, cursor, func(l listed) (bool, error) {
		if len(recs) == limit {
			more = true
			return true, nil
		}
		rec, ok, err := b.peekRecord(ctx, l.name)
		if err != nil {
			return true, err
		}
		if ok {
			recs = append(recs, rec)
		}
		last = l.name
		return false, nil
	})
	if err != nil {
		return nil, "", err
	}
	if !more {
		last = ""
	}
	return recs, last, nil
}

func (b *Backend) peekRecord(ctx context.Context, record string) (driver.DeadMessage, bool, error) {
	resp, err := b.svc.NewQueueClient(record).PeekMessage(ctx, nil)
	if queueerror.HasCode(err, queueerror.QueueNotFound) {
		return driver.DeadMessage{}, false, nil
	}
	if err != nil {
		return driver.DeadMessage{}, false, fmt.Errorf("azure: list dead letters: peek %s: %w", record, err)
	}
	if len(resp.Messages) == 0 || resp.Messages[0].MessageText == nil {
		return driver.DeadMessage{}, false, nil // held, or not yet written
	}
	lock, err := decodeLock(*resp.Messages[0].MessageText)
	if err != nil {
		return driver.DeadMessage{}, false, nil
	}
	body, err := b.readRecord(ctx, record, lock)
	if err != nil {
		return driver.DeadMessage{}, false, err
	}
	return driver.DeadMessage{ID: lock.id, Body: body}, true, nil
}

// DeleteDead implements driver.Backend. IDs come from the record queues'
// metadata (or a peek when an ID was too long for it).
func (b *Backend) DeleteDead(ctx context.Context, queue string, ids []string) (int, error) {
	if b.isClosed() {
		return 0, driver.ErrClosed
	}
	n := b.names(queue)
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	count := 0
	err := b.eachRecord(ctx, n.dead, "", func(l listed) (bool, error) {
		id := l.id
		if id == nil {
			rec, ok, err := b.peekRecord(ctx, l.name)
			if err != nil || !ok {
				return false, err
			}
			id = &rec.ID
		}
		if !want[*id] {
			return false, nil
		}
		deleted, err := b.removeRecord(ctx, l.name, true)
		if deleted {
			count++
		}
		return false, err
	})
	return count, err
}

// PurgeDead implements driver.Backend.
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if b.isClosed() {
		return 0, driver.ErrClosed
	}
	n := b.names(queue)
	return b.purge(ctx, n.dead)
}

// purge deletes every queue under the dead prefix (records, their overflow
// queues and the leftovers of interrupted writes) and counts the records.
func (b *Backend) purge(ctx context.Context, prefix string) (int, error) {
	var all []string
	pager := b.svc.NewListQueuesPager(&azqueue.ListQueuesOptions{Prefix: &prefix})
	for pager.More() {
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return 0, fmt.Errorf("azure: list dead-letter queues %s*: %w", prefix, err)
		}
		for _, q := range resp.Queues {
			if q.Name != nil {
				all = append(all, *q.Name)
			}
		}
	}
	sort.Strings(all)
	count := 0
	for _, name := range all {
		if len(name) != len(prefix)+keyLen && len(name) != len(prefix)+keyLen+1 {
			continue // another queue's names cannot start with prefix, but be safe
		}
		if _, err := b.svc.DeleteQueue(ctx, name, nil); err != nil {
			if queueerror.HasCode(err, queueerror.QueueNotFound) {
				continue
			}
			return count, fmt.Errorf("azure: purge dead letters: delete %s: %w", name, err)
		}
		if isRecordQueue(prefix, name) {
			count++
		}
	}
	return count, nil
}

// countDead counts the record queues under prefix.
func (b *Backend) countDead(ctx context.Context, prefix string) (int64, error) {
	var count int64
	err := b.eachRecord(ctx, prefix, "", func(listed) (bool, error) {
		count++
		return false, nil
	})
	return count, err
}
