package azure

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Dead-letter records are blobs named dead/<base>/<key> in the backend's
// container (see blob.go and names.go): a listing with the prefix
// dead/<base>/ returns one queue's records in key (creation) order. The
// blob's content is the record's frame (lockFrame.raw: the job ID and the
// record), and its metadata carries the ID again (idMeta, base64url) so
// DeleteDead can match IDs from a listing alone.
const (
	idMeta    = "apid"
	maxIDMeta = 4096 // longer IDs are read from the content

	// nextPage is how many names NextDead asks for at a time: the first
	// unheld record is almost always on the first page.
	nextPage = 32
	// blobParallel bounds the concurrent requests of one ListDead,
	// DeleteDead or PurgeDead call.
	blobParallel = 16
)

// deadHold is DeadDelivery.Handle: a record held under a blob lease, which
// ExtendDead renews.
type deadHold struct {
	name   string
	lease  *lease.BlobClient
	closed chan struct{} // the backend's

	mu      sync.Mutex
	settled bool
}

// deadHoldOf returns d's hold, if this backend handed it out.
func (b *Backend) deadHoldOf(d *driver.DeadDelivery) (*deadHold, error) {
	h, ok := d.Handle.(*deadHold)
	if !ok || h == nil {
		return nil, fmt.Errorf("azure: dead delivery handle %T is not this backend's", d.Handle)
	}
	if h.closed != b.closed {
		return nil, fmt.Errorf("azure: dead delivery belongs to another backend: %w", driver.ErrLeaseLost)
	}
	return h, nil
}

// ExtendDead implements driver.Backend: it renews the blob lease for
// another Config.DeadHold.
func (b *Backend) ExtendDead(ctx context.Context, d *driver.DeadDelivery) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	h, err := b.deadHoldOf(d)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.settled {
		return fmt.Errorf("azure: extend dead letter %s: %w (settled before)", h.name, driver.ErrLeaseLost)
	}
	_, err = h.lease.RenewLease(ctx, nil)
	switch {
	case err == nil:
		return nil
	case deadLeaseLost(err):
		return fmt.Errorf("azure: extend dead letter %s: %w (%v)", h.name, driver.ErrLeaseLost, err)
	default:
		return fmt.Errorf("azure: extend dead letter %s: %w", h.name, err)
	}
}

// deadLeaseLost reports whether a lease or leased-write error means the
// hold is gone: the lease expired or was taken or broken by another, or the
// blob was deleted.
func deadLeaseLost(err error) bool {
	return bloberror.HasCode(err, bloberror.LeaseLost, bloberror.LeaseIDMismatchWithBlobOperation,
		bloberror.LeaseIDMismatchWithLeaseOperation, bloberror.LeaseNotPresentWithBlobOperation,
		bloberror.LeaseNotPresentWithLeaseOperation, bloberror.LeaseIsBrokenAndCannotBeRenewed,
		bloberror.LeaseIsBreakingAndCannotBeChanged, bloberror.BlobNotFound)
}

// DeadLetter implements driver.Backend. It refuses a lapsed lease (so a
// lapsed or stale delivery writes nothing), renews the lease when less than
// half of it is left, writes the record as a blob and then deletes the
// delivered message. When the delete finds the lease lost, ErrLeaseLost is
// returned and the record stays (a duplicate of whatever the job's next
// holder does); a crash before the delete also leaves a duplicate, never a
// loss.
func (b *Backend) DeadLetter(ctx context.Context, d *driver.Delivery, rec driver.DeadMessage) error {
	r, err := b.receipt(d)
	if err != nil {
		return err
	}
	n := b.names(d.Queue)
	// Check the lease first: a lapsed receipt must not write a record. While
	// the lease runs no one else can have received the message, so its pop
	// receipt is ours; it is renewed for the write only when less than half
	// of it is left (an update is a request, and on Azurite a stored
	// extent its garbage collector must sweep). The move then goes on to
	// the delete below even if the write outlasts the lease: the delete
	// fails only when another worker has taken the message, leaving a
	// duplicate record, never a loss.
	_, content, err := r.held(ctx)
	if err != nil {
		return wrapSettle("dead-letter", err)
	}
	r.mu.Lock()
	lease, left := r.lease, time.Until(r.until)
	r.mu.Unlock()
	if left < lease/2 {
		if err := r.update(ctx, content, max32(visibility(lease), 1), lease); err != nil {
			return wrapSettle("dead-letter", err)
		}
	}
	if err := b.writeDead(ctx, n.dead, rec.ID, lockFrame{id: rec.ID, kind: lockInline, body: rec.Body}.raw()); err != nil {
		return err
	}
	pop, _, err := r.current(ctx)
	if err != nil {
		return err
	}
	// The record stays even when the delete finds the lease lost: another
	// worker has the message and may dead-letter it too. A duplicate record
	// is the price.
	return wrapSettle("dead-letter", r.deleteMessage(ctx, pop))
}

