package memory

import (
	"context"
	"net/url"
	"sync"

	"github.com/asyncplatform/asyncplatform/driver"
)

// Brokers opened by URL live for the process, by host name: memory://a and
// memory://a share one broker, memory://b is another. memory:// alone is
// "default". See the package documentation, URLs.
var (
	namedMu sync.Mutex
	named   = map[string]*Broker{}
)

func init() {
	driver.Register("memory", openURL)
}

// openURL opens a connection to the broker the URL names.
func openURL(ctx context.Context, u *url.URL) (driver.Backend, error) {
	name := u.Host
	if name == "" {
		name = "default"
	}
	namedMu.Lock()
	br := named[name]
	if br == nil {
		br = NewBroker()
		named[name] = br
	}
	namedMu.Unlock()
	return New(ctx, Config{Broker: br})
}
