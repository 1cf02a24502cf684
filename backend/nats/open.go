package nats

import (
	"context"
	"net/url"

	"github.com/asyncplatform/asyncplatform/driver"
)

func init() {
	driver.Register("nats", openURL)
}

// openURL opens a Backend for asyncplatform.Open from a nats:// URL (see the
// package documentation, URLs). The Backend dials, and closes, its own
// connection.
func openURL(ctx context.Context, u *url.URL) (driver.Backend, error) {
	cfg := Config{Stream: u.Query().Get("stream")}
	nu := *u
	nu.RawQuery = ""
	cfg.URL = nu.String()
	return New(ctx, cfg)
}
