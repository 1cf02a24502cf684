package main

import (
	"strings"
	"testing"
)

func TestPauseResume(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "emails", "--type", "email.send", "--payload", "a")
	if out := mustCtl(t, exitOK, "", "pause", "--url", url, "emails", "billing"); out != "emails: paused\nbilling: paused\n" {
		t.Errorf("pause printed %q", out)
	}
	if s := stats(t, url, "emails"); !s.Paused || s.Ready != 1 {
		t.Errorf("queues --json after pause: %+v, want paused with its job", s)
	}
	if out := mustCtl(t, exitOK, "", "queues", "--url", url, "emails"); !strings.Contains(out, "\nemails (paused)  1 ") {
		t.Errorf("queues after pause:\n%s", out)
	}
	mustCtl(t, exitOK, "", "pause", "--url", url, "emails") // again: no error
	if out := mustCtl(t, exitOK, "", "--json", "resume", "--url", url, "emails"); out != "[\n  {\n    \"queue\": \"emails\",\n    \"paused\": false\n  }\n]\n" {
		t.Errorf("resume --json printed %q", out)
	}
	if s := stats(t, url, "emails"); s.Paused {
		t.Errorf("queues --json after resume: %+v, want not paused", s)
	}
	if s := stats(t, url, "billing"); !s.Paused {
		t.Errorf("billing was resumed with emails: %+v", s)
	}
	if out := mustCtl(t, exitOK, "", "pause", "--url", url, "--group", "acme", "emails"); out != "emails group acme: paused\n" {
		t.Errorf("pause --group printed %q", out)
	}
	if out := mustCtl(t, exitOK, "", "resume", "--url", url, "--group", "acme", "emails"); out != "emails group acme: resumed, 0 held jobs moved back\n" {
		t.Errorf("resume --group printed %q", out)
	}
	mustCtl(t, exitUsage, "", "pause", "--url", url, "--group", "bad/group", "emails")
	mustCtl(t, exitUsage, "", "pause", "--url", url)
	mustCtl(t, exitUsage, "", "pause", "--url", url, "bad queue\x1b[31m")
}
