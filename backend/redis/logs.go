package redis

import (
	"context"
	"fmt"
	"log/slog"

	goredis "github.com/redis/go-redis/v9"
)

// SetClientLogger sends go-redis's own log lines (reconnects, pool
// warnings), which it otherwise writes to stderr, to l at Warn, with the
// attribute component=go-redis. A nil l discards them.
//
// It is process-wide, like slog.SetDefault: go-redis (v9.23) keeps one
// logger for the whole process and offers no per-client one (its Options
// have no logger; goredis.SetLogger is its only hook), so it cannot be a
// Config field. Call it once, from main, at start-up; the Backend never
// calls it, and its own logs go to Config.Logger.
func SetClientLogger(l *slog.Logger) {
	goredis.SetLogger(clientLogger{l})
}

type clientLogger struct{ l *slog.Logger }

func (c clientLogger) Printf(ctx context.Context, format string, v ...any) {
	if c.l == nil {
		return
	}
	c.l.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