// writeDead stores one record under prefix with a new key.
func (b *Backend) writeDead(ctx context.Context, prefix, id string, content []byte) error {
	for {
		ok, err := b.putRecord(ctx, prefix+newKey(), id, content)
		if ok || err != nil {
			return err
		}
		// Another record has this name (a key collision): take another.
	}
}

// putRecord creates the blob name with content unless a blob of that name
// exists (If-None-Match: *). It reports whether the blob now holds content:
// true when it wrote it, or when the existing blob has the same content (an
// earlier try of the SDK's retry, or a migration run twice).
func (b *Backend) putRecord(ctx context.Context, name, id string, content []byte) (bool, error) {
	metadata := map[string]*string{}
	if meta := base64.RawURLEncoding.EncodeToString([]byte(id)); len(meta) <= maxIDMeta {
		metadata[idMeta] = &meta
	}
	_, err := b.container.NewBlockBlobClient(name).Upload(ctx, streaming.NopCloser(bytes.NewReader(content)), &blockblob.UploadOptions{
		Metadata: metadata,
		AccessConditions: &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{
			IfNoneMatch: to.Ptr(azcore.ETagAny),
		}},
	})
	if err == nil {
		return true, nil
	}
	if !bloberror.HasCode(err, bloberror.BlobAlreadyExists, bloberror.ConditionNotMet) {
		return false, fmt.Errorf("azure: write dead-letter record %s: %w", name, err)
	}
	have, err := b.readBlob(ctx, name, nil)
	if err != nil {
		return false, fmt.Errorf("azure: write dead-letter record %s: %w", name, err)
	}
	return bytes.Equal(have, content), nil
}

// readBlob returns a blob's content.
func (b *Backend) readBlob(ctx context.Context, name string, cond *blob.AccessConditions) ([]byte, error) {
	resp, err := b.container.NewBlobClient(name).DownloadStream(ctx, &blob.DownloadStreamOptions{AccessConditions: cond})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// NextDead implements driver.Backend. It lists the queue's records in name
// (creation) order, skips those the listing shows leased, and takes a blob
// lease of Config.DeadHold on the first it can; holding the lease is
// holding the record. ExtendDead renews the lease, so a caller that
// vanishes releases the record when its last lease ends.
func (b *Backend) NextDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	n := b.names(queue)
	if err := b.migrateDue(ctx, n); err != nil {
		return nil, err
	}
	pager := b.container.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &n.dead, MaxResults: to.Ptr(int32(nextPage))})
	for pager.More() {
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("azure: next dead letter of %s: list: %w", queue, err)
		}
		for _, it := range resp.Segment.BlobItems {
			if it.Name == nil || leased(it) {
				continue
			}
			dd, err := b.tryHold(ctx, *it.Name)
			if err != nil || dd != nil {
				return dd, err
			}
		}
	}
	return nil, driver.ErrNoDeadLetters
}

// leased reports whether a listed blob is held by a NextDead caller.
func leased(it *container.BlobItem) bool {
	p := it.Properties
	return p != nil && p.LeaseState != nil && (*p.LeaseState == lease.StateTypeLeased || *p.LeaseState == lease.StateTypeBreaking)
}

