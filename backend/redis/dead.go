package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// deadHandle is a DeadDelivery's receipt: the queue and the hold token.
type deadHandle struct {
	queue, token string
}

// encodeDead frames a record as "<len(id)>:<id><body>", so scripts can find
// the ID without knowing anything of the body.
func encodeDead(rec driver.DeadMessage) string {
	var sb strings.Builder
	sb.Grow(len(rec.ID) + len(rec.Body) + 8)
	sb.WriteString(strconv.Itoa(len(rec.ID)))
	sb.WriteByte(':')
	sb.WriteString(rec.ID)
	sb.Write(rec.Body)
	return sb.String()
}

func decodeDead(s string) (driver.DeadMessage, error) {
	c := strings.IndexByte(s, ':')
	if c < 0 {
		return driver.DeadMessage{}, errors.New("dead record without an ID frame")
	}
	n, err := strconv.Atoi(s[:c])
	if err != nil || n < 0 || c+1+n > len(s) {
		return driver.DeadMessage{}, fmt.Errorf("dead record with a bad ID frame %q", s[:c])
	}
	return driver.DeadMessage{ID: s[c+1 : c+1+n], Body: []byte(s[c+1+n:])}, nil
}

// NextDead pops the oldest dead letter into a hold under a new token, for
// DeadHold; ExtendDead renews it. A hold that runs out goes back to the head
// of the list.
func (b *Backend) NextDead(ctx context.Context, queue string) (*driver.DeadDelivery, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	tok := b.token()
	s, err := nextDeadScript.Run(ctx, b.rdb, b.keys(queue), tok, b.cfg.DeadHold.Milliseconds()).Text()
	if err != nil {
		if errors.Is(err, goredis.Nil) {
			return nil, driver.ErrNoDeadLetters
		}
		return nil, fmt.Errorf("redis: next dead letter of %q: %w", queue, err)
	}
	rec, err := decodeDead(s)
	if err != nil {
		// Not ours to judge: hand it out as it is, under no ID.
		rec = driver.DeadMessage{Body: []byte(s)}
	}
	return &driver.DeadDelivery{DeadMessage: rec, Handle: deadHandle{queue: queue, token: tok}}, nil
}

// ExtendDead renews the hold for another DeadHold, unless it ran out.
func (b *Backend) ExtendDead(ctx context.Context, d *driver.DeadDelivery) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	h, err := deadHandleOf(d)
	if err != nil {
		return err
	}
	n, err := extendDeadScript.Run(ctx, b.rdb, b.keys(h.queue), h.token, b.cfg.DeadHold.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("redis: extend dead letter of %q: %w", h.queue, err)
	}
	if n == 0 {
		return fmt.Errorf("redis: extend dead letter of %q: %w", h.queue, driver.ErrLeaseLost)
	}
	return nil
}

// deadHandleOf returns d's receipt.
func deadHandleOf(d *driver.DeadDelivery) (deadHandle, error) {
	if d == nil {
		return deadHandle{}, errors.New("redis: dead letter: nil delivery")
	}
	h, ok := d.Handle.(deadHandle)
	if !ok {
		return deadHandle{}, fmt.Errorf("redis: dead letter: handle %T is not from this backend", d.Handle)
	}
	return h, nil
}

// SettleDead drops the held record (remove) or puts it back at the head.
func (b *Backend) SettleDead(ctx context.Context, d *driver.DeadDelivery, remove bool) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	h, err := deadHandleOf(d)
	if err != nil {
		return err
	}
	flag := "0"
	if remove {
		flag = "1"
	}
	n, err := settleDeadScript.Run(ctx, b.rdb, b.keys(h.queue), h.token, flag).Int()
	if err != nil {
		return fmt.Errorf("redis: settle dead letter of %q: %w", h.queue, err)
	}
	if n == 0 {
		return fmt.Errorf("redis: settle dead letter of %q: %w", h.queue, driver.ErrLeaseLost)
	}
	return nil
}

// ListDead returns a page of the dead list by LRANGE; the cursor is the index
// of the page's first record. Records held by NextDead are not in the list.
// Concurrent pops shift the indexes, so a page may repeat or skip a record
// then.
func (b *Backend) ListDead(ctx context.Context, queue, cursor string, limit int) ([]driver.DeadMessage, string, error) {
	if b.closed.Load() {
		return nil, "", driver.ErrClosed
	}
	if limit < 1 {
		return nil, "", fmt.Errorf("redis: list dead letters of %q: limit %d must be at least 1", queue, limit)
	}
	var start int64
	if cursor != "" {
		var err error
		start, err = strconv.ParseInt(cursor, 10, 64)
		if err != nil || start < 0 {
			return nil, "", fmt.Errorf("redis: list dead letters of %q: bad cursor %q", queue, cursor)
		}
	}
	// One more than asked tells whether there is a next page.
	vals, err := b.rdb.LRange(ctx, b.keys(queue)[keyDead], start, start+int64(limit)).Result()
	if err != nil {
		return nil, "", fmt.Errorf("redis: list dead letters of %q: %w", queue, err)
	}
	next := ""
	if len(vals) > limit {
		vals = vals[:limit]
		next = strconv.FormatInt(start+int64(limit), 10)
	}
	recs := make([]driver.DeadMessage, 0, len(vals))
	for _, v := range vals {
		rec, err := decodeDead(v)
		if err != nil {
			rec = driver.DeadMessage{Body: []byte(v)}
		}
		recs = append(recs, rec)
	}
	return recs, next, nil
}

// deleteWindow is the most dead records one DeleteDead script call scans.
const deleteWindow = 500

// DeleteDead removes the unheld records whose ID is among ids, one script
// call per window of deleteWindow records (see deleteDeadScript), so a delete
// at any depth never holds Redis for long. It is not atomic: a reader may
// see some of the records gone and others not yet.
func (b *Backend) DeleteDead(ctx context.Context, queue string, ids []string) (int, error) {
	if b.closed.Load() {
		return 0, driver.ErrClosed
	}
	if len(ids) == 0 {
		return 0, nil
	}
	args := make([]any, 4, 4+len(ids))
	args[1] = b.window
	args[3] = "\x00deleted:" + b.token()
	for _, id := range ids {
		args = append(args, id)
	}
	keys := b.keys(queue)
	skip, seen, total := int64(0), "", 0
	for {
		args[0], args[2] = skip, seen
		v, err := deleteDeadScript.Run(ctx, b.rdb, keys, args...).Int64Slice()
		if err == nil && len(v) != 4 {
			err = fmt.Errorf("window script returned %d values, want 4", len(v))
		}
		if err != nil {
			return total, fmt.Errorf("redis: delete dead letters of %q: %w", queue, err)
		}
		total += int(v[0])
		skip, seen = v[1], strconv.FormatInt(v[2], 10)
		if v[3] == 1 {
			return total, nil
		}
	}
}

// PurgeDead removes every dead record of the queue, held ones included.
func (b *Backend) PurgeDead(ctx context.Context, queue string) (int, error) {
	if b.closed.Load() {
		return 0, driver.ErrClosed
	}
	n, err := purgeDeadScript.Run(ctx, b.rdb, b.keys(queue)).Int()
	if err != nil {
		return 0, fmt.Errorf("redis: purge dead letters of %q: %w", queue, err)
	}
	return n, nil
}
