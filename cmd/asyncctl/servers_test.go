package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// The binary under test, built once by the first test that needs it.
var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "asyncctl-test-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(buildDir, "asyncctl"), ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "asyncctl")
}

// exe runs the built binary with ASYNCPLATFORM_URL set to rawURL and returns
// its exit code and output.
func exe(t *testing.T, rawURL, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a safety net
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = append(os.Environ(), urlEnv+"="+rawURL)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("asyncctl %s: %v", strings.Join(args, " "), err)
	}
	return code, out.String(), errOut.String()
}

func mustExe(t *testing.T, rawURL string, want int, stdin string, args ...string) string {
	t.Helper()
	code, out, errOut := exe(t, rawURL, stdin, args...)
	if code != want {
		t.Fatalf("asyncctl %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errOut)
	}
	return out
}

// The process's exit codes are those of run.
func TestBinaryExitCodes(t *testing.T) {
	t.Parallel()
	if out := mustExe(t, "", exitOK, "", "--help"); !strings.Contains(out, "Exit codes:") {
		t.Errorf("--help:\n%s", out)
	}
	mustExe(t, "", exitUsage, "", "bogus")
	mustExe(t, "", exitUsage, "", "queues") // no URL
	mustExe(t, "memory://x", exitNotFound, "", "dead", "list")
	if out := mustExe(t, "memory://x", exitOK, "", "enqueue", "--type", "t", "--payload", "x", "--json"); !strings.Contains(out, `"id":`) {
		t.Errorf("enqueue: %s", out)
	}
}

// server is a broker the CLI is tested against, as a separate process.
type server struct {
	name     string // as testenv.Unreachable names it
	scheme   string
	url      func(t *testing.T) string
	required bool // skipping it is a failure under ASYNCPLATFORM_REQUIRE_SERVERS
}

var servers = []server{
	{"Redis", "redis", func(*testing.T) string {
		return "redis://" + testenv.Getenv("ASYNCPLATFORM_REDIS_ADDR", "127.0.0.1:6379") + "/0"
	}, true},
	{"RabbitMQ", "amqp", func(*testing.T) string {
		return testenv.Getenv("ASYNCPLATFORM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	}, true},
	{"NATS", "nats", func(*testing.T) string { return testenv.Getenv("ASYNCPLATFORM_NATS_URL", "nats://127.0.0.1:4222") }, false},
	{"PostgreSQL", "postgres", func(*testing.T) string {
		u := testenv.Getenv("ASYNCPLATFORM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
		if strings.Contains(u, "?") {
			return u + "&prefix=asyncctl_test"
		}
		return u + "?prefix=asyncctl_test"
	}, false},
	{"SQLite", "sqlite", func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "asyncctl.db") }, true},
}

func TestServers(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			rawURL := s.url(t)
			if driver.Lookup(s.scheme) == nil {
				err := fmt.Errorf("no backend registers %s:// (registered: %v)", s.scheme, driver.Schemes())
				if !s.required {
					t.Skip(err)
				}
				testenv.Unreachable(t, s.name, err)
			}
			reachable(t, s.name, rawURL)
			testCommands(t, rawURL)
			testCredentials(t, rawURL)
		})
	}
}

// reachable skips (or fails) the test when the broker does not answer.
func reachable(t *testing.T, name, rawURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := ap.Open(ctx, rawURL)
	if err != nil {
		testenv.Unreachable(t, name, err)
	}
	defer b.Close()
	if p, ok := b.(driver.Pinger); ok {
		if err := p.Ping(ctx); err != nil {
			testenv.Unreachable(t, name, err)
		}
	}
}

// newQueue returns a queue name of the test's own, deleted at its end.
func newQueue(t *testing.T, rawURL string) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	q := "asyncctl-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx := context.Background()
		b, err := ap.Open(ctx, rawURL)
		if err != nil {
			t.Logf("cleanup of queue %s: %v", q, err)
			return
		}
		defer b.Close()
		if d, ok := b.(driver.QueueDeleter); ok {
			if err := d.DeleteQueue(ctx, q); err != nil {
				t.Logf("cleanup of queue %s: %v", q, err)
			}
		}
	})
	return q
}

