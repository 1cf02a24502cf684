package azure

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/queueerror"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The legacy layout: before dead letters were blobs, each record was a
// queue of its own (<prefix>d<LL><base><key>) holding one "lock" message
// (lockFrame's base64 text), plus an overflow queue (<record>x) of chunks
// for a record larger than one message; the record queue's metadata said
// when it was complete (doneMeta) and carried the ID (idMeta). Records in
// that layout are moved into blobs (migrate): by each process, for each
// queue, at its first dead-letter call (NextDead, ListDead from the start,
// DeleteDead, Stats) and again at most every legacyRecheck, so records
// that workers of the previous version write during a rolling upgrade are
// moved too. PurgeDead and DeleteQueue delete them without moving them.
const (
	doneMeta      = "apdone"
	legacyRecheck = time.Minute
	// legacyHold hides a record's lock message while it is moved.
	legacyHold = 60
)

// legacyState is one queue's migration state in this process.
type legacyState struct {
	mu   sync.Mutex
	last time.Time // of the last successful check
}

// migrateDue moves the queue's legacy records into blobs unless this
// process did within legacyRecheck. Concurrent callers wait for one run.
func (b *Backend) migrateDue(ctx context.Context, n names) error {
	b.mu.Lock()
	st := b.legacy[n.legacy]
	if st == nil {
		st = &legacyState{}
		b.legacy[n.legacy] = st
	}
	b.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.last.IsZero() && time.Since(st.last) < legacyRecheck {
		return nil
	}
	moved, err := b.migrate(ctx, n)
	if moved > 0 {
		b.log.Info("azure: moved dead letters from record queues into blobs", "prefix", n.legacy, "records", moved)
	}
	if err != nil {
		return err
	}
	st.last = time.Now()
	return nil
}

// MigrateDeadLetters moves the dead-letter records that queue has in the
// legacy layout (a queue per record, written by versions before dead
// letters were blobs) into blobs, keeping their order, and returns how many
// it moved. The backend does the same by itself at a queue's first
// dead-letter call in a process (and every minute after); call this to do
// it at a time of your choosing, for example once every worker runs the
// new version. It is safe to run in several processes at once: a record is
// moved once (a concurrent move can at worst leave a duplicate, never lose
// one). Records held at the time by a worker of the previous version are
// left for a later run.
func (b *Backend) MigrateDeadLetters(ctx context.Context, queue string) (int, error) {
	if b.isClosed() {
		return 0, driver.ErrClosed
	}
	return b.migrate(ctx, b.names(queue))
}

// migrate moves every complete, unheld legacy record of the queue into a
// blob named by the same key, then deletes its queues.
func (b *Backend) migrate(ctx context.Context, n names) (int, error) {
	var records []string
	pager := b.svc.NewListQueuesPager(&azqueue.ListQueuesOptions{Prefix: &n.legacy, Include: azqueue.ListQueuesInclude{Metadata: true}})
	for pager.More() {
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return 0, fmt.Errorf("azure: list legacy dead-letter queues %s*: %w", n.legacy, err)
		}
		for _, q := range resp.Queues {
			// An incomplete record (a write under way, or a crashed one)
			// is left alone; PurgeDead and DeleteQueue remove it.
			if q.Name != nil && isRecordQueue(n.legacy, *q.Name) && q.Metadata[doneMeta] != nil {
				records = append(records, *q.Name)
			}
		}
	}
	sort.Strings(records)
	moved := 0
	for _, record := range records {
		ok, err := b.moveLegacy(ctx, n, record)
		if err != nil {
			return moved, err
		}
		if ok {
			moved++
		}
	}
	return moved, nil
}

