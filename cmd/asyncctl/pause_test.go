package main

import (
	"strings"
	"testing"
)

func TestPauseResume(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "emails", "--type", "email.send", "--payload", "a")
	if out := mustCtl(t, exitOK, "", "pause", "--url", url, "--force", "emails", "billing"); out != "emails: paused\nbilling: paused\n" {
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
	// The queue says its group is paused, by name and in JSON.
	for _, args := range [][]string{{"queues", "emails"}, {"queues"}} {
		if out := mustCtl(t, exitOK, "", append(args, "--url", url)...); !strings.Contains(out, "\nemails (group acme paused, 0 held)  1 ") {
			t.Errorf("%q with a paused group:\n%s", args, out)
		}
	}
	if s := stats(t, url, "emails"); len(s.Groups) != 1 || s.Groups[0] != (groupJSON{Group: "acme", Paused: true}) {
		t.Errorf("queues --json with a paused group: %+v", s)
	}
	if out := mustCtl(t, exitOK, "", "resume", "--url", url, "--group", "acme", "emails"); out != "emails group acme: resumed, 0 held jobs moved back\n" {
		t.Errorf("resume --group printed %q", out)
	}
	mustCtl(t, exitUsage, "", "pause", "--url", url, "--group", "bad/group", "emails")
	mustCtl(t, exitUsage, "", "pause", "--url", url)
	mustCtl(t, exitUsage, "", "pause", "--url", url, "bad queue\x1b[31m")
}

// A queue the backend does not hold is refused by name, with exit code 3,
// by pause (nothing is paused), resume, queues and top: a typo is never
// taken for an empty queue.
func TestUnknownQueue(t *testing.T) {
	t.Parallel()
	url := memURL(t)
	mustCtl(t, exitOK, "", "enqueue", "--url", url, "--queue", "emails", "--type", "email.send", "--payload", "a")
	for _, args := range [][]string{
		{"pause", "emails", "emials"},
		{"resume", "emials"},
		{"pause", "--group", "acme", "emials"},
		{"queues", "emails", "emials"},
		{"top", "emials"},
	} {
		code, out, errOut := ctl(t, "", append(args, "--url", url)...)
		if code != exitNotFound || !strings.Contains(errOut, "unknown queue emials: the backend holds no such queue") || out != "" {
			t.Errorf("%q: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
		}
	}
	if s := stats(t, url, "emails"); s.Paused {
		t.Errorf("a refused pause paused emails: %+v", s)
	}
	_, _, errOut := ctl(t, "", "pause", "--url", url, "emials")
	if !strings.Contains(errOut, "nothing was paused (--force pauses a queue before anything declares it)") {
		t.Errorf("pause of an unknown queue does not offer --force: %s", errOut)
	}
	// --force pauses it; paused, it is known to resume and queues.
	mustCtl(t, exitOK, "", "pause", "--url", url, "--force", "reports")
	if out := mustCtl(t, exitOK, "", "queues", "--url", url, "reports"); !strings.Contains(out, "reports (paused)") {
		t.Errorf("queues of a queue paused by --force:\n%s", out)
	}
	mustCtl(t, exitOK, "", "resume", "--url", url, "reports")
}
