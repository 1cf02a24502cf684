package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/asyncplatform/asyncplatform/driver"
)

// ErrUnknownScheme is returned by Open for a URL whose scheme no imported
// backend registered (see driver.Register).
var ErrUnknownScheme = errors.New("no backend registered for this URL scheme")

// Open opens a backend from a URL such as memory://, redis://host:6379/0,
// amqp://user:pass@host:5672/ or nats://host:4222, provided the backend's
// package is imported. The caller closes the backend. Errors never include
// the URL's password.
func Open(ctx context.Context, rawURL string) (driver.Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url's errors quote the whole URL, password and all.
		return nil, fmt.Errorf("asyncplatform: the backend URL does not parse (not shown: it may hold a secret)")
	}
	open := driver.Lookup(u.Scheme)
	if open == nil {
		return nil, fmt.Errorf("asyncplatform: opening a %s: URL: %w %q (registered: %s)", u.Scheme, ErrUnknownScheme, u.Scheme, strings.Join(driver.Schemes(), ", "))
	}
	b, err := open(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("asyncplatform: opening %s: %w", describeURL(u), redactErr(err, rawURL))
	}
	return b, nil
}

// describeURL names a URL for an error without its secrets: opaque forms
// (azure:<connection string>) are named by scheme alone.
func describeURL(u *url.URL) string {
	if u.Opaque != "" {
		return u.Scheme + ":…"
	}
	return u.Redacted()
}

// redactErr keeps a password that an error quotes out of its text, keeping
// the chain for errors.Is/As.
func redactErr(err error, rawURL string) error {
	u, perr := url.Parse(rawURL)
	if perr != nil || u.User == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return &redacted{err: err, text: strings.ReplaceAll(err.Error(), pw, "xxxxx")}
}

type redacted struct {
	err  error
	text string
}

func (r *redacted) Error() string { return r.text }
func (r *redacted) Unwrap() error { return r.err }
