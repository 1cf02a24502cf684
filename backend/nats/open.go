package nats

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	gonats "github.com/nats-io/nats.go"

	"github.com/asyncplatform/asyncplatform/driver"
)

func init() {
	driver.Register("nats", openURL)
}

// openURL opens a Backend for asyncplatform.Open from a nats:// URL (see the
// package documentation, URLs). The Backend dials, and closes, its own
// connection.
func openURL(ctx context.Context, u *url.URL) (driver.Backend, error) {
	cfg, err := configOf(u)
	if err != nil {
		return nil, err
	}
	return New(ctx, cfg)
}

// configOf turns a nats:// URL into a Config: the hosts (comma-separated)
// become Config.URL, one server URL each, and the user part becomes a
// dial option, so that it reaches whichever server the client dials. Its
// errors never quote the URL's user part.
func configOf(u *url.URL) (Config, error) {
	q := u.Query()
	for k := range q {
		if k != "stream" && k != "replicas" {
			return Config{}, fmt.Errorf("nats: unknown URL parameter %q (want stream, replicas)", k)
		}
	}
	cfg := Config{Stream: q.Get("stream")}
	if r := q.Get("replicas"); r != "" {
		n, err := strconv.Atoi(r)
		if err != nil || n < 1 || n > 5 {
			return Config{}, fmt.Errorf("nats: URL parameter replicas=%q: want 1 to 5", r)
		}
		cfg.Replicas = n
	}
	var hosts []string
	for _, h := range strings.Split(u.Host, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, (&url.URL{Scheme: u.Scheme, Host: h}).String())
		}
	}
	if len(hosts) == 0 {
		return Config{}, fmt.Errorf("nats: the URL names no server")
	}
	cfg.URL = strings.Join(hosts, ",")
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			cfg.Options = append(cfg.Options, gonats.UserInfo(u.User.Username(), pw))
		} else {
			cfg.Options = append(cfg.Options, gonats.Token(u.User.Username()))
		}
	}
	return cfg, nil
}
