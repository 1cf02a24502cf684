package redis

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// go-redis's own log lines go to the logger given to SetClientLogger, not to
// stderr.
func TestSetClientLogger(t *testing.T) {
	var buf lockedBuffer // go-redis logs from its pool's goroutines
	SetClientLogger(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { SetClientLogger(slog.Default()) })
	// A pool connection that fails to dial makes go-redis log.
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MinIdleConns: 1, DialTimeout: 50 * time.Millisecond, MaxRetries: -1})
	_ = rdb.Ping(context.Background()).Err()
	time.Sleep(200 * time.Millisecond)
	rdb.Close()
	if !strings.Contains(buf.String(), "component=go-redis") {
		t.Errorf("logged: %q", buf.String())
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
