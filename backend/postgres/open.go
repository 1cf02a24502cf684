package postgres

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

func init() {
	driver.Register("postgres", openURL)
	driver.Register("postgresql", openURL)
}

// openURL opens a Backend for asyncplatform.Open (see the package
// documentation, URLs). The pool it makes is closed with the Backend.
func openURL(ctx context.Context, u *url.URL) (driver.Backend, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return New(ctx, cfg)
}

// parseURL takes the package's own parameters out of u and leaves the
// rest of it to pgx. Its errors name the parameter, never the URL.
func parseURL(u *url.URL) (Config, error) {
	var cfg Config
	q := u.Query()
	take := func(name string) string {
		v := q.Get(name)
		q.Del(name)
		return v
	}
	cfg.Prefix = take("prefix")
	cfg.ListenURL = take("listen_url")
	for _, d := range []struct {
		name string
		to   *time.Duration
	}{{"dead_hold", &cfg.DeadHold}, {"idle_wait", &cfg.IdleWait}} {
		if v := take(d.name); v != "" {
			t, err := time.ParseDuration(v)
			if err != nil || t <= 0 {
				return Config{}, fmt.Errorf("postgres: URL parameter %s=%q: want a positive duration (1s, 500ms)", d.name, v)
			}
			*d.to = t
		}
	}
	if v := take("max_body"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return Config{}, fmt.Errorf("postgres: URL parameter max_body=%q: want a positive number of bytes", v)
		}
		cfg.MaxBody = n
	}
	if v := take("skip_migrate"); v != "" {
		s, err := strconv.ParseBool(v)
		if err != nil {
			return Config{}, fmt.Errorf("postgres: URL parameter skip_migrate=%q: want true or false", v)
		}
		cfg.SkipMigrate = s
	}
	rest := *u
	rest.RawQuery = q.Encode()
	cfg.URL = rest.String()
	return cfg, nil
}
