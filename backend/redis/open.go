package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The URL schemes the package registers (see the package documentation,
// URLs).
const (
	schemeCluster  = "+cluster"
	schemeSentinel = "+sentinel"
)

func init() {
	for _, s := range []string{"redis", "rediss"} {
		driver.Register(s, openURL)
		driver.Register(s+schemeCluster, openURL)
		driver.Register(s+schemeSentinel, openURL)
	}
}

// URLError reports a Redis URL that Open cannot use. Its text names the
// URL with every password replaced by "xxxxx", and never quotes one.
type URLError struct {
	// URL is the URL with its passwords (the user part's and the values of
	// the password parameters) replaced by "xxxxx".
	URL string
	// Reason says what is wrong.
	Reason string
}

func (e *URLError) Error() string {
	return fmt.Sprintf("redis: bad URL %s: %s", e.URL, e.Reason)
}

// openURL opens a Backend for asyncplatform.Open from a URL of one of the
// package's schemes (see the package documentation, URLs). The client it
// makes is closed with the Backend.
func openURL(ctx context.Context, u *url.URL) (driver.Backend, error) {
	o, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	rdb := o.client()
	b, err := New(ctx, Config{Client: rdb, Prefix: o.prefix, WaitReplicas: o.waitReplicas, WaitTimeout: o.waitTimeout})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &urlBackend{Backend: b, rdb: rdb}, nil
}

// urlOptions is what a URL describes: one of go-redis's three option sets,
// and the prefix parameter.
type urlOptions struct {
	single   *goredis.Options
	cluster  *goredis.ClusterOptions
	sentinel *goredis.FailoverOptions

	prefix       string        // Config.Prefix
	waitReplicas int           // Config.WaitReplicas
	waitTimeout  time.Duration // Config.WaitTimeout
}

// client makes the client the options describe.
func (o urlOptions) client() goredis.UniversalClient {
	switch {
	case o.cluster != nil:
		return goredis.NewClusterClient(o.cluster)
	case o.sentinel != nil:
		return goredis.NewFailoverClient(o.sentinel)
	default:
		return goredis.NewClient(o.single)
	}
}

// parseURL turns a URL of one of the package's schemes into go-redis's
// options: the first host of the host list becomes the host of go-redis's
// own URL form and the others its addr parameters, the path of a Sentinel
// URL its master_name (and database), and the other parameters go to
// go-redis as they are.
func parseURL(u *url.URL) (urlOptions, error) {
	bad := func(format string, args ...any) error {
		return &URLError{URL: redactURL(u), Reason: fmt.Sprintf(format, args...)}
	}
	if u.Opaque != "" {
		return urlOptions{}, bad("want %s://host:port/...", u.Scheme)
	}
	base, kind, _ := strings.Cut(u.Scheme, "+")
	if base != "redis" && base != "rediss" || (kind != "" && "+"+kind != schemeCluster && "+"+kind != schemeSentinel) {
		return urlOptions{}, bad("unknown scheme %q", u.Scheme)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return urlOptions{}, bad("the query does not parse")
	}
	o := urlOptions{prefix: q.Get("prefix")}
	if v := q.Get("wait_replicas"); v != "" {
		if o.waitReplicas, err = strconv.Atoi(v); err != nil || o.waitReplicas < 0 {
			return urlOptions{}, bad("wait_replicas %q is not a count", v)
		}
	}
	if v := q.Get("wait_timeout"); v != "" {
		if o.waitTimeout, err = time.ParseDuration(v); err != nil || o.waitTimeout < time.Millisecond {
			return urlOptions{}, bad("wait_timeout %q is not a duration of 1ms or more", v)
		}
	}
	for _, k := range []string{"prefix", "wait_replicas", "wait_timeout"} {
		q.Del(k)
	}

	hosts := strings.Split(u.Host, ",")
	if kind != "" || u.Host != "" { // redis:/// is go-redis's localhost:6379
		for _, h := range hosts {
			if err := checkHostPort(h, kind != ""); err != nil {
				return urlOptions{}, bad("%v", err)
			}
		}
	}
	if kind == "" && len(hosts) > 1 {
		return urlOptions{}, bad("several hosts: use %s%s:// for a Redis Cluster or %s%s:// for Sentinel", base, schemeCluster, base, schemeSentinel)
	}
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	// go-redis's own URL: the first host, the others as addr parameters.
	gu := url.URL{Scheme: base, User: u.User, Host: hosts[0]}
	refused := func(err error) (urlOptions, error) { return urlOptions{}, bad("%s", goredisReason(err, u)) }

	switch "+" + kind {
	case schemeCluster:
		if p := strings.Trim(u.Path, "/"); p != "" {
			return urlOptions{}, bad("a cluster URL has no path (a cluster has database 0 only), got %q", u.Path)
		}
		gu.RawQuery = q.Encode()
		if o.cluster, err = goredis.ParseClusterURL(gu.String()); err != nil {
			return refused(err)
		}
	case schemeSentinel:
		parts := strings.Split(strings.Trim(u.Path, "/"), "/")
		if len(parts) > 2 {
			return urlOptions{}, bad("want the path /mastername or /mastername/db, got %q", u.Path)
		}
		name := parts[0]
		switch qn := q.Get("master_name"); {
		case qn != "" && name != "" && qn != name:
			return urlOptions{}, bad("the master name is %q in the path but %q in master_name", name, qn)
		case name == "":
			name = qn
		}
		if name == "" {
			return urlOptions{}, bad("no master name: want %s://host:port,.../mastername", u.Scheme)
		}
		q.Set("master_name", name)
		if len(parts) == 2 {
			if _, err := strconv.ParseUint(parts[1], 10, 16); err != nil {
				return urlOptions{}, bad("database %q is not a number", parts[1])
			}
			gu.Path = "/" + parts[1]
		}
		gu.RawQuery = q.Encode()
		if o.sentinel, err = goredis.ParseFailoverURL(gu.String()); err != nil {
			return refused(err)
		}
	default:
		gu.Path = u.Path
		gu.RawQuery = q.Encode()
		if o.single, err = goredis.ParseURL(gu.String()); err != nil {
			return refused(err)
		}
	}
	return o, nil
}

// checkHostPort checks one host:port of a URL's host list. A port is
// required in a list of several (needPort).
func checkHostPort(hp string, needPort bool) error {
	if hp == "" {
		return errors.New("an empty host")
	}
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		if needPort {
			return fmt.Errorf("host %q: want host:port", hp)
		}
		h, p = hp, ""
	}
	if h == "" {
		return fmt.Errorf("host %q has no name", hp)
	}
	if p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("host %q: port %q is not a port", hp, p)
		}
	}
	return nil
}

