package nats

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The store (driver.Store) is a JetStream KV bucket named
// Config.Stream+"_STORE" (its stream is KV_<Stream>_STORE), with the
// streams' storage and replicas and a history of one, made on first use.
// A replicated bucket has direct gets turned off, so that every read is the
// leader's (a follower's answer can be behind a write just acknowledged):
// the backend makes its stream itself, as CreateKeyValue would but for
// that, and turns them off on a replicated bucket made before.
//
// Keys: each '/'-separated segment of a store key is one token of the KV
// key, with the bytes KV keys cannot hold ('.', ':', '=') written as "=XX"
// (hex): "app/jobs/a.b" is "app.jobs.a=2Eb".
//
// Revisions are the KV revisions (stream sequences, never reused), with the
// expiry after a '.' for a key that has one: "<seq>" or "<seq>.<expiry µs>".
//
// TTLs: NATS 2.9 has no per-key TTL, so each value starts with a header of
// nine bytes (a version byte, then the expiry in Unix microseconds, zero for
// none) and an expired key is treated as absent. Expiry is judged by the
// clock of the process that reads, against the one that wrote: keep the
// workers' clocks in sync. Update and Delete at a revision check the expiry
// the revision carries, so each is one conditional publish
// (Nats-Expected-Last-Subject-Sequence). An expired key keeps its space
// until it is written again or deleted; a deleted one leaves a delete
// marker, as KV deletes do.
//
// List reads the subjects under the longest whole-segment part of the prefix
// (a stream info request with a subject filter), sorts them, and reads the
// keys of the page one by one: its cost grows with the keys under that part
// (names only) and with the page.

var _ driver.Store = (*Backend)(nil)

// storeSuffix ends the name of the store's bucket.
const storeSuffix = "_STORE"

// storeVersion is the first byte of every stored value.
const storeVersion = 1

// storeState opens the bucket once.
type storeState struct {
	mu     sync.Mutex
	kv     jetstream.KeyValue
	stream jetstream.Stream // the bucket's stream, for List
}

// bucket returns the store's KV bucket, making it on first use.
func (b *Backend) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	s := &b.store
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kv != nil {
		return s.kv, nil
	}
	name := b.cfg.Stream + storeSuffix
	kv, err := b.js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) && b.replicas > 1 {
		// Made as CreateKeyValue makes it, but with direct gets off (see
		// below), so that no process reads it from a follower meanwhile.
		_, err = b.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:              "KV_" + name,
			Description:       "asyncplatform store",
			Subjects:          []string{"$KV." + name + ".>"},
			MaxMsgsPerSubject: 1,
			MaxMsgs:           -1,
			MaxBytes:          -1,
			MaxMsgSize:        -1,
			MaxConsumers:      -1,
			Storage:           b.cfg.Storage,
			Replicas:          b.replicas,
			AllowRollup:       true,
			DenyDelete:        true,
			Duplicates:        2 * time.Minute,
			Discard:           jetstream.DiscardNew,
		})
		if err == nil {
			var st jetstream.Stream
			if st, err = b.js.Stream(ctx, "KV_"+name); err == nil {
				err = waitLeader(ctx, st)
			}
		}
		if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = b.js.KeyValue(ctx, name)
		}
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      name,
			Description: "asyncplatform store",
			History:     1,
			Storage:     b.cfg.Storage,
			Replicas:    b.replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = b.js.KeyValue(ctx, name) // made by another process meanwhile
		}
	}
	if err != nil {
		return nil, fmt.Errorf("nats: store bucket %s: %w", name, err)
	}
	stream, err := b.js.Stream(ctx, "KV_"+name)
	if err != nil {
		return nil, fmt.Errorf("nats: store bucket %s: %w", name, err)
	}
	if cfg := stream.CachedInfo().Config; cfg.AllowDirect && cfg.Replicas > 1 {
		// A replicated bucket answers direct gets from any replica, a
		// follower's possibly behind the leader: a key read just after its
		// write could read the value before (TestClusterConformance's
		// Outcomes/StatusWalk and Schedule/OnePerTick failed so). Reads go
		// to the leader instead.
		cfg.AllowDirect = false
		if stream, err = b.js.UpdateStream(ctx, cfg); err == nil {
			kv, err = b.js.KeyValue(ctx, name)
		}
		if err != nil {
			return nil, fmt.Errorf("nats: store bucket %s: read from the leader: %w", name, err)
		}
	}
	s.kv, s.stream = kv, stream
	return kv, nil
}