// tryHold leases and reads one record; nil when another caller holds it or
// it is gone.
func (b *Backend) tryHold(ctx context.Context, name string) (*driver.DeadDelivery, error) {
	id, err := newLeaseID()
	if err != nil {
		return nil, err
	}
	lc, err := lease.NewBlobClient(b.container.NewBlobClient(name), &lease.BlobClientOptions{LeaseID: &id})
	if err != nil {
		return nil, fmt.Errorf("azure: next dead letter: %w", err)
	}
	// An acquire with the same proposed ID is idempotent, so the SDK's
	// retry of an acquire that had succeeded succeeds too.
	if _, err := lc.AcquireLease(ctx, int32(b.deadHold/time.Second), nil); err != nil {
		if bloberror.HasCode(err, bloberror.LeaseAlreadyPresent, bloberror.LeaseIsBreakingAndCannotBeAcquired, bloberror.BlobNotFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("azure: next dead letter: lease %s: %w", name, err)
	}
	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		_, _ = lc.ReleaseLease(rctx, nil)
	}
	content, err := b.readBlob(ctx, name, &blob.AccessConditions{LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: &id}})
	if err != nil {
		if bloberror.HasCode(err, bloberror.BlobNotFound) {
			return nil, nil // purged meanwhile
		}
		release()
		return nil, fmt.Errorf("azure: next dead letter: read %s: %w", name, err)
	}
	f, err := decodeLockRaw(content)
	if err != nil || f.kind != lockInline {
		release()
		b.log.Warn("azure: skipping a blob among the dead letters that is not a record", "blob", name)
		return nil, nil
	}
	h := &deadHold{name: name, lease: lc, closed: b.closed}
	return &driver.DeadDelivery{DeadMessage: driver.DeadMessage{ID: f.id, Body: f.body}, Handle: h}, nil
}

// newLeaseID returns a random UUID (version 4) for a proposed lease ID.
func newLeaseID() (string, error) {
	var u [16]byte
	if _, err := rand.Read(u[:]); err != nil {
		return "", err
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

// SettleDead implements driver.Backend. Remove deletes the blob under the
// lease (a conditional delete: it fails when the lease is no longer ours);
// keep releases the lease, and the record, whose place is its name, is the
// next NextDead's again.
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	h, err := b.deadHoldOf(d)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.settled {
		return fmt.Errorf("azure: settle dead letter %s: %w (settled before)", h.name, driver.ErrLeaseLost)
	}
	h.settled = true
	if remove {
		id := h.lease.LeaseID()
		_, err = b.container.NewBlobClient(h.name).Delete(ctx, &blob.DeleteOptions{
			AccessConditions: &blob.AccessConditions{LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: id}},
		})
		if bloberror.HasCode(err, bloberror.BlobNotFound) {
			// Gone: an earlier try of the SDK's retry deleted it, or
			// PurgeDead did. Either way it is removed.
			err = nil
		}
	} else {
		_, err = h.lease.ReleaseLease(ctx, nil)
	}
	switch {
	case err == nil:
		return nil
	case deadLeaseLost(err):
		return fmt.Errorf("azure: settle dead letter %s: %w (%v)", h.name, driver.ErrLeaseLost, err)
	default:
		h.settled = false // nothing changed: the caller may try again
		return fmt.Errorf("azure: settle dead letter %s: %w", h.name, err)
	}
}

