package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"

	"github.com/asyncplatform/asyncplatform/driver"
)

// ErrUnknownScheme is returned by Open for a URL whose scheme no imported
// backend registered (see driver.Register).
var ErrUnknownScheme = errors.New("no backend registered for this URL scheme")

// Open opens a backend from a URL such as memory://, redis://host:6379/0,
// amqp://user:pass@host:5672/, nats://host:4222 or sqlite:///path/jobs.db,
// provided the backend's package is imported. The caller closes the backend. Errors never include
// the URL's credentials, in any form a backend's error may quote them: the
// user part (a user with no password is taken for a token, as NATS token
// auth has it), the password raw or percent-decoded, and the values of query
// parameters named like secrets (password, token, key, secret, sig…).
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
// (azure:<connection string>) are named by scheme alone; the user part
// becomes "xxxxx" (a user with no password may be a token: NATS token auth),
// or "user:xxxxx" with a password; query parameters named like secrets
// (password, token, key, secret, sig…) have their values replaced.
func describeURL(u *url.URL) string {
	if u.Opaque != "" {
		return u.Scheme + ":…"
	}
	nu := *u
	if nu.User != nil {
		if _, ok := nu.User.Password(); ok {
			nu.User = url.UserPassword(nu.User.Username(), "xxxxx")
		} else {
			nu.User = url.User("xxxxx")
		}
	}
	if nu.RawQuery != "" {
		q, err := url.ParseQuery(nu.RawQuery)
		if err != nil {
			nu.RawQuery = "…"
		} else {
			for k := range q {
				if secretName.MatchString(k) {
					q[k] = []string{"xxxxx"}
				}
			}
			nu.RawQuery = q.Encode()
		}
	}
	nu.Fragment, nu.RawFragment = "", ""
	return nu.String()
}

// secretName matches the names of URL query or connection-string parameters
// whose values are secrets, or may hold one (a nested URL or DSN, as
// postgres's listen_url).
var secretName = regexp.MustCompile(`(?i)pass|pwd|secret|token|key|sig|credential|auth|url|dsn`)

// secretParam finds parameters named like secrets and their values in a URL
// or connection string (name=value, separated by & or ;).
var secretParam = regexp.MustCompile(`(?i)(?:pass|pwd|secret|token|key|sig|credential|auth)[^=;&?#/]*=([^;&#]+)`)

// urlSecrets returns the secrets of a backend URL in every form an error may
// quote them: the user part (raw as written, decoded, and as Go re-encodes
// it), the password alone, a user with no password (a token), and the
// values of parameters named like secrets, raw and decoded.
func urlSecrets(rawURL string) []string {
	var out []string
	add := func(s string) {
		out = append(out, s)
		if d, err := url.PathUnescape(s); err == nil {
			out = append(out, d)
		}
		if d, err := url.QueryUnescape(s); err == nil {
			out = append(out, d)
		}
		out = append(out, url.PathEscape(s), url.QueryEscape(s))
	}
	if _, rest, ok := strings.Cut(rawURL, "://"); ok {
		authority := rest
		if i := strings.IndexAny(authority, "/?#"); i >= 0 {
			authority = authority[:i]
		}
		if i := strings.LastIndex(authority, "@"); i >= 0 {
			userinfo := authority[:i]
			add(userinfo)
			user, pw, hasPW := strings.Cut(userinfo, ":")
			if hasPW {
				add(pw)
			} else {
				add(user) // a token
			}
		}
	}
	if u, err := url.Parse(rawURL); err == nil && u.User != nil {
		add(u.User.String())
		if pw, ok := u.User.Password(); ok {
			add(pw)
			out = append(out, url.UserPassword(u.User.Username(), pw).String())
		} else {
			add(u.User.Username())
		}
	}
	for _, m := range secretParam.FindAllStringSubmatch(rawURL, -1) {
		add(m[1])
	}
	return out
}

// minSecret is the length under which a secret is not replaced where an
// error quotes it (it would garble the text) but hides the whole text.
const minSecret = 4

// redactErr keeps the URL's secrets (see urlSecrets) out of err's text,
// keeping the chain for errors.Is/As. A secret too short to replace safely
// that the text holds hides the text altogether.
func redactErr(err error, rawURL string) error {
	text := err.Error()
	secrets := urlSecrets(rawURL)
	// Longest first, so that a secret's part never leaves the rest of it.
	sort.Slice(secrets, func(i, j int) bool { return len(secrets[i]) > len(secrets[j]) })
	changed := false
	for _, s := range secrets {
		if s == "" || !strings.Contains(text, s) {
			continue
		}
		if len(s) < minSecret {
			return &redacted{err: err, text: "(the error's text is not shown: it holds a credential of the URL)"}
		}
		text, changed = strings.ReplaceAll(text, s, "xxxxx"), true
	}
	if !changed {
		return err
	}
	return &redacted{err: err, text: text}
}

type redacted struct {
	err  error
	text string
}

func (r *redacted) Error() string { return r.text }
func (r *redacted) Unwrap() error { return r.err }