// moveLegacy moves one legacy record; false when it is held (by a caller
// of the previous version), gone, or not a record.
func (b *Backend) moveLegacy(ctx context.Context, n names, record string) (bool, error) {
	q := b.svc.NewQueueClient(record)
	resp, err := q.DequeueMessage(ctx, &azqueue.DequeueMessageOptions{VisibilityTimeout: to.Ptr(int32(legacyHold))})
	if queueerror.HasCode(err, queueerror.QueueNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("azure: move legacy dead letter %s: %w", record, err)
	}
	if len(resp.Messages) == 0 || resp.Messages[0].MessageText == nil {
		return false, nil
	}
	m := resp.Messages[0]
	lock, err := decodeLock(*m.MessageText)
	if err != nil {
		b.log.Warn("azure: a legacy dead-letter queue holds a message that is not a record; left alone", "queue", record)
		return false, nil
	}
	body, err := b.readLegacy(ctx, record, lock)
	if err != nil {
		return false, err
	}
	content := lockFrame{id: lock.id, kind: lockInline, body: body}.raw()
	ok, err := b.putRecord(ctx, n.dead+record[len(n.legacy):], lock.id, content)
	if err != nil {
		return false, err
	}
	if !ok {
		// Another record took the name (a key collision): keep this one
		// under a new key rather than lose it.
		if err := b.writeDead(ctx, n.dead, lock.id, content); err != nil {
			return false, err
		}
	}
	// The record is a blob now: remove the queues. A lock message deleted
	// meanwhile (another process moving the same record) is fine.
	if _, err := q.DeleteMessage(ctx, *m.MessageID, *m.PopReceipt, nil); err != nil && !leaseLost(err) {
		return false, fmt.Errorf("azure: move legacy dead letter %s: delete its message: %w", record, err)
	}
	for _, name := range []string{record, dataQueue(record)} {
		if _, err := b.svc.DeleteQueue(ctx, name, nil); err != nil && !queueerror.HasCode(err, queueerror.QueueNotFound) {
			return false, fmt.Errorf("azure: move legacy dead letter %s: delete %s: %w", record, name, err)
		}
	}
	return true, nil
}

// readLegacy assembles a legacy record from its lock message, peeking at
// the overflow queue for a chunked one.
func (b *Backend) readLegacy(ctx context.Context, record string, lock lockFrame) ([]byte, error) {
	if lock.kind == lockInline {
		return lock.body, nil
	}
	resp, err := b.svc.NewQueueClient(dataQueue(record)).PeekMessages(ctx, &azqueue.PeekMessagesOptions{NumberOfMessages: to.Ptr(int32(maxChunks))})
	if err != nil {
		return nil, fmt.Errorf("azure: read legacy dead-letter record %s: %w", record, err)
	}
	parts := make([][]byte, lock.chunks)
	for _, m := range resp.Messages {
		if m.MessageText == nil {
			continue
		}
		i, total, data, err := decodeChunk(*m.MessageText)
		if err != nil || total != lock.chunks || i >= total {
			return nil, fmt.Errorf("azure: legacy dead-letter record %s has a bad chunk", record)
		}
		parts[i] = data
	}
	var body []byte
	for i, p := range parts {
		if p == nil {
			return nil, fmt.Errorf("azure: legacy dead-letter record %s lacks chunk %d of %d", record, i, lock.chunks)
		}
		body = append(body, p...)
	}
	return body, nil
}

// purgeLegacy deletes every legacy queue of the queue (records, overflow
// queues, and the leftovers of interrupted writes) and counts the records.
func (b *Backend) purgeLegacy(ctx context.Context, prefix string) (int, error) {
	var all []string
	pager := b.svc.NewListQueuesPager(&azqueue.ListQueuesOptions{Prefix: &prefix})
	for pager.More() {
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return 0, fmt.Errorf("azure: list legacy dead-letter queues %s*: %w", prefix, err)
		}
		for _, q := range resp.Queues {
			if q.Name != nil && (isRecordQueue(prefix, *q.Name) || len(*q.Name) == len(prefix)+keyLen+1) {
				all = append(all, *q.Name)
			}
		}
	}
	count := 0
	for _, name := range all {
		if _, err := b.svc.DeleteQueue(ctx, name, nil); err != nil {
			if queueerror.HasCode(err, queueerror.QueueNotFound) {
				continue
			}
			return count, fmt.Errorf("azure: purge legacy dead letters: delete %s: %w", name, err)
		}
		if isRecordQueue(prefix, name) {
			count++
		}
	}
	return count, nil
}
