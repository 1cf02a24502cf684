package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// TestTokenNeverPrinted: a token in the user part of the URL (NATS token auth)
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

// TestBadQueueIsUsage: a bad --queue is a bad command line (exit 2) for every
// command, refused before the backend is opened.
func TestBadQueueIsUsage(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	for _, q := range []string{"bad/name", "a\x1b]0;pwned\x07", "", strings.Repeat("q", 101)} {
		for _, args := range [][]string{
			{"dead", "list", "--queue", q},
			{"dead", "show", "--queue", q, "some-id"},
			{"dead", "pop", "--queue", q},
			{"dead", "redrive", "--queue", q, "--all"},
			{"dead", "purge", "--queue", q, "--yes"},
			{"enqueue", "--queue", q, "--type", "t", "--payload", "x"},
			{"queues", "--queue", q},
		} {
			code, _, errOut := ctl(t, "", append(args, "--url", url)...)
			if code != exitUsage || !strings.Contains(errOut, "queue name") {
				t.Errorf("asyncctl %q: exit %d, stderr %q; want exit %d and the queue name's problem", args, code, errOut, exitUsage)
			}
			if strings.ContainsAny(errOut, "\x1b\x07") {
				t.Errorf("asyncctl %q: a control character on stderr: %q", args, errOut)
			}
		}
	}
}

// hostile is text that would act on a terminal or forge a line if printed
// raw: OSC (set the title), CSI (clear the screen, colours) in 7-bit and C1
// form, BEL, DEL, CR, a bidirectional override and a forged line. (A lone
// \x9b byte, not UTF-8, is in TestEscapeFunctions: JSON cannot carry it.)
const hostile = "a\x1b]0;owned\x07b\x1b[2J\u009b1m\x7f\r\u202e\nReason: succeeded"

// raw reports what of a terminal's controls s still holds raw.
func raw(s string) []string {
	var found []string
	for _, c := range []string{"\x1b", "\x07", "\x7f", "\r", "\u009b", "\u0085", "\u202e", "\x9b"} {
		if strings.Contains(s, c) {
			found = append(found, strconv.Quote(c))
		}
	}
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "Reason: succeeded") {
			found = append(found, "a forged line "+strconv.Quote(line))
		}
	}
	return found
}

func TestEscapeFunctions(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain text, ünïcode":       "plain text, ünïcode",
		"a\x1b[2Jb":                 `a\x1b[2Jb`,
		"line\nforged\tcol\r":       `line\nforged\tcol\r`,
		"c1 \u009b31m \x9b del\x7f": `c1 \u009b31m \x9b del\x7f`,
		"bidi \u202e zw\u200b":      `bidi \u202e zw\u200b`,
	} {
		if got := field(in); got != want {
			t.Errorf("field(%q) = %q, want %q", in, got, want)
		}
	}
	if got := block("one\n\ttwo\x1b\r"); got != "one\n\ttwo\\x1b\\r" {
		t.Errorf("block = %q", got)
	}
	for _, s := range []string{hostile, "\U0001D173 beyond the BMP", "<&>"} {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		safe := jsonSafe(b)
		if r := raw(string(safe)); len(r) > 0 {
			t.Errorf("jsonSafe(%s) = %s: still raw %v", b, safe, r)
		}
		var back string
		if err := json.Unmarshal(safe, &back); err != nil || back != s {
			t.Errorf("jsonSafe(%s) = %s: reads back as %q, %v", b, safe, back, err)
		}
	}
}

// TestTerminalInjection: nothing printed from a dead-letter record reaches the
// terminal raw: IDs, types, errors, worker names, headers, payload text, in
// dead list, show, pop and on stderr; JSON stays JSON and reads back the
// same.
func TestTerminalInjection(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	ctx := context.Background()
	b, err := ap.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dead := make(chan ap.DeadLetter, 2)
	p, err := ap.New(b, ap.Config{
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		WorkerName: "worker" + hostile,
		Hooks:      ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl }},
	})
	if err != nil {
		t.Fatal(err)
	}
	typ := "type" + hostile
	if err := p.Handle(typ, func(context.Context, *ap.Job) error { return errors.New("error" + hostile) }); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	jobs := []*ap.Job{
		{ID: "id" + hostile, Type: typ, Payload: []byte("text\rReason: succeeded\u0085\u202e"), Policy: ap.Policy{RetryLimit: ap.Limit(0)},
			Headers: map[string]string{"key" + hostile: "value" + hostile}},
		{ID: "id2", Type: typ, Payload: []byte("binary\x1b[2J\x00"), Policy: ap.Policy{RetryLimit: ap.Limit(0)}},
	}
	for _, j := range jobs {
		if err := p.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		select {
		case <-dead:
		case <-time.After(time.Minute):
			t.Fatal("not dead-lettered")
		}
	}

	check := func(what, out string) {
		t.Helper()
		if r := raw(out); len(r) > 0 {
			t.Errorf("%s prints %v raw:\n%s", what, r, out)
		}
	}
	out := mustCtl(t, exitOK, "", "dead", "list", "--url", url)
	check("dead list", out)
	if n := strings.Count(out, "\n"); n != 3 {
		t.Errorf("dead list: %d lines, want a header and 2 rows:\n%s", n, out)
	}
	for _, j := range jobs {
		out = mustCtl(t, exitOK, "", "dead", "show", "--url", url, j.ID)
		check("dead show", out)
		if n := strings.Count(out, "\nReason:"); n != 1 {
			t.Errorf("dead show: %d Reason lines:\n%s", n, out)
		}
		out = mustCtl(t, exitOK, "", "dead", "show", "--url", url, "--json", j.ID)
		check("dead show --json", out)
		var dl deadJSON
		if err := json.Unmarshal([]byte(out), &dl); err != nil {
			t.Fatalf("dead show --json: %v\n%s", err, out)
		}
		if dl.ID != j.ID || dl.Type != typ || dl.Worker != "worker"+hostile || !strings.HasSuffix(dl.Error, "error"+hostile) || !maps.Equal(dl.Headers, j.Headers) || string(dl.Payload) != string(j.Payload) {
			t.Errorf("dead show --json does not read back as the record: %+v", dl)
		}
	}
	code, _, errOut := ctl(t, "", "dead", "redrive", "--url", url, "no-such"+hostile)
	check("dead redrive's stderr", errOut)
	if code != exitNotFound {
		t.Errorf("dead redrive of a missing ID: exit %d", code)
	}
	out = mustCtl(t, exitOK, "", "dead", "pop", "--url", url, "--yes")
	check("dead pop --yes", out)
	if n := strings.Count(out, "\n"); n != 2 {
		t.Errorf("dead pop: %d lines, want 2:\n%s", n, out)
	}
}
