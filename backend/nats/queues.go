package nats

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.QueueLister = (*Backend)(nil)

// Queues implements driver.QueueLister. The streams are shared by every
// queue and Declare makes nothing, so a queue is found by what it has: a
// work consumer (made by the first Receive, so a queue a worker serves is
// listed while empty), a dead-letter consumer (made by the first NextDead),
// or messages under its subject in the work, delay or dead-letter stream.
// A queue that was only declared is not listed. It costs two consumer
// listings and three stream-info requests filtered on the streams' subjects,
// each answering one entry per queue.
func (b *Backend) Queues(ctx context.Context) ([]string, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	found := map[string]bool{}
	add := func(tok string) {
		if q, ok := untoken(tok); ok && driver.CheckQueue(q) == nil {
			found[q] = true
		}
	}
	for _, c := range []struct {
		s      jetstream.Stream
		prefix string
	}{{b.work, "w_"}, {b.dead, "d_"}} {
		names := c.s.ConsumerNames(ctx)
		for name := range names.Name() {
			if tok, ok := strings.CutPrefix(name, c.prefix); ok {
				add(tok)
			}
		}
		if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
			return nil, fmt.Errorf("nats: list queues: consumers of %s: %w", c.s.CachedInfo().Config.Name, err)
		}
	}
	for _, s := range []struct {
		s      jetstream.Stream
		prefix string
	}{
		{b.work, b.cfg.Stream + ".q."},
		{b.delay, b.cfg.Stream + ".delay."},
		{b.dead, b.cfg.Stream + ".dead."},
	} {
		info, err := s.s.Info(ctx, jetstream.WithSubjectFilter(s.prefix+"*"))
		if err != nil {
			return nil, fmt.Errorf("nats: list queues: subjects %s*: %w", s.prefix, err)
		}
		for subj, n := range info.State.Subjects {
			if tok, ok := strings.CutPrefix(subj, s.prefix); ok && n > 0 {
				add(tok)
			}
		}
	}
	names := make([]string, 0, len(found))
	for q := range found {
		names = append(names, q)
	}
	sort.Strings(names)
	return names, nil
}

// untoken is the inverse of token: "__" is '_', "_d" is '.'. Any other use
// of '_' is not a token of a queue name.
func untoken(tok string) (string, bool) {
	if !strings.Contains(tok, "_") {
		return tok, tok != ""
	}
	var sb strings.Builder
	for i := 0; i < len(tok); i++ {
		if tok[i] != '_' {
			sb.WriteByte(tok[i])
			continue
		}
		if i+1 == len(tok) {
			return "", false
		}
		switch tok[i+1] {
		case '_':
			sb.WriteByte('_')
		case 'd':
			sb.WriteByte('.')
		default:
			return "", false
		}
		i++
	}
	return sb.String(), true
}
