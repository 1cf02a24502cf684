package azure

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The store (driver.Store) is a folder of the backend's container (see
// blob.go):
//
//	store/<hex of the key>    one block blob per key: the value, and the
//	                          expiry in the metadata "apexpiry" (Unix µs)
//
// Hex keeps the keys' byte order and prefixes in the blob names, so List is
// a listing of the folder under the hex of the prefix, in the service's
// order, starting from the hex of the cursor (StartFrom; where the service
// ignores it, the keys before are skipped).
//
// Writes are conditional on the blob's ETag: Create is an upload with
// If-None-Match: * (and, over an expired key, If-Match its ETag), Update and
// Delete at a revision are an upload or delete with If-Match. A revision is
// the ETag with the expiry after a '|', so Update and Delete at a revision
// whose expiry has passed fail without a request, and each write is one
// request. ETags change with every write and are never given twice.
//
// Expiry is judged by the clock of the process that reads, against the one
// that wrote: keep the workers' clocks in sync. Blob Storage has no per-blob
// TTL of its own (outside hierarchical-namespace accounts): an expired key
// keeps its blob until it is written again or deleted.

var _ driver.Store = (*Backend)(nil)

// storeFolder is the folder of the store's blobs in the container.
const storeFolder = "store/"

// storeExpiry is the metadata key of a blob's expiry.
const storeExpiry = "apexpiry"

func storeBlob(key string) string { return storeFolder + hex.EncodeToString([]byte(key)) }

// storeExpiryOf returns the expiry of a key written now with ttl, in Unix
// microseconds rounded up (zero: none).
func storeExpiryOf(ttl time.Duration) int64 {
	if ttl <= 0 {
		return 0
	}
	return (time.Now().Add(ttl).UnixNano() + 999) / 1000
}

func storeExpired(exp int64) bool { return exp != 0 && time.Now().UnixMicro() >= exp }

// expiryIn reads the expiry from a blob's metadata (keys are matched
// without regard to case, as the service may change it).
func expiryIn(md map[string]*string) int64 {
	for k, v := range md {
		if strings.EqualFold(k, storeExpiry) && v != nil {
			n, _ := strconv.ParseInt(*v, 10, 64)
			return n
		}
	}
	return 0
}

func storeRev(etag *azcore.ETag, exp int64) (string, error) {
	if etag == nil || *etag == "" {
		return "", errors.New("azure: store: the service returned no ETag")
	}
	return string(*etag) + "|" + strconv.FormatInt(exp, 10), nil
}

// parseStoreRev returns the ETag and expiry of a revision; ok is false for
// one this store cannot have made.
func parseStoreRev(rev string) (azcore.ETag, int64, bool) {
	i := strings.LastIndexByte(rev, '|')
	if i <= 0 {
		return "", 0, false
	}
	exp, err := strconv.ParseInt(rev[i+1:], 10, 64)
	if err != nil || exp < 0 {
		return "", 0, false
	}
	return azcore.ETag(rev[:i]), exp, true
}

// storeContainer returns the container of the store's blobs.
func (b *Backend) storeContainer() (*container.Client, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	return b.container, nil
}

// upload writes a key's blob under the given conditions.
func (b *Backend) upload(ctx context.Context, c *container.Client, key string, value []byte, exp int64, cond *blob.ModifiedAccessConditions) (string, error) {
	res, err := c.NewBlockBlobClient(storeBlob(key)).Upload(ctx, streaming.NopCloser(bytes.NewReader(value)), &blockblob.UploadOptions{
		Metadata:         map[string]*string{storeExpiry: to.Ptr(strconv.FormatInt(exp, 10))},
		AccessConditions: &blob.AccessConditions{ModifiedAccessConditions: cond},
	})
	if err != nil {
		return "", err
	}
	return storeRev(res.ETag, exp)
}

// conflict reports whether err is a refused condition, or a blob that is
// not there for an If-Match.
func conflict(err error) bool {
	return bloberror.HasCode(err, bloberror.ConditionNotMet, bloberror.BlobAlreadyExists, bloberror.BlobNotFound)
}

