// Package health serves a worker's liveness and readiness over HTTP, for
// Kubernetes probes and load balancers:
//
//	GET /healthz  200 while the process serves HTTP (liveness)
//	GET /readyz   200 when every health check of the platform passes, 503 when one fails
//
// Both answer with a JSON body. /readyz reports each check by name, including
// "broker", the connectivity check the platform adds for a backend that can
// ping its broker (driver.Pinger):
//
//	{"status":"unavailable","checks":{"broker":{"ok":false,"error":"dial tcp 127.0.0.1:6379: connection refused"},"db":{"ok":true}}}
//
// Wire it next to a platform:
//
//	go http.ListenAndServe(":8080", health.Handler(p))
package health

import (
	"context"
	"encoding/json"
	"net/http"
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
	// Error is the check's error text when it failed.
	Error string `json:"error,omitempty"`
}

// Handler returns a handler serving /healthz (Liveness) and /readyz
// (Readiness(c)); any other path is 404.
func Handler(c Checker) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/healthz", Liveness())
	mux.Handle("/readyz", Readiness(c))
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
// when all passed on their last run, 503 otherwise, with each check's result
// in the body. It reads the last results, which the platform refreshes every
// Config.HealthInterval, so a probe costs no broker round trip; only when no
// result exists yet (the platform is not started) does it run the checks
// itself.
func Readiness(c Checker) http.Handler {
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
		rep := Report{Status: StatusOK, Checks: make(map[string]CheckResult, len(results))}
		for name, err := range results {
			res := CheckResult{OK: err == nil}
			if err != nil {
				res.Error = err.Error()
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
