package health_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/health"
)

// pinging is a memory backend whose broker connectivity a test controls.
type pinging struct {
	driver.Backend
	down atomic.Bool
}

func (b *pinging) Ping(context.Context) error {
	if b.down.Load() {
		return errors.New("dial tcp 127.0.0.1:6379: connection refused")
	}
	return nil
}

func newPlatform(t *testing.T, checks map[string]ap.HealthCheck) (*ap.Platform, *pinging) {
	t.Helper()
	b := &pinging{Backend: memory.NewBroker().Connect()}
	t.Cleanup(func() { b.Close() })
	p, err := ap.New(b, ap.Config{
		HealthChecks: checks,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, b
}

func get(t *testing.T, h http.Handler, method, path string) (int, health.Report) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	var rep health.Report
	if method == http.MethodGet && rec.Code != http.StatusMethodNotAllowed && rec.Code != http.StatusNotFound {
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", method, path, ct)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
			t.Fatalf("%s %s: body %q: %v", method, path, rec.Body, err)
		}
	}
	return rec.Code, rep
}

func TestLiveness(t *testing.T) {
	t.Parallel()
	p, b := newPlatform(t, nil)
	b.down.Store(true) // liveness does not depend on the broker
	h := health.Handler(p)
	code, rep := get(t, h, http.MethodGet, "/healthz")
	if code != http.StatusOK || rep.Status != health.StatusOK || rep.Checks != nil {
		t.Errorf("GET /healthz = %d %+v, want 200 ok with no checks", code, rep)
	}
	if code, _ := get(t, h, http.MethodHead, "/healthz"); code != http.StatusOK {
		t.Errorf("HEAD /healthz = %d", code)
	}
}

// TestReadiness shows the error texts (ShowErrors); TestReadinessHidesErrors
// checks that they are not shown by default.
func TestReadiness(t *testing.T) {
	t.Parallel()
	var dbDown atomic.Bool
	p, b := newPlatform(t, map[string]ap.HealthCheck{
		"db": func(context.Context) error {
			if dbDown.Load() {
				return errors.New("db: too many connections")
			}
			return nil
		},
	})
	h := health.Handler(p, health.ShowErrors())

	// Not started: the handler runs the checks itself.
	code, rep := get(t, h, http.MethodGet, "/readyz")
	want := map[string]health.CheckResult{"broker": {OK: true}, "db": {OK: true}}
	if code != http.StatusOK || rep.Status != health.StatusOK || !equal(rep.Checks, want) {
		t.Fatalf("GET /readyz = %d %+v, want 200 with %v", code, rep, want)
	}

	// The broker goes away: the last results say so once the checks run.
	b.down.Store(true)
	p.CheckHealth(context.Background())
	code, rep = get(t, h, http.MethodGet, "/readyz")
	want = map[string]health.CheckResult{
		"broker": {Error: "dial tcp 127.0.0.1:6379: connection refused"},
		"db":     {OK: true},
	}
	if code != http.StatusServiceUnavailable || rep.Status != health.StatusUnavailable || !equal(rep.Checks, want) {
		t.Fatalf("GET /readyz with the broker down = %d %+v, want 503 with %v", code, rep, want)
	}

	// Back up, and a user check fails instead.
	b.down.Store(false)
	dbDown.Store(true)
	p.CheckHealth(context.Background())
	code, rep = get(t, h, http.MethodGet, "/readyz")
	want = map[string]health.CheckResult{"broker": {OK: true}, "db": {Error: "db: too many connections"}}
	if code != http.StatusServiceUnavailable || !equal(rep.Checks, want) {
		t.Fatalf("GET /readyz with the db down = %d %+v, want 503 with %v", code, rep, want)
	}

	dbDown.Store(false)
	p.CheckHealth(context.Background())
	if code, rep = get(t, h, http.MethodGet, "/readyz"); code != http.StatusOK {
		t.Fatalf("GET /readyz after recovery = %d %+v", code, rep)
	}
}

// A started platform's own health loop feeds /readyz.
func TestReadinessStarted(t *testing.T) {
	t.Parallel()
	p, _ := newPlatform(t, nil)
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(ctx) })
	code, rep := get(t, health.Readiness(p), http.MethodGet, "/")
	if code != http.StatusOK || !rep.Checks["broker"].OK {
		t.Errorf("GET /readyz = %d %+v", code, rep)
	}
}

func TestMethodsAndPaths(t *testing.T) {
	t.Parallel()
	p, _ := newPlatform(t, nil)
	h := health.Handler(p)
	for _, path := range []string{"/healthz", "/readyz"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil))
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("POST %s = %d, Allow %q", path, rec.Code, rec.Header().Get("Allow"))
		}
	}
	if code, _ := get(t, h, http.MethodGet, "/metrics"); code != http.StatusNotFound {
		t.Errorf("GET /metrics = %d, want 404", code)
	}
}

// A server over a real listener answers as the recorder does.
func TestServer(t *testing.T) {
	t.Parallel()
	p, _ := newPlatform(t, nil)
	srv := httptest.NewServer(health.Handler(p))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep health.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || rep.Status != health.StatusOK {
		t.Errorf("GET /readyz = %d %+v", resp.StatusCode, rep)
	}
}

func equal(a, b map[string]health.CheckResult) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReadinessHidesErrors: /readyz tells any HTTP client only which checks pass;
// a check's error text (a DSN with its password, a panic value) goes to the
// log, once per change, not to the client.
func TestReadinessHidesErrors(t *testing.T) {
	t.Parallel()
	const secret = "postgres://app:hunter22@10.0.0.7/orders"
	var text atomic.Value
	text.Store("dial " + secret + ": connection refused")
	p, b := newPlatform(t, map[string]ap.HealthCheck{
		"db": func(context.Context) error { return errors.New(text.Load().(string)) },
	})
	b.down.Store(true)
	var logs syncBuffer
	h := health.Handler(p, health.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	for range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		body := rec.Body.String()
		if rec.Code != http.StatusServiceUnavailable || strings.Contains(body, "hunter22") || strings.Contains(body, "connection refused") {
			t.Fatalf("GET /readyz = %d %s; want 503 and no error text", rec.Code, body)
		}
		var rep health.Report
		if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		want := map[string]health.CheckResult{"broker": {OK: false}, "db": {OK: false}}
		if !equal(rep.Checks, want) {
			t.Errorf("checks = %+v, want %+v", rep.Checks, want)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "hunter22"); n != 1 {
		t.Errorf("the db check's error is logged %d times over 3 probes, want once:\n%s", n, out)
	}
	if n := strings.Count(out, "check=broker"); n != 1 || !strings.Contains(out, "127.0.0.1:6379: connection refused") {
		t.Errorf("the broker check's error is not logged once:\n%s", out)
	}

	// A new text is logged; a check passing again is said once.
	text.Store("db: too many connections")
	p.CheckHealth(context.Background())
	get(t, h, http.MethodGet, "/readyz")
	b.down.Store(false)
	p.CheckHealth(context.Background())
	get(t, h, http.MethodGet, "/readyz")
	get(t, h, http.MethodGet, "/readyz")
	out = logs.String()
	if !strings.Contains(out, "too many connections") || strings.Count(out, "passes again") != 1 {
		t.Errorf("logs after a change:\n%s", out)
	}
}