// ListDead implements driver.Backend: one listing of up to limit names
// from the service's continuation marker, and one read per record (up to
// 16 at a time). Records held by a NextDead caller are included. The
// cursor is the service's marker behind a tag of the queue's prefix.
func (b *Backend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	if b.isClosed() {
		return nil, "", driver.ErrClosed
	}
	if limit <= 0 {
		return nil, "", fmt.Errorf("azure: list dead letters: limit %d: want a positive number", limit)
	}
	n := b.names(queue)
	var marker *string
	if cursor == "" {
		if err := b.migrateDue(ctx, n); err != nil {
			return nil, "", err
		}
	} else {
		tag, m, ok := strings.Cut(cursor, ".")
		if !ok || tag != cursorTag(n.dead) || m == "" {
			return nil, "", fmt.Errorf("azure: list dead letters: cursor %q is not one of queue %q's", cursor, queue)
		}
		marker = &m
	}
	var names []string
	next := ""
	pager := b.container.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &n.dead, Marker: marker, MaxResults: to.Ptr(int32(min(limit, 5000)))})
	for len(names) < limit && pager.More() {
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("azure: list dead letters of %s: %w", queue, err)
		}
		for _, it := range resp.Segment.BlobItems {
			if it.Name != nil {
				names = append(names, *it.Name)
			}
		}
		next = ""
		if resp.NextMarker != nil && *resp.NextMarker != "" {
			next = cursorTag(n.dead) + "." + *resp.NextMarker
		}
		if len(names) > 0 {
			break // a short page is a page: the cursor says where to go on
		}
	}
	recs := make([]*driver.DeadMessage, len(names))
	err := eachParallel(ctx, len(names), func(ctx context.Context, i int) error {
		content, err := b.readBlob(ctx, names[i], nil)
		if bloberror.HasCode(err, bloberror.BlobNotFound) {
			return nil // removed since the listing
		}
		if err != nil {
			return fmt.Errorf("azure: list dead letters: read %s: %w", names[i], err)
		}
		if f, err := decodeLockRaw(content); err == nil && f.kind == lockInline {
			recs[i] = &driver.DeadMessage{ID: f.id, Body: f.body}
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	refs := make([]deadRef, 0, len(recs))
	for i, r := range recs {
		if r != nil {
			refs = append(refs, deadRef{id: r.ID, name: names[i]})
		}
	}
	b.deadNames.page(n.dead, cursor, next, refs)
	out := make([]driver.DeadMessage, 0, len(recs))
	for _, r := range recs {
		if r != nil {
			out = append(out, *r)
		}
	}
	return out, next, nil
}

// cursorTag ties a ListDead cursor to its queue.
func cursorTag(prefix string) string {
	sum := sha256.Sum256([]byte(prefix))
	return hex.EncodeToString(sum[:4])
}

// eachParallel calls fn for 0..n-1, blobParallel at a time, and returns the
// first error (the calls not yet started are skipped).
func eachParallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		sem   = make(chan struct{}, blobParallel)
		mu    sync.Mutex
		first error
	)
	for i := range n {
		sem <- struct{}{}
		if ctx.Err() != nil {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// eachRecord calls fn with every page of the queue's records (names and
// metadata), in name order, 5,000 names a page.
func (b *Backend) eachRecord(ctx context.Context, prefix string, metadata bool, fn func([]*container.BlobItem) error) error {
	pager := b.container.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &prefix, Include: container.ListBlobsInclude{Metadata: metadata}})
	for pager.More() {
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("azure: list dead letters %s: %w", prefix, err)
		}
		if err := fn(resp.Segment.BlobItems); err != nil {
			return err
		}
	}
	return nil
}

