package status

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/internal/kv"
)

// slowUpdates is a batcher whose every Update takes delay.
type slowUpdates struct {
	*batcher
	delay time.Duration
}

func (s *slowUpdates) Update(ctx context.Context, key string, value []byte, rev string, ttl time.Duration) (string, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return s.batcher.Update(ctx, key, value, rev, ttl)
}

// Config.Timeout bounds each store call of an end, not a whole batch of
// them: ends written together, each well within the timeout, are all
// written however many share the batch.
func TestEndsTimeoutPerWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &batcher{Store: newStore(t)}
	s := &slowUpdates{batcher: b, delay: 100 * time.Millisecond}
	cfg := func(w string) Config {
		return Config{
			Store: kv.Of(s, kv.Status), All: true, Retention: time.Hour, Worker: w,
			Timeout: 2 * time.Second, Poll: time.Hour,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Now:    func() time.Time { return clock },
		}
	}
	tk, other := New(cfg("w1")), New(cfg("w2"))
	const n = 400 // 25 rounds of EndWriters writes of 100ms: 2.5s, over the timeout
	jobs := make([]Job, n)
	for i := range jobs {
		jobs[i] = Job{ID: fmt.Sprintf("j%d", i), Queue: "q", Type: "t", Nonce: "n"}
	}
	tk.Enqueued(ctx, jobs)
	open := b.shut()
	for _, j := range jobs {
		settle(t, tk, j)
	}
	open()
	flush(t, tk)
	lost := 0
	for _, j := range jobs {
		if r := get(t, other, j.ID); r.State != Succeeded {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d ends not written, each write within the timeout", lost, n)
	}
}
