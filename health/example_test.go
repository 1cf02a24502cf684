package health_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/health"
)

// A worker serving its probes next to its platform. A real one would run
// http.ListenAndServe(":8080", health.Handler(p)) in a goroutine.
func Example() {
	ctx := context.Background()
	backend := memory.NewBroker().Connect()
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{
		HealthChecks: map[string]ap.HealthCheck{
			"db": func(context.Context) error { return errors.New("db: connection refused") },
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	p.CheckHealth(ctx) // a started platform runs its checks by itself

	// The body says which check fails; the log says why (time left out
	// here so that the output is stable).
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	srv := httptest.NewServer(health.Handler(p, health.WithLogger(logger)))
	defer srv.Close()
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%s %d %s", path, resp.StatusCode, body)
	}
	// Output:
	// /healthz 200 {"status":"ok"}
	// level=WARN msg="health: check fails; /readyz answers 503" check=db error="db: connection refused"
	// /readyz 503 {"status":"unavailable","checks":{"db":{"ok":false}}}
}