// testCommands walks an operator through every command on a real broker,
// running the built binary.
func testCommands(t *testing.T, rawURL string) {
	queue := newQueue(t, rawURL)
	jobs := seed(t, rawURL, queue, seedJob("email.send", `{"to":"ann"}`), seedJob("invalid", "{{"), seedJob("email.send", `{"to":"bob"}`))

	var qs []queueJSON
	if err := json.Unmarshal([]byte(mustExe(t, rawURL, exitOK, "", "queues", "--json", queue)), &qs); err != nil {
		t.Fatal(err)
	}
	if len(qs) != 1 || qs[0].Dead != 3 {
		t.Errorf("queues: %+v, want 3 dead", qs)
	}

	// enqueue, then see it waiting.
	other := newQueue(t, rawURL)
	id := strings.TrimSpace(mustExe(t, rawURL, exitOK, "hello", "enqueue", "--queue", other, "--type", "t"))
	if id == "" {
		t.Error("enqueue printed no ID")
	}
	out := mustExe(t, rawURL, exitOK, "", "queues", other)
	if !strings.Contains(out, other+"  1 ") {
		t.Errorf("queues after enqueue:\n%s", out)
	}

	// dead list, filtered, paged.
	var page struct {
		DeadLetters []deadJSON `json:"dead_letters"`
		Next        string     `json:"next"`
	}
	if err := json.Unmarshal([]byte(mustExe(t, rawURL, exitOK, "", "dead", "list", "--queue", queue, "--json", "--limit", "2")), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.DeadLetters) != 2 || page.DeadLetters[0].ID != jobs[0].ID || page.DeadLetters[1].ID != jobs[1].ID || page.Next == "" {
		t.Errorf("dead list --limit 2: %+v", page)
	}
	if out := mustExe(t, rawURL, exitOK, "", "dead", "list", "--queue", queue, "--cursor", page.Next); !strings.Contains(out, jobs[2].ID) || strings.Count(out, "\n") != 2 {
		t.Errorf("second page:\n%s", out)
	}
	if out := mustExe(t, rawURL, exitOK, "", "dead", "list", "--queue", queue, "--reason", "invalid"); !strings.Contains(out, jobs[1].ID) || strings.Count(out, "\n") != 2 {
		t.Errorf("dead list --reason invalid:\n%s", out)
	}
	mustExe(t, rawURL, exitNotFound, "", "dead", "list", "--queue", queue, "--older-than", "1h")

	// dead show.
	if out := mustExe(t, rawURL, exitOK, "", "dead", "show", "--queue", queue, jobs[1].ID); !strings.Contains(out, "Reason:    invalid") || !strings.Contains(out, "  {{") {
		t.Errorf("dead show:\n%s", out)
	}
	mustExe(t, rawURL, exitNotFound, "", "dead", "show", "--queue", queue, "nope")

	// dead pop: pop the oldest, keep the next.
	code, out, errOut := exe(t, rawURL, "p\nk\n", "dead", "pop", "--queue", queue)
	if code != exitOK || strings.Count(out, "ID: ") != 2 || !strings.Contains(out, jobs[0].ID) || !strings.Contains(errOut, "popped 1, redrove 0") {
		t.Errorf("dead pop: exit %d\n%s%s", code, out, errOut)
	}

	// dead redrive one, then only one dead letter is left.
	if out := mustExe(t, rawURL, exitOK, "", "dead", "redrive", "--queue", queue, jobs[1].ID); !strings.Contains(out, "redrove 1 dead letters") {
		t.Errorf("dead redrive: %s", out)
	}
	if out := mustExe(t, rawURL, exitOK, "", "dead", "list", "--queue", queue, "--all"); !strings.Contains(out, jobs[2].ID) || strings.Count(out, "\n") != 2 {
		t.Errorf("after pop and redrive:\n%s", out)
	}
	if err := json.Unmarshal([]byte(mustExe(t, rawURL, exitOK, "", "queues", "--json", queue)), &qs); err != nil {
		t.Fatal(err)
	}
	if qs[0].Ready != 1 || qs[0].Dead != 1 {
		t.Errorf("after redrive: %+v, want 1 ready (the redriven job) and 1 dead", qs[0])
	}

	// dead purge: no, then yes.
	mustExe(t, rawURL, exitDeclined, "n\n", "dead", "purge", "--queue", queue)
	if out := mustExe(t, rawURL, exitOK, "y\n", "dead", "purge", "--queue", queue); out != fmt.Sprintf("deleted 1 dead letters of queue %q\n", queue) {
		t.Errorf("dead purge: %q", out)
	}
	mustExe(t, rawURL, exitNotFound, "", "dead", "pop", "--queue", queue, "--yes")
}

// A wrong password is never printed, in errors included.
func testCredentials(t *testing.T, rawURL string) {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "Wr0ngPassw0rd"
	u.User = url.UserPassword(u.User.Username(), secret)
	code, out, errOut := exe(t, u.String(), "", "queues", "default")
	if strings.Contains(out+errOut, secret) {
		t.Errorf("asyncctl printed the password (exit %d):\n%s%s", code, out, errOut)
	}
	t.Logf("with a wrong password: exit %d: %s", code, strings.TrimSpace(errOut))
}
