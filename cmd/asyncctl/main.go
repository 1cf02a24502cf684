// Command asyncctl operates asyncplatform queues and dead letters on any
// backend, opened from a URL: find every queue and its depths, watch them
// live (top), enqueue jobs, and list, show, pop, redrive or purge dead
// letters. Run "asyncctl help" for the commands, their flags, examples and
// exit codes, and "asyncctl completion" for shell completion.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"

	ap "github.com/asyncplatform/asyncplatform"

	"github.com/asyncplatform/asyncplatform/backend/redis"

	// Every backend, so that its URL schemes are registered with the driver.
	_ "github.com/asyncplatform/asyncplatform/backend/all"
)

// Exit codes, documented in the top-level help.
const (
	exitOK       = 0 // done
	exitError    = 1 // the command failed
	exitUsage    = 2 // bad command line
	exitNotFound = 3 // nothing matched: no such dead letter, an empty dead-letter queue
	exitDeclined = 4 // answered no at a confirmation prompt; nothing was changed
)

// urlEnv names the variable that gives the backend URL when --url is not set.
const urlEnv = "ASYNCPLATFORM_URL"

func main() {
	// The first Ctrl-C (or SIGTERM) cancels ctx: a long operation stops
	// between two records. Then the signals' default comes back, so a
	// second one ends the process at once.
	// go-redis logs its dial failures on its own, before the error that
	// asyncctl prints: they go where the platform's logs go (stderr with
	// -v, nowhere without).
	redis.SetClientLogger(slog.New(clientLogs{}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// verboseLogger is the logger of -v, once a command has opened the
// backend with it; nil without -v.
var verboseLogger atomic.Pointer[slog.Logger]

// clientLogs is the handler of the broker clients' own logs: it hands them
// to verboseLogger, and drops them without one.
type clientLogs struct{}

func (clientLogs) Enabled(context.Context, slog.Level) bool { return verboseLogger.Load() != nil }
func (clientLogs) Handle(ctx context.Context, r slog.Record) error {
	if l := verboseLogger.Load(); l != nil {
		return l.Handler().Handle(ctx, r)
	}
	return nil
}
func (h clientLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h clientLogs) WithGroup(string) slog.Handler      { return h }

// exitErr carries an exit code other than exitError.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string { return e.err.Error() }
func (e *exitErr) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitErr{exitUsage, fmt.Errorf(format, args...)}
}

func notFoundf(format string, args ...any) error {
	return &exitErr{exitNotFound, fmt.Errorf(format, args...)}
}

// cli is one run of the command: its streams and the flags every command
// takes.
type cli struct {
	stdin          io.Reader
	in             *bufio.Reader // stdin, buffered on first use
	stdout, stderr io.Writer

	url     string
	json    bool
	verbose bool

	trackStatus bool // the platform writes the status of the jobs it enqueues (enqueue --track-status)
}

// command is one (sub)command.
type command struct {
	name    string // "queues", "dead list"
	args    string // the synopsis after the flags
	summary string // one line, for the command list
	help    string // the rest of its --help: what it does, examples
	noJSON  bool   // it prints nothing --json could change: its help leaves --json out
	// setup defines the command's own flags and returns its action.
	setup func(fs *flag.FlagSet) func(ctx context.Context, c *cli, args []string) error
}

func commands() []*command {
	return []*command{queuesCmd(), topCmd(), enqueueCmd(), deadListCmd(), deadShowCmd(), deadPopCmd(), deadRedriveCmd(), deadPurgeCmd(), jobsCmd(), jobShowCmd(), jobCancelCmd(), workflowShowCmd(), workflowCancelCmd(), pauseCmd(), resumeCmd(), schedulesListCmd(), schedulesTriggerCmd(), workersCmd(), completionCmd(), dashboardCmd(), migrateCmd(), relayCmd()}
}

const mainHelp = `asyncctl operates asyncplatform queues and dead letters on any backend.

Usage:

	asyncctl [--url URL] [--json] [-v] COMMAND [flags] [args]

Commands:

%s
Flags (every command takes them, before or after its name):

	--url URL    the backend; defaults to $ASYNCPLATFORM_URL
	--json       print JSON for scripts instead of tables for people
	-v           log what the platform does to stderr

Backend URLs (a backend's scheme is there when its package registers it):

	memory://NAME                             in-process; gone when asyncctl exits (for trying it out)
	redis://[:PASSWORD@]HOST:6379/DB[?prefix=NAME]   prefix: the key prefix of the platform's keys (default asyncplatform)
	amqp://USER:PASSWORD@HOST:5672/VHOST      RabbitMQ
	nats://HOST:4222
	the Azure form registered by backend/azure (see its package doc)

Registered schemes in this binary: %s.
Credentials in the URL are never printed, in errors included.

Exit codes:

	0  done
	1  the command failed (the broker is unreachable, say)
	2  bad command line
	3  nothing found: no such dead letter, an empty dead-letter queue, an unknown queue
	4  answered no at a confirmation prompt; nothing was changed
	130  interrupted (Ctrl-C) between two records; it says how far it got

Examples:

	export ASYNCPLATFORM_URL=redis://127.0.0.1:6379/0
	asyncctl queues
	asyncctl top
	asyncctl dead list --queue emails --reason retries_exceeded
	asyncctl dead redrive --queue emails --all --rate 50

Run "asyncctl help COMMAND" (or "asyncctl COMMAND --help") for a command's flags and examples,
and "asyncctl help completion" for the shells' completion of commands, flags and queue names.
`

// run is the whole command, minus the process: it returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	if len(args) > 0 && args[0] == "__complete" { // what the completion scripts call
		return c.complete(ctx, args[1:])
	}
	cmds := commands()

	global := flag.NewFlagSet("asyncctl", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	c.commonFlags(global)
	global.Usage = func() {}
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printMain(stdout, cmds)
			return exitOK
		}
		fmt.Fprintf(stderr, "asyncctl: %v\nRun \"asyncctl help\" for usage.\n", err)
		return exitUsage
	}
	args = global.Args()
	if len(args) == 0 {
		printMain(stderr, cmds)
		return exitUsage
	}
	if args[0] == "help" {
		if len(args) == 1 {
			printMain(stdout, cmds)
			return exitOK
		}
		cmd, _ := find(cmds, args[1:])
		if cmd == nil {
			fmt.Fprintf(stderr, "asyncctl: no command %q\n", strings.Join(args[1:], " "))
			return exitUsage
		}
		printHelp(stdout, cmd, c.newFlagSet(cmd))
		return exitOK
	}
	cmd, rest := find(cmds, args)
	if cmd == nil && args[0] == "dead" {
		fmt.Fprintf(stderr, "asyncctl: dead needs a subcommand: list, show, pop, redrive or purge\nRun \"asyncctl help\" for usage.\n")
		return exitUsage
	}
	if cmd == nil && args[0] == "schedules" {
		fmt.Fprintf(stderr, "asyncctl: schedules needs a subcommand: list or trigger\nRun \"asyncctl help\" for usage.\n")
		return exitUsage
	}
	if cmd == nil && args[0] == "job" {
		fmt.Fprintf(stderr, "asyncctl: job needs a subcommand: show or cancel\nRun \"asyncctl help\" for usage.\n")
		return exitUsage
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "asyncctl: unknown command %q\nRun \"asyncctl help\" for usage.\n", strings.Join(args, " "))
		return exitUsage
	}
	fs := c.newFlagSet(cmd)
	action := cmd.setup(fs)
	pos, err := parseInterspersed(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(stdout, cmd, c.newFlagSet(cmd))
			return exitOK
		}
		fmt.Fprintf(stderr, "asyncctl %s: %v\nRun \"asyncctl %s --help\" for usage.\n", cmd.name, err, cmd.name)
		return exitUsage
	}
	err = action(ctx, c, pos)
	if err == nil {
		return exitOK
	}
	code := exitError
	var ee *exitErr
	if errors.As(err, &ee) {
		code = ee.code
	}
	// Escaped: an error may quote a record's ID or type; a line of it
	// after the first is indented, so that none passes for a line of ours.
	fmt.Fprintf(stderr, "asyncctl %s: %s\n", cmd.name, strings.ReplaceAll(block(c.redact(err.Error())), "\n", "\n  "))
	if code == exitUsage {
		fmt.Fprintf(stderr, "Run \"asyncctl %s --help\" for usage.\n", cmd.name)
	}
	return code
}

