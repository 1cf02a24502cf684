package rabbit

import (
	"context"
	"fmt"
	"net/url"
	"strconv"

	"github.com/asyncplatform/asyncplatform/driver"
)

func init() {
	driver.Register("amqp", openURL)
	driver.Register("amqps", openURL)
}

// openURL opens a Backend for asyncplatform.Open from an amqp:// or
// amqps:// URL (see the package documentation, URLs).
func openURL(ctx context.Context, u *url.URL) (driver.Backend, error) {
	var cfg Config
	q := u.Query()
	if v := q.Get("prefix"); v != "" {
		cfg.Prefix = v
	}
	if v := q.Get("prefetch"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("rabbit: URL parameter prefetch=%q is not a number", v)
		}
		cfg.Prefetch = n
	}
	q.Del("prefix")
	q.Del("prefetch")
	amqpURL := *u
	amqpURL.RawQuery = q.Encode()
	cfg.URL = amqpURL.String()
	return New(ctx, cfg)
}
