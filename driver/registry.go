package driver

import (
	"context"
	"net/url"
	"sort"
	"sync"
)

// Opener opens a backend from a URL of its scheme. It must not put the URL's
// password in its errors.
type Opener func(ctx context.Context, u *url.URL) (Backend, error)

// The scheme registry, like database/sql's: a backend package registers its
// scheme from an init function, so importing it is enough for
// asyncplatform.Open to open its URLs.
var (
	openersMu sync.RWMutex
	openers   = map[string]Opener{}
)

// Register makes a backend openable for the given URL scheme. It panics when
// the scheme is empty, the opener nil, or the scheme taken: those are
// programming errors, caught at init.
func Register(scheme string, open Opener) {
	openersMu.Lock()
	defer openersMu.Unlock()
	switch {
	case scheme == "" || open == nil:
		panic("driver: Register with an empty scheme or a nil opener")
	case openers[scheme] != nil:
		panic("driver: Register called twice for scheme " + scheme)
	}
	openers[scheme] = open
}

// Lookup returns the opener registered for scheme, or nil.
func Lookup(scheme string) Opener {
	openersMu.RLock()
	defer openersMu.RUnlock()
	return openers[scheme]
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	openersMu.RLock()
	defer openersMu.RUnlock()
	out := make([]string, 0, len(openers))
	for s := range openers {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}