// kvKey maps a store key (or a whole-segment prefix) to a KV key.
func kvKey(key string) string {
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c == '/':
			b.WriteByte('.')
		case c == '.' || c == ':' || c == '=':
			fmt.Fprintf(&b, "=%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// storeKey maps a KV key back to the store key.
func storeKey(k string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		switch c := k[i]; c {
		case '.':
			b.WriteByte('/')
		case '=':
			if i+2 >= len(k) {
				return "", false
			}
			n, err := strconv.ParseUint(k[i+1:i+3], 16, 8)
			if err != nil {
				return "", false
			}
			b.WriteByte(byte(n))
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// expiryOf returns the expiry of a key written now with ttl, in Unix
// microseconds rounded up (zero: none).
func expiryOf(ttl time.Duration) int64 {
	if ttl <= 0 {
		return 0
	}
	return (time.Now().Add(ttl).UnixNano() + 999) / 1000
}

func expired(exp int64) bool { return exp != 0 && time.Now().UnixMicro() >= exp }

func encodeValue(value []byte, exp int64) []byte {
	out := make([]byte, 9, 9+len(value))
	out[0] = storeVersion
	binary.BigEndian.PutUint64(out[1:], uint64(exp))
	return append(out, value...)
}

func decodeValue(raw []byte) (value []byte, exp int64, err error) {
	if len(raw) < 9 || raw[0] != storeVersion {
		return nil, 0, errors.New("nats: store: a value not written by this store")
	}
	return raw[9:], int64(binary.BigEndian.Uint64(raw[1:9])), nil
}

func formatRev(seq uint64, exp int64) string {
	if exp == 0 {
		return strconv.FormatUint(seq, 10)
	}
	return strconv.FormatUint(seq, 10) + "." + strconv.FormatInt(exp, 10)
}

// parseRev returns the sequence and expiry of a revision; ok is false for
// one this store cannot have made.
func parseRev(rev string) (seq uint64, exp int64, ok bool) {
	s, e, dot := strings.Cut(rev, ".")
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || seq == 0 {
		return 0, 0, false
	}
	if dot {
		if exp, err = strconv.ParseInt(e, 10, 64); err != nil || exp <= 0 {
			return 0, 0, false
		}
	}
	return seq, exp, true
}

// Get implements driver.Store.
func (b *Backend) Get(ctx context.Context, key string) ([]byte, string, error) {
	kv, err := b.bucket(ctx)
	if err != nil {
		return nil, "", err
	}
	e, err := kv.Get(ctx, kvKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, "", driver.ErrKeyNotFound
	}
	if err != nil {
		return nil, "", fmt.Errorf("nats: store get: %w", err)
	}
	v, exp, err := decodeValue(e.Value())
	if err != nil {
		return nil, "", err
	}
	if expired(exp) {
		return nil, "", driver.ErrKeyNotFound
	}
	return v, formatRev(e.Revision(), exp), nil
}

// Create implements driver.Store: a KV Create, or, over an expired key, a
// KV Update at its revision.
func (b *Backend) Create(ctx context.Context, key string, value []byte, ttl time.Duration) (string, error) {
	kv, err := b.bucket(ctx)
	if err != nil {
		return "", err
	}
	k, exp := kvKey(key), expiryOf(ttl)
	raw := encodeValue(value, exp)
	for {
		seq, err := kv.Create(ctx, k, raw)
		if err == nil {
			return formatRev(seq, exp), nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", fmt.Errorf("nats: store create: %w", err)
		}
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted meanwhile: create again
		}
		if err != nil {
			return "", fmt.Errorf("nats: store create: %w", err)
		}
		_, old, err := decodeValue(e.Value())
		if err == nil && !expired(old) {
			return "", driver.ErrKeyExists
		}
		seq, err = kv.Update(ctx, k, raw, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return "", driver.ErrKeyExists // another process took its place first
		}
		if err != nil {
			return "", fmt.Errorf("nats: store create: %w", err)
		}
		return formatRev(seq, exp), nil
	}
}

// Update implements driver.Store: one KV Update at the revision's sequence,
// unless the revision's expiry has passed.
func (b *Backend) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	seq, old, ok := parseRev(rev)
	if !ok || expired(old) {
		if b.closed.Load() {
			return "", driver.ErrClosed
		}
		return "", driver.ErrRevision
	}
	kv, err := b.bucket(ctx)
	if err != nil {
		return "", err
	}
	exp := expiryOf(ttl)
	nseq, err := kv.Update(ctx, kvKey(key), encodeValue(value, exp), seq)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return "", driver.ErrRevision
	}
	if err != nil {
		return "", fmt.Errorf("nats: store update: %w", err)
	}
	return formatRev(nseq, exp), nil
}

var _ driver.StoreBatchUpdater = (*Backend)(nil)

// UpdateEach implements driver.StoreBatchUpdater: each item's KV update
// (its value published to its key's subject, expected at its revision's
// sequence, as Update does) sent at once, and the acks awaited together:
// one round trip for the batch. An item whose key moved on is refused by
// the stream alone (wrong last sequence): ErrRevision.
func (b *Backend) UpdateEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if _, err := b.bucket(ctx); err != nil {
		return nil, err
	}
	pre := "$KV." + b.cfg.Stream + storeSuffix + "."
	out := make([]driver.BatchResult, len(items))
	futures := make([]jetstream.PubAckFuture, len(items))
	exps := make([]int64, len(items))
	for i, it := range items {
		seq, old, ok := parseRev(it.Rev)
		if !ok || expired(old) {
			out[i].Err = driver.ErrRevision
			continue
		}
		exps[i] = expiryOf(it.TTL)
		m := &gonats.Msg{Subject: pre + kvKey(it.Key), Header: gonats.Header{}, Data: encodeValue(it.Value, exps[i])}
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(seq, 10))
		f, err := b.js.PublishMsgAsync(m)
		if err != nil {
			return nil, fmt.Errorf("nats: store update: %w", err)
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case pa := <-f.Ok():
			out[i].Rev = formatRev(pa.Sequence, exps[i])
		case err := <-f.Err():
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
				apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
				out[i].Err = driver.ErrRevision
				continue
			}
			return nil, fmt.Errorf("nats: store update: %w", err)
		case <-ctx.Done():
			return nil, fmt.Errorf("nats: store update: waiting for acks: %w", ctx.Err())
		}
	}
	return out, nil
}

