package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestDashboard(t *testing.T) {
	t.Parallel()
	u := memURL(t)
	seed(t, u, "emails", seedJob("email.send", `{"to":"ann"}`), seedJob("invalid", "<script>x</script>"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	var errOut strings.Builder
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--url", u, "dashboard", "--listen", "127.0.0.1:0", "--prefix", "/jobs", "--read-only"}, strings.NewReader(""), pw, &errOut)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no address printed: %v (stderr: %s)", err, errOut.String())
	}
	go io.Copy(io.Discard, pr)
	m := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/jobs/), read-only`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("asyncctl dashboard printed %q", line)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get(m[1] + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("")
	if code != http.StatusOK || !strings.Contains(body, `data-queue="emails"`) {
		t.Fatalf("GET /jobs/: %d\n%s", code, body)
	}
	code, body = get("queue?q=emails")
	if code != http.StatusOK || !strings.Contains(body, "email.send") || !strings.Contains(body, `id="read-only"`) {
		t.Fatalf("GET /jobs/queue?q=emails: %d\n%s", code, body)
	}
	resp, err := http.PostForm(m[1]+"purge", map[string][]string{"q": {"emails"}, "confirm": {"emails"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("POST purge to a --read-only dashboard: %d, want 403", resp.StatusCode)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d after Ctrl-C, want 0; stderr:\n%s", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("asyncctl dashboard did not stop")
	}
}

func TestDashboardListen(t *testing.T) {
	t.Parallel()
	u := memURL(t)
	for _, args := range [][]string{
		{"--listen", "0.0.0.0:0"},
		{"--listen", ":8080"},
		{"--listen", "nonsense"},
		{"--queue", "bad queue"},
		{"extra"},
	} {
		code, _, errOut := ctl(t, "", append([]string{"--url", u, "dashboard"}, args...)...)
		if code != exitUsage {
			t.Errorf("asyncctl dashboard %s: exit %d, want %d\n%s", strings.Join(args, " "), code, exitUsage, errOut)
		}
	}
}
