package main

import (
	"strings"
	"testing"
)

// Item 4 of issue 17: a token in the user part of the URL (NATS token auth)
// and a percent-encoded password never reach stdout or stderr, -v included.
func TestTokenNeverPrinted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url     string
		secrets []string
	}{
		{"nats://S3CRETTOKEN@127.0.0.1:1", []string{"S3CRETTOKEN"}},
		{"nats://user:p%40ss%2Fw0rd@127.0.0.1:1", []string{"p@ss/w0rd", "p%40ss%2Fw0rd"}},
		{"nats://tok%2Fen%40x@127.0.0.1:1", []string{"tok/en@x", "tok%2Fen%40x"}},
	} {
		for _, args := range [][]string{{"queues"}, {"-v", "dead", "list"}} {
			code, out, errOut := ctl(t, "", append([]string{"--url", tc.url}, args...)...)
			if code != exitError {
				t.Errorf("%s %v: exit %d, want %d", tc.url, args, code, exitError)
			}
			for _, s := range tc.secrets {
				if strings.Contains(out+errOut, s) {
					t.Errorf("%s %v: printed %q:\n%s%s", tc.url, args, s, out, errOut)
				}
			}
		}
	}
	for raw, want := range map[string]string{
		"nats://S3CRETTOKEN@host:4222/":            "nats://xxxxx@host:4222/",
		"nats://user:p%40ss%2Fw0rd@host:4222/":     "nats://user:xxxxx@host:4222/",
		"redis://:hunter22@host:6379/0?key=abcdef": "redis://:xxxxx@host:6379/0?key=xxxxx",
	} {
		if got := redactURL(raw); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", raw, got, want)
		}
	}
	c := &cli{url: "nats://tok%2Fen%40x@host:4222"}
	if got := c.redact(`connect to nats://tok%2Fen%40x@host:4222 as "tok/en@x"`); strings.Contains(got, "tok") {
		t.Errorf("redact: %s", got)
	}
}