var _ driver.StoreBatchValueDeleter = (*Backend)(nil)

// getWorkers bounds the KV reads DeleteValueEach has in flight at once.
const getWorkers = 32

// DeleteValueEach implements driver.StoreBatchValueDeleter: the keys read
// at once (getWorkers requests in flight), then a delete marker for each
// key found at its item's revision with its item's value, published at
// the sequence read, and the acks awaited together: two round trips for
// the batch. A key written between the read and the marker is refused by
// the stream (wrong last sequence): ErrRevision.
func (b *Backend) DeleteValueEach(ctx context.Context, items []driver.BatchItem) ([]driver.BatchResult, error) {
	if _, err := b.bucket(ctx); err != nil {
		return nil, err
	}
	seqs := make([]uint64, len(items)) // 0: not deleted
	errs := make([]error, len(items))
	sem := make(chan struct{}, getWorkers)
	var wg sync.WaitGroup
	for i, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			v, rev, err := b.Get(ctx, it.Key)
			switch {
			case errors.Is(err, driver.ErrKeyNotFound):
			case err != nil:
				errs[i] = err
			case (it.Rev == "" || rev == it.Rev) && bytes.Equal(v, it.Value):
				seqs[i], _, _ = parseRev(rev)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("nats: store delete: %w", err)
	}
	pre := "$KV." + b.cfg.Stream + storeSuffix + "."
	out := make([]driver.BatchResult, len(items))
	futures := make([]jetstream.PubAckFuture, len(items))
	for i, it := range items {
		if seqs[i] == 0 {
			out[i].Err = driver.ErrRevision
			continue
		}
		m := &gonats.Msg{Subject: pre + kvKey(it.Key), Header: gonats.Header{}}
		m.Header.Set("KV-Operation", "DEL")
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(seqs[i], 10))
		f, err := b.js.PublishMsgAsync(m)
		if err != nil {
			return nil, fmt.Errorf("nats: store delete: %w", err)
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
				apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
				out[i].Err = driver.ErrRevision
				continue
			}
			return nil, fmt.Errorf("nats: store delete: %w", err)
		case <-ctx.Done():
			return nil, fmt.Errorf("nats: store delete: waiting for acks: %w", ctx.Err())
		}
	}
	return out, nil
}

// Delete implements driver.Store: a KV Delete (a delete marker), at the
// revision's sequence when one is given.
func (b *Backend) Delete(ctx context.Context, key, rev string) error {
	var opts []jetstream.KVDeleteOpt
	if rev != "" {
		seq, exp, ok := parseRev(rev)
		if !ok || expired(exp) {
			if b.closed.Load() {
				return driver.ErrClosed
			}
			return driver.ErrRevision
		}
		opts = append(opts, jetstream.LastRevision(seq))
	}
	kv, err := b.bucket(ctx)
	if err != nil {
		return err
	}
	err = kv.Delete(ctx, kvKey(key), opts...)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return driver.ErrRevision
	}
	if err != nil {
		return fmt.Errorf("nats: store delete: %w", err)
	}
	return nil
}

// List implements driver.Store: the subjects of the bucket's stream under
// the filter (a stream info request, paged by the client), sorted, then a
// Get of each in order until the page is full, skipping deleted and expired
// keys. (A KV watch would read every value under the filter, and its
// end-of-initial-values marker was seen not to come on NATS 2.9 once delete
// markers were among the subjects.)
func (b *Backend) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	kv, err := b.bucket(ctx)
	if err != nil {
		return nil, err
	}
	pre := "$KV." + kv.Bucket() + "."
	filter := pre + ">"
	if i := strings.LastIndexByte(prefix, '/'); i > 0 {
		filter = pre + kvKey(prefix[:i]) + ".>"
	}
	info, err := b.store.stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("nats: store list: %w", err)
	}
	var cands []string
	for subj := range info.State.Subjects {
		k, ok := storeKey(strings.TrimPrefix(subj, pre))
		if ok && strings.HasPrefix(k, prefix) && k > after {
			cands = append(cands, k)
		}
	}
	slices.Sort(cands)
	var keys []string
	for _, k := range cands {
		if len(keys) == limit {
			break
		}
		e, err := kv.Get(ctx, kvKey(k))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted
		}
		if err != nil {
			return nil, fmt.Errorf("nats: store list: %w", err)
		}
		if _, exp, err := decodeValue(e.Value()); err != nil || expired(exp) {
			continue
		}
		keys = append(keys, k)
	}
	return keys, nil
}
