package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// With Redis unreachable the process prints its one clean error, none of
// go-redis's own log lines before it; with -v they are logged as the
// platform's logs are.
func TestUnreachableRedisIsOneLine(t *testing.T) {
	t.Parallel()
	url := "redis://" + closedAddr(t) + "/0"
	code, out, errOut := exe(t, url, "", "queues")
	if code != exitError || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "asyncctl queues: ") {
		t.Errorf("exit %d, want %d, and one line on stderr:\nstdout: %s\nstderr: %s", code, exitError, out, errOut)
	}
	_, _, errOut = exe(t, url, "", "-v", "queues")
	if !strings.Contains(errOut, "component=go-redis") || strings.Contains(errOut, "pool.go:") {
		t.Errorf("-v: go-redis's logs are not the platform's:\n%s", errOut)
	}
}

// The standalone dashboard does not start on a backend that does not
// answer: every page would wait for it.
func TestDashboardRefusesUnreachableBackend(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a safety net: a dashboard that started serves until it ends
	defer cancel()
	var out, errOut strings.Builder
	code := run(ctx, []string{"dashboard", "--url", "redis://" + closedAddr(t) + "/0", "--listen", "127.0.0.1:0"}, strings.NewReader(""), &out, &errOut)
	if code != exitError || strings.Contains(out.String(), "dashboard of") || !strings.Contains(errOut.String(), "is unreachable, so the dashboard did not start") {
		t.Errorf("exit %d\nstdout: %s\nstderr: %s", code, out.String(), errOut.String())
	}
}
