package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/outbox"
)

func relayCmd() *command {
	var from, to string
	var batch int
	return &command{
		name:    "relay",
		args:    "--from URL --to URL",
		summary: "move the jobs of a PostgreSQL or SQLite outbox to another backend",
		help: `
Jobs enqueued under postgres.OutboxTx (or sqlite.OutboxTx) wait in the
--from backend's outbox table, committed with the caller's own writes. relay
moves them to the --to backend until interrupted: per queue in commit order,
at least once (a row is deleted only once --to confirmed it), each copy with
the job's ID, so a duplicate is recognisable. Run several at once: they share
the queues (one lease per queue) without publishing a row twice. A row that
cannot be published is moved to the outbox's aside table (<prefix>_outbox_aside)
and logged. Errors and warnings go to stderr (-v adds what it does); on exit
it prints its counts.

Examples:

	asyncctl relay --from 'postgres://app@db/app' --to redis://127.0.0.1:6379/0
	asyncctl relay --from sqlite:///var/lib/app/jobs.db --to nats://127.0.0.1:4222
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			fs.StringVar(&from, "from", "", "the outbox's backend URL (postgres:// or sqlite://)")
			fs.StringVar(&to, "to", "", "the backend the jobs go to")
			fs.IntVar(&batch, "batch", outbox.DefaultBatch, "the most jobs in one publish")
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("relay takes no arguments")
				}
				if from == "" || to == "" {
					return usageErrorf("relay needs --from and --to")
				}
				err := c.relay(ctx, from, to, batch)
				if err != nil {
					err = errors.New(redactSecrets(redactSecrets(err.Error(), from), to))
				}
				return err
			}
		},
	}
}

func (c *cli) relay(ctx context.Context, from, to string, batch int) error {
	src, err := ap.Open(ctx, from)
	if err != nil {
		return fmt.Errorf("--from %s: %w", redactURL(from), err)
	}
	defer src.Close()
	source, ok := src.(outbox.Source)
	if !ok {
		return usageErrorf("--from %s: this backend keeps no outbox (PostgreSQL and SQLite do)", redactURL(from))
	}
	dst, err := ap.Open(ctx, to)
	if err != nil {
		return fmt.Errorf("--to %s: %w", redactURL(to), err)
	}
	defer dst.Close()
	// Warnings and errors (a target refusing, a row moved aside) always
	// reach stderr: a relay that fails quietly looks like an empty outbox.
	level := slog.LevelWarn
	if c.verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: level}))
	r, err := outbox.New(outbox.Config{Source: source, Target: driver.Backend(dst), Batch: batch, Logger: logger})
	if err != nil {
		return usageErrorf("%v", err)
	}
	_ = r.Run(ctx)
	s := r.Stats()
	fmt.Fprintf(c.stdout, "relayed %d jobs, %d moved aside\n", s.Published, s.Aside)
	return nil
}
