package nats

import (
	"context"
	"net/url"
	"strings"
	"testing"

	gonats "github.com/nats-io/nats.go"
)

// TestConfigOf: the URL form names several servers, a stream and a replica
// count; credentials become dial options, never part of an error.
func TestConfigOf(t *testing.T) {
	for _, c := range []struct {
		url, wantURL string
		replicas     int
		auth         string // "user:pw", "token" or ""
		err          string
	}{
		{url: "nats://127.0.0.1:4222", wantURL: "nats://127.0.0.1:4222"},
		{url: "nats://a:1,b:2,c:3?replicas=3&stream=JOBS", wantURL: "nats://a:1,nats://b:2,nats://c:3", replicas: 3},
		{url: "nats://u:s3cret@a:1,b:2", wantURL: "nats://a:1,nats://b:2", auth: "u:s3cret"},
		{url: "nats://t0ken@a:1", wantURL: "nats://a:1", auth: "t0ken"},
		{url: "nats://a:1?replicas=0", err: "replicas"},
		{url: "nats://a:1?replicas=6", err: "replicas"},
		{url: "nats://a:1?replica=3", err: `unknown URL parameter "replica"`},
		{url: "nats://u:s3cret@?stream=X", err: "names no server"},
	} {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := configOf(u)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s: error %v, want one about %q without the password", c.url, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		if cfg.URL != c.wantURL || cfg.Replicas != c.replicas {
			t.Errorf("%s: URL %q replicas %d, want %q %d", c.url, cfg.URL, cfg.Replicas, c.wantURL, c.replicas)
		}
		var o gonats.Options
		for _, opt := range cfg.Options {
			_ = opt(&o)
		}
		auth := o.Token
		if o.User != "" {
			auth = o.User + ":" + o.Password
		}
		if auth != c.auth {
			t.Errorf("%s: credentials %q, want %q", c.url, auth, c.auth)
		}
	}
}

// TestOpenTakesExistingReplicas: a Backend opened with Replicas 0 (a URL
// without replicas=) takes the existing streams' count; one asking for
// another count fails, naming both. On the machine's single server the
// streams have one replica; the cluster test opens R3 streams by URL.
func TestOpenTakesExistingReplicas(t *testing.T) {
	t.Parallel()
	url := realURL(t)
	ctx := context.Background()
	cfg := testConfig(url)
	cfg.Stream = "APREPL_" + strings.ReplaceAll(queueName(t), ".", "_")[:10]
	b, err := New(ctx, cfg) // makes the streams, R1
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range []string{b.cfg.Stream, b.delayName(), b.deadName()} {
			_ = b.js.DeleteStream(ctx, s)
		}
		_ = b.Close()
	})
	cfg.Replicas = 0
	b2, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("New with Replicas 0 on existing streams: %v", err)
	}
	if b2.replicas != 1 {
		t.Errorf("replicas %d, want the streams' 1", b2.replicas)
	}
	_ = b2.Close()
	cfg.Replicas = 3
	if b3, err := New(ctx, cfg); err == nil || !strings.Contains(err.Error(), "exists with 1 replicas") {
		if b3 != nil {
			_ = b3.Close()
		}
		t.Errorf("New with Replicas 3 on R1 streams: %v, want the mismatch named", err)
	}
}

// TestURLDefault: an empty Config.URL takes $ASYNCPLATFORM_NATS_URL
// (URLEnv), then DefaultURL; a URL that is set is kept.
func TestURLDefault(t *testing.T) {
	for _, tc := range []struct{ env, url, want string }{
		{"", "", DefaultURL},
		{"nats://env:4222", "", "nats://env:4222"},
		{"nats://env:4222", "nats://set:4222", "nats://set:4222"},
	} {
		t.Setenv(URLEnv, tc.env)
		if got := (Config{URL: tc.url}).withDefaults().URL; got != tc.want {
			t.Errorf("URL %q with $%s=%q: defaults to %q, want %q", tc.url, URLEnv, tc.env, got, tc.want)
		}
	}
}