// DeleteDead implements driver.Backend. When every ID is one a listing
// by this Backend showed (deadNames), it deletes the remembered names
// without listing; otherwise it walks the prefix with metadata (IDs from
// the metadata, or the content for an ID too long for it), remembering
// every record it sees, and deletes the matches. Each delete is sent
// without a lease, which the service refuses for a record a NextDead
// caller holds: those are left alone and not counted.
func (b *Backend) DeleteDead(ctx context.Context, queue string, ids []string) (int, error) {
	if b.isClosed() {
		return 0, driver.ErrClosed
	}
	n := b.names(queue)
	if err := b.migrateDue(ctx, n); err != nil {
		return 0, err
	}
	if refs, ok := b.deadNames.lookup(n.dead, ids); ok {
		return b.deleteRefs(ctx, n.dead, refs)
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	walk := b.deadNames.walk(n.dead)
	var (
		mu    sync.Mutex
		count int
	)
	err := b.eachRecord(ctx, n.dead, true, func(items []*container.BlobItem) error {
		return eachParallel(ctx, len(items), func(ctx context.Context, i int) error {
			it := items[i]
			if it.Name == nil {
				return nil
			}
			id, ok := metaID(it.Metadata)
			if !ok {
				content, err := b.readBlob(ctx, *it.Name, nil)
				if bloberror.HasCode(err, bloberror.BlobNotFound) {
					return nil
				}
				if err != nil {
					return fmt.Errorf("azure: delete dead letters: read %s: %w", *it.Name, err)
				}
				f, err := decodeLockRaw(content)
				if err != nil {
					return nil
				}
				id = f.id
			}
			if !want[id] {
				b.deadNames.learn(n.dead, id, *it.Name)
				return nil
			}
			got, err := b.deleteRecord(ctx, *it.Name)
			switch {
			case err != nil:
				return err
			case got == recordHeld:
				b.deadNames.learn(n.dead, id, *it.Name) // it stays
			case got == recordDeleted:
				mu.Lock()
				count++
				mu.Unlock()
			}
			return nil
		})
	})
	if err == nil {
		b.deadNames.walked(walk)
	}
	return count, err
}

// deleteRefs deletes remembered records by name and forgets those that
// are gone.
func (b *Backend) deleteRefs(ctx context.Context, prefix string, refs []deadRef) (int, error) {
	var (
		mu    sync.Mutex
		count int
		gone  []deadRef
	)
	err := eachParallel(ctx, len(refs), func(ctx context.Context, i int) error {
		got, err := b.deleteRecord(ctx, refs[i].name)
		if err != nil || got == recordHeld {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if got == recordDeleted {
			count++
		}
		gone = append(gone, refs[i])
		return nil
	})
	b.deadNames.forget(prefix, gone)
	return count, err
}

// recordDelete is what a delete without a lease did to a record.
type recordDelete int

const (
	recordDeleted recordDelete = iota
	recordHeld                 // a NextDead caller holds it: the service refused, and it stays
	recordGone                 // it was not there
)

// deleteRecord deletes a record without a lease.
func (b *Backend) deleteRecord(ctx context.Context, name string) (recordDelete, error) {
	_, err := b.container.NewBlobClient(name).Delete(ctx, nil)
	switch {
	case err == nil:
		return recordDeleted, nil
	case bloberror.HasCode(err, bloberror.LeaseIDMissing):
		return recordHeld, nil
	case bloberror.HasCode(err, bloberror.BlobNotFound):
		return recordGone, nil
	default:
		return recordHeld, fmt.Errorf("azure: delete dead letter %s: %w", name, err)
	}
}

// metaID reads the job ID from a record's metadata. The service may return
// metadata keys in another case.
func metaID(md map[string]*string) (string, bool) {
	for k, v := range md {
		if strings.EqualFold(k, idMeta) && v != nil {
			id, err := base64.RawURLEncoding.DecodeString(*v)
			return string(id), err == nil
		}
	}
	return "", false
}

// PurgeDead implements driver.Backend: every record of the queue, in both
// layouts, held or not (a held record's lease is broken first).
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if b.isClosed() {
		return 0, driver.ErrClosed
	}
	return b.purge(ctx, b.names(queue))
}

// purge deletes the queue's record blobs and what is left of the legacy
// layout, and counts the records.
func (b *Backend) purge(ctx context.Context, n names) (int, error) {
	defer b.deadNames.reset(n.dead)
	count, err := b.purgeLegacy(ctx, n.legacy)
	if err != nil {
		return count, err
	}
	var mu sync.Mutex
	err = b.eachRecord(ctx, n.dead, false, func(items []*container.BlobItem) error {
		return eachParallel(ctx, len(items), func(ctx context.Context, i int) error {
			if items[i].Name == nil {
				return nil
			}
			deleted, err := b.deleteBlob(ctx, *items[i].Name)
			if deleted {
				mu.Lock()
				count++
				mu.Unlock()
			}
			return err
		})
	})
	return count, err
}

// deleteBlob deletes a blob, breaking a lease on it first; it reports
// whether this call deleted it.
func (b *Backend) deleteBlob(ctx context.Context, name string) (bool, error) {
	bc := b.container.NewBlobClient(name)
	for range 3 {
		_, err := bc.Delete(ctx, nil)
		switch {
		case err == nil:
			return true, nil
		case bloberror.HasCode(err, bloberror.BlobNotFound):
			return false, nil
		case !bloberror.HasCode(err, bloberror.LeaseIDMissing):
			return false, fmt.Errorf("azure: purge dead letters: delete %s: %w", name, err)
		}
		// Held: break the lease at once (its holder's settle then fails
		// with ErrLeaseLost, or finds the record gone) and delete again.
		lc, err := lease.NewBlobClient(bc, nil)
		if err != nil {
			return false, err
		}
		if _, err := lc.BreakLease(ctx, &lease.BlobBreakOptions{BreakPeriod: to.Ptr(int32(0))}); err != nil && !bloberror.HasCode(err, bloberror.LeaseNotPresentWithLeaseOperation, bloberror.BlobNotFound) {
			return false, fmt.Errorf("azure: purge dead letters: break the lease on %s: %w", name, err)
		}
	}
	return false, errors.New("azure: purge dead letters: " + name + " is leased again as soon as its lease is broken")
}

// countDead counts the queue's record blobs.
func (b *Backend) countDead(ctx context.Context, n names) (int64, error) {
	var count int64
	err := b.eachRecord(ctx, n.dead, false, func(items []*container.BlobItem) error {
		count += int64(len(items))
		return nil
	})
	return count, err
}