// find returns the command named by the first one or two words of args, and
// the arguments after them.
func find(cmds []*command, args []string) (*command, []string) {
	for _, cmd := range cmds {
		words := strings.Fields(cmd.name)
		if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == cmd.name {
			return cmd, args[len(words):]
		}
	}
	return nil, nil
}

func (c *cli) commonFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "url", c.url, "the backend `URL`; defaults to $"+urlEnv)
	fs.BoolVar(&c.json, "json", c.json, "print JSON instead of a table")
	fs.BoolVar(&c.verbose, "v", c.verbose, "log what the platform does to stderr")
}

// newFlagSet returns a flag set for the command with the common flags,
// their defaults taken from the global flags already parsed.
func (c *cli) newFlagSet(cmd *command) *flag.FlagSet {
	fs := flag.NewFlagSet("asyncctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints errors and help itself
	fs.Usage = func() {}
	c.commonFlags(fs)
	return fs
}

// parseInterspersed parses flags given before, between and after positional
// arguments ("dead show ID --json"), and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func printMain(w io.Writer, cmds []*command) {
	var list strings.Builder
	width := 13
	for _, cmd := range cmds {
		width = max(width, len(cmd.name))
	}
	for _, cmd := range cmds {
		fmt.Fprintf(&list, "\t%-*s %s\n", width, cmd.name, cmd.summary)
	}
	fmt.Fprintf(w, mainHelp, list.String(), strings.Join(schemes(), ", "))
}

