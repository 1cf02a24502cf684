// Package health serves a worker's liveness and readiness over HTTP, for
// Kubernetes probes and load balancers:
//
//	GET /healthz  200 while the process serves HTTP (liveness)
//	GET /readyz   200 when every health check of the platform passes, 503 when one fails
//
// Both answer with a JSON body. /readyz reports each check by name and
// whether it passed, including "broker", the connectivity check the platform
// adds for a backend that can ping its broker (driver.Pinger):
//
//	{"status":"unavailable","checks":{"broker":{"ok":false},"db":{"ok":true}}}
//
// A failing check's error text is not in the body: it may hold what no HTTP
// client should see (a DSN with its password, a panic value, an internal
// address), and probes are rarely authenticated. It goes to the log instead
// (see WithLogger), once each time it changes. ShowErrors puts it in the body
// too, for an endpoint that only trusted clients reach.
//
// Wire it next to a platform:
//
//	go http.ListenAndServe(":8080", health.Handler(p, health.WithLogger(logger)))
package health

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
)

// Checker is what the handlers read: *asyncplatform.Platform implements it.
type Checker interface {
	// Healthy reports whether every check passed on its last run.
	Healthy() bool
	// Health returns the last result of each check: nil for a pass.
	Health() map[string]error
	// CheckHealth runs the checks now and reports whether all pass.
	CheckHealth(ctx context.Context) bool
}

// Status values of Report.Status.
const (
	StatusOK          = "ok"
	StatusUnavailable = "unavailable"
)

// Report is the JSON body of both endpoints.
type Report struct {
	// Status is StatusOK or StatusUnavailable.
	Status string `json:"status"`
	// Checks holds each health check's last result by name; /healthz leaves
	// it out.
	Checks map[string]CheckResult `json:"checks,omitempty"`
}

// CheckResult is one health check's last result.
type CheckResult struct {
	// OK is true when the check passed.
	OK bool `json:"ok"`
	// Error is the check's error text when it failed, with ShowErrors
	// only.
	Error string `json:"error,omitempty"`
}

// An Option changes what /readyz shows and where it logs.
type Option func(*options)

type options struct {
	showErrors bool
	log        *slog.Logger
}

// ShowErrors makes /readyz put each failing check's error text in its body
// (CheckResult.Error). Only for an endpoint that no untrusted client can
// reach: the text is whatever the check's error says.
func ShowErrors() Option { return func(o *options) { o.showErrors = true } }

// WithLogger sets the logger /readyz writes a failing check's error text to,
// at Warn, when the text changes (not at every probe), and a check passing
// again to, at Info. Defaults to slog.Default(); give it the platform's
// Config.Logger.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// maxLoggedError bounds the error text of one check in a log line.
const maxLoggedError = 2048

// Handler returns a handler serving /healthz (Liveness) and /readyz
// (Readiness(c, opts...)); any other path is 404.
func Handler(c Checker, opts ...Option) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/healthz", Liveness())
	mux.Handle("/readyz", Readiness(c, opts...))
	return mux
}

// Liveness returns a handler that answers 200 {"status":"ok"} to GET and
// HEAD: the process is up and serving. It checks no dependency, so that a
// broker outage makes a worker unready, not restarted.
func Liveness() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowed(w, r) {
			return
		}
		write(w, http.StatusOK, Report{Status: StatusOK})
	})
}

// Readiness returns a handler that reports the checker's health checks: 200
// when all passed on their last run, 503 otherwise, with each check's name
// and whether it passed in the body (and its error text with ShowErrors;
// the log has it either way, see WithLogger). It reads the last results,
// which the platform refreshes every Config.HealthInterval, so a probe costs
// no broker round trip; only when no result exists yet (the platform is not
// started) does it run the checks itself.
func Readiness(c Checker, opts ...Option) http.Handler {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	logged := &errorLog{log: o.log, last: map[string]string{}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowed(w, r) {
			return
		}
		results := c.Health()
		healthy := c.Healthy()
		if len(results) == 0 {
			healthy = c.CheckHealth(r.Context())
			results = c.Health()
		}
		logged.update(r.Context(), results)
		rep := Report{Status: StatusOK, Checks: make(map[string]CheckResult, len(results))}
		for name, err := range results {
			res := CheckResult{OK: err == nil}
			if err != nil {
				if o.showErrors {
					res.Error = err.Error()
				}
				healthy = false
			}
			rep.Checks[name] = res
		}
		code := http.StatusOK
		if !healthy {
			rep.Status, code = StatusUnavailable, http.StatusServiceUnavailable
		}
		write(w, code, rep)
	})
}

// errorLog logs each check's error text when it changes.
type errorLog struct {
	log  *slog.Logger
	mu   sync.Mutex
	last map[string]string // failing checks by name: their last logged text
}

func (l *errorLog) update(ctx context.Context, results map[string]error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, err := range results {
		if err == nil {
			if _, failed := l.last[name]; failed {
				delete(l.last, name)
				l.log.InfoContext(ctx, "health: check passes again", "check", name)
			}
			continue
		}
		text := err.Error()
		if len(text) > maxLoggedError {
			text = text[:maxLoggedError] + "…"
		}
		if last, failed := l.last[name]; failed && last == text {
			continue
		}
		l.last[name] = text
		l.log.WarnContext(ctx, "health: check fails; /readyz answers 503", "check", name, "error", text)
	}
	for name := range l.last {
		if _, ok := results[name]; !ok {
			delete(l.last, name)
		}
	}
}

func allowed(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	return false
}

func write(w http.ResponseWriter, code int, rep Report) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(rep) // the client may be gone; nothing to do
}