// Get implements driver.Store.
func (b *Backend) Get(ctx context.Context, key string) ([]byte, string, error) {
	c, err := b.storeContainer()
	if err != nil {
		return nil, "", err
	}
	res, err := c.NewBlobClient(storeBlob(key)).DownloadStream(ctx, nil)
	if bloberror.HasCode(err, bloberror.BlobNotFound) {
		return nil, "", driver.ErrKeyNotFound
	}
	if err != nil {
		return nil, "", fmt.Errorf("azure: store get: %w", err)
	}
	defer res.Body.Close()
	v, err := io.ReadAll(io.LimitReader(res.Body, driver.MaxValueLen+1))
	if err != nil {
		return nil, "", fmt.Errorf("azure: store get: %w", err)
	}
	exp := expiryIn(res.Metadata)
	if storeExpired(exp) {
		return nil, "", driver.ErrKeyNotFound
	}
	rev, err := storeRev(res.ETag, exp)
	if err != nil {
		return nil, "", err
	}
	return v, rev, nil
}

// Create implements driver.Store.
func (b *Backend) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	c, err := b.storeContainer()
	if err != nil {
		return "", err
	}
	exp := storeExpiryOf(ttl)
	for {
		rev, err := b.upload(ctx, c, key, value, exp, &blob.ModifiedAccessConditions{IfNoneMatch: to.Ptr(azcore.ETagAny)})
		if err == nil {
			return rev, nil
		}
		if !conflict(err) {
			return "", fmt.Errorf("azure: store create: %w", err)
		}
		props, err := c.NewBlobClient(storeBlob(key)).GetProperties(ctx, nil)
		if bloberror.HasCode(err, bloberror.BlobNotFound) {
			continue // deleted meanwhile: create again
		}
		if err != nil {
			return "", fmt.Errorf("azure: store create: %w", err)
		}
		if !storeExpired(expiryIn(props.Metadata)) || props.ETag == nil {
			return "", driver.ErrKeyExists
		}
		rev, err = b.upload(ctx, c, key, value, exp, &blob.ModifiedAccessConditions{IfMatch: props.ETag})
		if conflict(err) {
			return "", driver.ErrKeyExists // another process took its place first
		}
		if err != nil {
			return "", fmt.Errorf("azure: store create: %w", err)
		}
		return rev, nil
	}
}

// Update implements driver.Store.
func (b *Backend) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	c, err := b.storeContainer()
	if err != nil {
		return "", err
	}
	etag, old, ok := parseStoreRev(rev)
	if !ok || storeExpired(old) {
		return "", driver.ErrRevision
	}
	nrev, err := b.upload(ctx, c, key, value, storeExpiryOf(ttl), &blob.ModifiedAccessConditions{IfMatch: &etag})
	if conflict(err) {
		return "", driver.ErrRevision
	}
	if err != nil {
		return "", fmt.Errorf("azure: store update: %w", err)
	}
	return nrev, nil
}

// Delete implements driver.Store.
func (b *Backend) Delete(ctx context.Context, key, rev string) error {
	c, err := b.storeContainer()
	if err != nil {
		return err
	}
	var opts *blob.DeleteOptions
	if rev != "" {
		etag, exp, ok := parseStoreRev(rev)
		if !ok || storeExpired(exp) {
			return driver.ErrRevision
		}
		opts = &blob.DeleteOptions{AccessConditions: &blob.AccessConditions{
			ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &etag}}}
	}
	_, err = c.NewBlobClient(storeBlob(key)).Delete(ctx, opts)
	switch {
	case err == nil:
		return nil
	case rev == "" && bloberror.HasCode(err, bloberror.BlobNotFound):
		return nil
	case rev != "" && conflict(err):
		return driver.ErrRevision
	}
	return fmt.Errorf("azure: store delete: %w", err)
}

// List implements driver.Store.
func (b *Backend) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	c, err := b.storeContainer()
	if err != nil {
		return nil, err
	}
	opts := &container.ListBlobsFlatOptions{
		Include:    container.ListBlobsInclude{Metadata: true},
		Prefix:     to.Ptr(storeBlob(prefix)),
		MaxResults: to.Ptr(int32(min(5000, max(limit, 100)))),
	}
	if after > prefix {
		opts.StartFrom = to.Ptr(storeBlob(after))
	}
	var keys []string
	pager := c.NewListBlobsFlatPager(opts)
	for pager.More() && len(keys) < limit {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("azure: store list: %w", err)
		}
		for _, it := range page.Segment.BlobItems {
			if it.Name == nil {
				continue
			}
			raw, err := hex.DecodeString(strings.TrimPrefix(*it.Name, storeFolder))
			k := string(raw)
			if err != nil || k <= after || !strings.HasPrefix(k, prefix) || storeExpired(expiryIn(it.Metadata)) {
				continue
			}
			keys = append(keys, k)
			if len(keys) == limit {
				break
			}
		}
	}
	return keys, nil
}