func printHelp(w io.Writer, cmd *command, fs *flag.FlagSet) {
	cmd.setup(fs)
	fmt.Fprintf(w, "Usage: asyncctl %s [flags] %s\n\n%s\n\n%s\nFlags:\n\n", cmd.name, cmd.args, cmd.summary, strings.TrimSpace(cmd.help)+"\n")
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "json" || !cmd.noJSON {
			shown.Var(f.Value, f.Name, f.Usage)
		}
	})
	shown.SetOutput(w)
	shown.PrintDefaults()
	fmt.Fprintf(w, "\nExit codes: 0 done, 1 failed, 2 bad command line, 3 nothing found, 4 declined at a prompt, 130 interrupted.\n")
}

// open opens the backend and a platform over it. The caller calls close.
func (c *cli) open(ctx context.Context) (p *ap.Platform, closeFn func(), err error) {
	raw := c.url
	if raw == "" {
		raw = getenv(urlEnv)
		c.url = raw
	}
	if raw == "" {
		return nil, nil, usageErrorf("no backend URL: give --url or set %s (for example redis://127.0.0.1:6379/0)", urlEnv)
	}
	b, err := ap.Open(ctx, raw)
	if err != nil {
		if errors.Is(err, ap.ErrUnknownScheme) {
			return nil, nil, &exitErr{exitUsage, err}
		}
		return nil, nil, err
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if c.verbose {
		logger = slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		verboseLogger.Store(logger)
	}
	p, err = ap.New(b, ap.Config{Logger: logger, WorkerName: "asyncctl", TrackStatus: c.trackStatus})
	if errors.Is(err, ap.ErrInvalidConfig) && c.trackStatus {
		b.Close()
		return nil, nil, &exitErr{exitUsage, fmt.Errorf("--track-status: %w", err)}
	}
	if err != nil {
		b.Close()
		return nil, nil, fmt.Errorf("opening %s: %w", redactURL(raw), err)
	}
	return p, func() { b.Close() }, nil
}

// getenv is os.Getenv; tests replace it.
var getenv = os.Getenv

// secretKey matches the names of URL query or connection-string parameters
// whose values are secrets.
var secretKey = regexp.MustCompile(`(?i)(password|passwd|secret|token|key|sig|signature)[^=;&]*=([^;&]+)`)

// secrets returns the secret parts of a backend URL, in every form an error
// may quote them: the user part as written, decoded and re-encoded; the
// password; a user with no password (a token: NATS token auth); and the
// values of parameters named like keys, tokens or signatures, raw and
// decoded.
func secrets(raw string) []string {
	var out []string
	add := func(s string) {
		out = append(out, s, url.QueryEscape(s), url.PathEscape(s))
		if v, err := url.PathUnescape(s); err == nil {
			out = append(out, v)
		}
		if v, err := url.QueryUnescape(s); err == nil {
			out = append(out, v)
		}
	}
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			rest = rest[:i]
		}
		if i := strings.LastIndex(rest, "@"); i >= 0 {
			userinfo := rest[:i]
			add(userinfo)
			if user, pw, ok := strings.Cut(userinfo, ":"); ok {
				add(pw)
			} else {
				add(user)
			}
		}
	}
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		add(u.User.String())
		if pw, ok := u.User.Password(); ok {
			add(pw)
		} else {
			add(u.User.Username())
		}
	}
	for _, m := range secretKey.FindAllStringSubmatch(raw, -1) {
		add(m[2])
	}
	return out
}

// redact removes the URL's secrets from s, longest first so that no part of
// one is left.
func (c *cli) redact(s string) string {
	return redactSecrets(s, c.url)
}

// redactURL returns the URL fit to print: no user part but the user name
// beside a password, no secret parameter.
func redactURL(raw string) string {
	s := raw
	if u, err := url.Parse(raw); err == nil {
		if u.User != nil {
			if _, ok := u.User.Password(); !ok {
				u.User = url.User("xxxxx") // a token
			}
		}
		s = u.Redacted()
	}
	return redactSecrets(s, raw)
}

// line reads one line of stdin, trimmed; io.EOF when stdin is done. It
// returns ctx.Err() when ctx ends first (Ctrl-C at a prompt); the read
// itself ends with the process.
func (c *cli) line(ctx context.Context) (string, error) {
	if c.in == nil {
		c.in = bufio.NewReader(c.stdin)
	}
	type result struct {
		s   string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := c.in.ReadString('\n')
		ch <- result{s, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil && (r.s == "" || !errors.Is(r.err, io.EOF)) {
			return "", r.err
		}
		return strings.TrimSpace(r.s), nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// confirm asks a yes/no question on stderr; only "y" or "yes" is yes.
func (c *cli) confirm(ctx context.Context, question string) (bool, error) {
	fmt.Fprintf(c.stderr, "%s [y/N] ", question)
	ans, err := c.line(ctx)
	if errors.Is(err, io.EOF) {
		fmt.Fprintln(c.stderr)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the answer: %w", err)
	}
	ans = strings.ToLower(ans)
	return ans == "y" || ans == "yes", nil
}
