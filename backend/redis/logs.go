package redis

import (
	"context"
	"fmt"
	"log/slog"

	goredis "github.com/redis/go-redis/v9"
)

// SetClientLogger sends go-redis's own log lines (reconnects, pool
// warnings), which it otherwise writes to stderr, to l at Warn, with the
// attribute component=go-redis. go-redis keeps one logger for the whole
// process, so this is process-wide, like slog.SetDefault: call it once at
// start-up. A nil l discards them.
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
