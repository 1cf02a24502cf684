package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/dashboard"
	"github.com/asyncplatform/asyncplatform/driver"
)

func dashboardCmd() *command {
	return &command{
		name:    "dashboard",
		noJSON:  true,
		args:    "",
		summary: "serve the web dashboard: queues, dead letters, redrive, purge, enqueue",
		help: `
It serves package dashboard on --listen until Ctrl-C: every queue the
backend holds with its depths, each queue's dead letters filtered and paged,
one dead letter in full, and the actions (pop, redrive, delete, purge,
enqueue). The browser needs nothing from the internet.

The dashboard has no login. --listen takes a loopback address unless
--allow-remote is given: put an authenticating proxy in front of it for
anyone else, or use --read-only, which refuses every action.

It sees depths only: the attempts charts need the dashboard mounted in the
workers' own process (see package dashboard's Recorder). It does not start
when the backend does not answer (exit code 1).

Examples:

	asyncctl dashboard --url redis://127.0.0.1:6379/0
	asyncctl dashboard --listen 127.0.0.1:9000 --read-only
	asyncctl dashboard --listen :8080 --allow-remote --prefix /jobs --queue emails
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var o dashboardOptions
			fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "serve on `ADDR` (host:port; port 0 picks a free one)")
			fs.BoolVar(&o.readOnly, "read-only", false, "refuse every action: only look")
			fs.BoolVar(&o.allowRemote, "allow-remote", false, "allow a --listen address other than loopback (the dashboard has no login)")
			fs.StringVar(&o.prefix, "prefix", "", "serve under this `PATH` (/jobs) instead of at the root")
			fs.Var(&o.queues, "queue", "a `QUEUE` to list even when the backend does not hold it yet (repeatable)")
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("dashboard takes no arguments (got %q)", args[0])
				}
				for _, q := range o.queues {
					if err := checkQueue("--queue", q); err != nil {
						return err
					}
				}
				if err := o.checkListen(); err != nil {
					return err
				}
				return c.dashboard(ctx, o)
			}
		},
	}
}

type dashboardOptions struct {
	listen      string
	readOnly    bool
	allowRemote bool
	prefix      string
	queues      listFlag
}

// checkListen refuses an address that is not loopback without
// --allow-remote.
func (o dashboardOptions) checkListen() error {
	host, _, err := net.SplitHostPort(o.listen)
	if err != nil {
		return usageErrorf("--listen %q: %v", o.listen, err)
	}
	if o.allowRemote || host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return usageErrorf("--listen %q is not a loopback address and the dashboard has no login: give --allow-remote (behind an authenticating proxy, or with --read-only)", o.listen)
}

func (c *cli) dashboard(ctx context.Context, o dashboardOptions) error {
	raw := c.url
	if raw == "" {
		raw = getenv(urlEnv)
		c.url = raw
	}
	if raw == "" {
		return usageErrorf("no backend URL: give --url or set %s (for example redis://127.0.0.1:6379/0)", urlEnv)
	}
	b, err := ap.Open(ctx, raw)
	if err != nil {
		if errors.Is(err, ap.ErrUnknownScheme) {
			return &exitErr{exitUsage, err}
		}
		return err
	}
	defer b.Close()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if c.verbose {
		logger = slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		verboseLogger.Store(logger)
	}
	p, err := ap.New(b, ap.Config{Logger: logger, WorkerName: "asyncctl-dashboard"})
	if err != nil {
		return fmt.Errorf("opening %s: %w", redactURL(raw), err)
	}
	if err := reach(ctx, b, p); err != nil {
		return fmt.Errorf("the backend %s is unreachable, so the dashboard did not start: %w", redactURL(raw), err)
	}
	d, err := dashboard.New(p, dashboard.Config{
		Prefix:   o.prefix,
		Queues:   o.queues,
		ReadOnly: o.readOnly,
		Deleter:  b,
		Title:    "asyncctl dashboard",
		Logger:   slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		return usageErrorf("%v", err)
	}
	mux := http.NewServeMux()
	if o.prefix == "" {
		mux.Handle("/", d)
	} else {
		mux.Handle(strings.TrimRight(o.prefix, "/")+"/", d)
		mux.Handle(strings.TrimRight(o.prefix, "/"), d)
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	mode := ""
	if o.readOnly {
		mode = ", read-only"
	}
	fmt.Fprintf(c.stdout, "dashboard of %s on http://%s%s/%s (Ctrl-C stops it)\n", block(redactURL(raw)), ln.Addr(), strings.TrimRight(o.prefix, "/"), mode)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	return nil
}

// reachTimeout bounds the dashboard's first call to the backend.
const reachTimeout = 15 * time.Second

// reach makes one call to the backend (Ping where it has one, else a
// listing of its queues), so that a dashboard whose every page would wait
// for an unreachable broker does not start.
func reach(ctx context.Context, b driver.Backend, p *ap.Platform) error {
	ctx, cancel := context.WithTimeout(ctx, reachTimeout)
	defer cancel()
	if pg, ok := b.(driver.Pinger); ok {
		return pg.Ping(ctx)
	}
	if _, err := p.QueueNames(ctx); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	return nil
}