// goredisReason is go-redis's reason for refusing a URL, unless it might
// quote a secret of u: then a generic one.
func goredisReason(err error, u *url.URL) string {
	text := strings.TrimPrefix(err.Error(), "redis: ")
	for _, s := range urlSecrets(u) {
		if strings.Contains(text, s) {
			return "go-redis refused it (its reason is not shown: it quotes a secret)"
		}
	}
	if strings.Contains(text, "://") {
		return "go-redis refused it (its reason is not shown: it quotes the URL)"
	}
	return text
}

// passwordParams are the query parameters of go-redis's URLs that hold a
// password.
var passwordParams = []string{"password", "sentinel_password"}

// urlSecrets returns the secrets of u, raw and escaped.
func urlSecrets(u *url.URL) []string {
	var out []string
	add := func(s string) {
		if s != "" {
			out = append(out, s, url.QueryEscape(s), url.PathEscape(s))
		}
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		add(pw)
	}
	if q, err := url.ParseQuery(u.RawQuery); err == nil {
		for _, k := range passwordParams {
			for _, v := range q[k] {
				add(v)
			}
		}
	}
	return out
}

// redactURL is u with its passwords replaced by "xxxxx".
func redactURL(u *url.URL) string {
	if u.Opaque != "" {
		return u.Scheme + ":…"
	}
	r := *u
	if q, err := url.ParseQuery(r.RawQuery); err != nil {
		r.RawQuery = "…"
	} else {
		for _, k := range passwordParams {
			if q.Has(k) {
				q.Set(k, "xxxxx")
			}
		}
		r.RawQuery = q.Encode()
	}
	return r.Redacted()
}

// urlBackend is a Backend that owns its client.
type urlBackend struct {
	*Backend
	rdb  goredis.UniversalClient
	once sync.Once
	err  error
}

// Close closes the Backend, then its client. It is idempotent.
func (b *urlBackend) Close() error {
	b.once.Do(func() { b.err = errors.Join(b.Backend.Close(), b.rdb.Close()) })
	return b.err
}
