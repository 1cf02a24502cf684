package redis

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// secret is the password of every URL below; no error may show it.
const secret = "hunter2-s3cr3t"

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("url.Parse(%s): %v", raw, err)
	}
	return u
}

func TestURLSchemesRegistered(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"} {
		if driver.Lookup(s) == nil {
			t.Errorf("scheme %s is not registered", s)
		}
	}
}

func TestParseClusterURL(t *testing.T) {
	t.Parallel()
	o, err := parseURL(mustParse(t, "redis+cluster://app:"+secret+"@h1:7000,h2:7001,h3:7002/?prefix=jobs&dial_timeout=2s&addr=h4:7003"))
	if err != nil {
		t.Fatal(err)
	}
	if o.cluster == nil || o.single != nil || o.sentinel != nil {
		t.Fatalf("want cluster options only, got %+v", o)
	}
	if want := []string{"h1:7000", "h4:7003", "h2:7001", "h3:7002"}; !sameSet(o.cluster.Addrs, want) {
		t.Errorf("Addrs %v, want %v", o.cluster.Addrs, want)
	}
	if o.prefix != "jobs" || o.cluster.DialTimeout != 2*time.Second || o.cluster.Username != "app" || o.cluster.Password != secret || o.cluster.TLSConfig != nil {
		t.Errorf("prefix %q, options %+v", o.prefix, o.cluster)
	}

	o, err = parseURL(mustParse(t, "rediss+cluster://[::1]:7000/?addr=[::1]:7001&wait_replicas=1&wait_timeout=250ms"))
	if err != nil {
		t.Fatal(err)
	}
	if o.waitReplicas != 1 || o.waitTimeout != 250*time.Millisecond {
		t.Errorf("wait_replicas %d, wait_timeout %v", o.waitReplicas, o.waitTimeout)
	}
	if want := []string{"[::1]:7000", "[::1]:7001"}; !sameSet(o.cluster.Addrs, want) || o.cluster.TLSConfig == nil {
		t.Errorf("Addrs %v (want %v), TLS %v", o.cluster.Addrs, want, o.cluster.TLSConfig)
	}
}

func TestParseSentinelURL(t *testing.T) {
	t.Parallel()
	o, err := parseURL(mustParse(t, "redis+sentinel://:"+secret+"@h1:26379,h2:26380/mymaster/2?password=master-pw&prefix=p"))
	if err != nil {
		t.Fatal(err)
	}
	s := o.sentinel
	if s == nil || o.single != nil || o.cluster != nil {
		t.Fatalf("want Sentinel options only, got %+v", o)
	}
	if !sameSet(s.SentinelAddrs, []string{"h1:26379", "h2:26380"}) || s.MasterName != "mymaster" || s.DB != 2 ||
		s.SentinelPassword != secret || s.Password != "master-pw" || o.prefix != "p" {
		t.Errorf("options %+v, prefix %q", s, o.prefix)
	}
	o, err = parseURL(mustParse(t, "rediss+sentinel://h1:26379/?master_name=m"))
	if err != nil {
		t.Fatal(err)
	}
	if o.sentinel.MasterName != "m" || o.sentinel.DB != 0 || o.sentinel.TLSConfig == nil {
		t.Errorf("options %+v", o.sentinel)
	}
}

func TestParseSingleURL(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"redis://:" + secret + "@127.0.0.1:6379/3?prefix=x&pool_size=4", "redis:///3?prefix=x&pool_size=4"} {
		o, err := parseURL(mustParse(t, raw))
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if o.single == nil || o.single.DB != 3 || o.single.PoolSize != 4 || o.prefix != "x" {
			t.Errorf("%s: options %+v, prefix %q", raw, o.single, o.prefix)
		}
	}
}

