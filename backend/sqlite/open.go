package sqlite

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

func init() {
	driver.Register("sqlite", openURL)
}

// openURL opens a Backend for asyncplatform.Open (see the package
// documentation, URLs).
func openURL(ctx context.Context, u *url.URL) (driver.Backend, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return New(ctx, cfg)
}

// parseURL reads a sqlite:///path/jobs.db URL. Its errors name the
// parameter.
func parseURL(u *url.URL) (Config, error) {
	var cfg Config
	if u.Host != "" && u.Host != "localhost" {
		return Config{}, fmt.Errorf("sqlite: URL host %q: want sqlite:///path/to/file.db (three slashes, an absolute path)", u.Host)
	}
	if u.Opaque != "" {
		return Config{}, fmt.Errorf("sqlite: URL %q: want sqlite:///path/to/file.db (three slashes, an absolute path)", u.Scheme+":"+u.Opaque)
	}
	if u.User != nil {
		return Config{}, fmt.Errorf("sqlite: URL with a user: a database file has none")
	}
	cfg.Path = u.Path
	if cfg.Path == "" || cfg.Path == "/" {
		return Config{}, fmt.Errorf("sqlite: URL has no file path: want sqlite:///path/to/file.db")
	}
	q := u.Query()
	for name := range q {
		switch name {
		case "prefix", "dead_hold", "idle_wait", "busy_timeout", "max_body", "max_conns":
		default:
			return Config{}, fmt.Errorf("sqlite: URL parameter %s: unknown (want prefix, dead_hold, idle_wait, busy_timeout, max_body, max_conns)", name)
		}
	}
	cfg.Prefix = q.Get("prefix")
	for _, d := range []struct {
		name string
		to   *time.Duration
	}{{"dead_hold", &cfg.DeadHold}, {"idle_wait", &cfg.IdleWait}, {"busy_timeout", &cfg.BusyTimeout}} {
		if v := q.Get(d.name); v != "" {
			t, err := time.ParseDuration(v)
			if err != nil || t <= 0 {
				return Config{}, fmt.Errorf("sqlite: URL parameter %s=%q: want a positive duration (1s, 500ms)", d.name, v)
			}
			*d.to = t
		}
	}
	for _, n := range []struct {
		name string
		to   *int
	}{{"max_body", &cfg.MaxBody}, {"max_conns", &cfg.MaxConns}} {
		if v := q.Get(n.name); v != "" {
			k, err := strconv.Atoi(v)
			if err != nil || k <= 0 {
				return Config{}, fmt.Errorf("sqlite: URL parameter %s=%q: want a positive number", n.name, v)
			}
			*n.to = k
		}
	}
	return cfg, nil
}