// Bad and hostile URLs: each is refused with a *URLError that says why and
// never shows the password (in the user part, or in a password parameter).
func TestParseURLRefuses(t *testing.T) {
	t.Parallel()
	pw := ":" + secret + "@"
	for _, tc := range []struct{ url, reason string }{
		{"redis://" + pw + "h1:1,h2:2/", "several hosts: use redis+cluster://"},
		{"rediss://" + pw + "h1:1,h2:2/", "rediss+sentinel://"},
		{"redis+cluster://" + pw + "h1,h2:7001/", `host "h1": want host:port`},
		{"redis+cluster://" + pw + "h1:7000,,h2:7001/", "an empty host"},
		{"redis+cluster://" + pw + "h1:7000,h2:99999/", `port "99999" is not a port`},
		{"redis+cluster://" + pw + "h1:7000,h2:0/", `port "0" is not a port`},
		{"redis+cluster://" + pw + "h1:7000,:7001/", "has no name"},
		{"redis+cluster://" + pw + "/", "an empty host"},
		{"redis+cluster://" + pw + "h1:7000/0", "a cluster URL has no path"},
		{"redis+cluster://" + pw + "h1:7000/?bogus=1", "unexpected option: bogus"},
		{"redis+cluster://h1:7000/?password=" + secret, "unexpected option: password"},
		{"redis+cluster://" + pw + "h1:7000/?addr=nohost", "unable to parse addr param: nohost"},
		{"redis+cluster://" + pw + "h1:7000/?a=%zz", "the query does not parse"},
		{"redis+cluster:" + secret, "want redis+cluster://host:port"},
		{"redis+sentinel://" + pw + "h1:26379/m?dial_timeout=x", `invalid dial_timeout duration: time: invalid duration "x"`},
		{"redis+sentinel://" + pw + "h1:26379/", "no master name"},
		{"redis+sentinel://" + pw + "h1:26379,h2:26380", "no master name"},
		{"redis+sentinel://" + pw + "h1:26379/a/1/c", "want the path /mastername or /mastername/db"},
		{"redis+sentinel://" + pw + "h1:26379/m/x", `database "x" is not a number`},
		{"redis+sentinel://" + pw + "h1:26379/m/99999", `database "99999" is not a number`},
		{"redis+sentinel://" + pw + "h1:26379/m?master_name=n", `"m" in the path but "n" in master_name`},
		{"redis+sentinel://h1:26379/m?password=" + secret + "&bogus=1", "unexpected option: bogus"},
		{"redis+sentinel://h1:26379/m?sentinel_password=" + secret, "unexpected option: sentinel_password"},
		{"redis+sentinel://" + pw + "h1:26379/m?db=x", "invalid database number"},
		{"redis://" + pw + "h1:6379/notanumber", `invalid database number: "notanumber"`},
		{"redis+cluster://" + pw + "h1:7000/?wait_replicas=-1", `wait_replicas "-1" is not a count`},
		{"redis+cluster://" + pw + "h1:7000/?wait_replicas=x", `wait_replicas "x" is not a count`},
		{"redis+sentinel://" + pw + "h1:1/m?wait_timeout=0", `wait_timeout "0" is not a duration`},
		{"redis+foo://" + pw + "h1:6379/", `unknown scheme "redis+foo"`},
		{"redis+cluster+sentinel://" + pw + "h1:6379/", "unknown scheme"},
	} {
		_, err := parseURL(mustParse(t, tc.url))
		var ue *URLError
		if !errors.As(err, &ue) {
			t.Errorf("%s: got %v, want a *URLError", tc.url, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: %v, want the reason %q", tc.url, err, tc.reason)
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: the error shows the password: %v", tc.url, err)
		}
	}
}

// go-redis's reason is dropped when it quotes a password, raw or escaped.
func TestGoredisReasonHidesSecrets(t *testing.T) {
	t.Parallel()
	u := mustParse(t, "redis+sentinel://u:p%2Fw%40rd-1@h1:1/m?password=pass%20two")
	for _, quoted := range []string{"p/w@rd-1", "p%2Fw%40rd-1", "pass two", "pass+two", "pass%20two", "redis://h1:1"} {
		if r := goredisReason(errors.New("redis: bad thing: "+quoted), u); strings.Contains(r, quoted) || !strings.Contains(r, "not shown") {
			t.Errorf("reason for an error quoting %q: %q", quoted, r)
		}
	}
	if r := goredisReason(errors.New("redis: unexpected option: x"), u); r != "unexpected option: x" {
		t.Errorf("an innocent reason became %q", r)
	}
}

// TestOpenURLRefuses goes through the registered opener, as
// asyncplatform.Open does, with a password in every place it can be.
func TestOpenURLRefuses(t *testing.T) {
	t.Parallel()
	u := mustParse(t, "redis+sentinel://u:"+secret+"@h1:26379,h2:1/m?password="+secret+"&x=1")
	_, err := driver.Lookup(u.Scheme)(context.Background(), u)
	var ue *URLError
	if !errors.As(err, &ue) || strings.Contains(err.Error(), secret) || !strings.Contains(ue.URL, "h2:1") {
		t.Errorf("got %v", err)
	}
}

// FuzzParseURL: no input makes parseURL panic, and its errors never show
// the password, put in the user part and in any password parameter.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"redis+cluster://h1:7000,h2:7001/?prefix=x",
		"redis+sentinel://:pw@h1:26379,h2:26380/master/1?password=pw2",
		"rediss+cluster://u:pw@[::1]:7000/?addr=[::1]:7001",
		"redis://:pw@h:6379/0",
		"redis+cluster://:pw@h1:7000,,:/?addr=&dial_timeout=pw",
		"redis+sentinel://u:pw@h1:1/m?sentinel_password=pw&dial_timeout=pw",
	} {
		f.Add(s)
	}
	const pw = "Zq9xW2vPk"
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil || strings.Contains(strings.ToLower(raw), "zq9") {
			return
		}
		if u.User != nil {
			u.User = url.UserPassword(u.User.Username(), pw)
		}
		if q, err := url.ParseQuery(u.RawQuery); err == nil {
			for _, k := range passwordParams {
				if q.Has(k) {
					q.Set(k, pw)
				}
			}
			u.RawQuery = q.Encode()
		}
		if _, err := parseURL(u); err != nil && strings.Contains(err.Error(), pw) {
			t.Errorf("%s: the error shows the password: %v", u.Redacted(), err)
		}
	})
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
