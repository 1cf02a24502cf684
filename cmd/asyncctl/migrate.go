package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"

	"github.com/asyncplatform/asyncplatform/backend/postgres"
)

func migrateCmd() *command {
	return &command{
		name:    "migrate",
		summary: "apply the backend's missing schema migrations (PostgreSQL)",
		help: `
A PostgreSQL backend keeps its jobs in versioned tables; a worker applies
the missing migrations when it starts, unless its URL says skip_migrate=true.
migrate applies them ahead of a deployment instead, under the same advisory
lock (workers starting meanwhile wait for it), and prints the schema
version before and after. The URL's prefix parameter names the tables.
Other backends keep no schema: migrate says so and changes nothing.

Examples:

	asyncctl --url 'postgres://app@db/app?prefix=jobs' migrate
	asyncctl --url 'postgres://app@db/app' migrate --json
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("migrate takes no arguments")
				}
				return c.migrate(ctx)
			}
		},
	}
}

// migrateJSON is what migrate --json prints.
type migrateJSON struct {
	Schema bool `json:"schema"` // the backend keeps a versioned schema
	Before int  `json:"before"`
	After  int  `json:"after"`
}

func (c *cli) migrate(ctx context.Context) error {
	raw := c.url
	if raw == "" {
		raw = getenv(urlEnv)
		c.url = raw
	}
	if raw == "" {
		return usageErrorf("no backend URL: give --url or set %s (for example postgres://app@db/app)", urlEnv)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return usageErrorf("the backend URL does not parse")
	}
	var out migrateJSON
	if u.Scheme == "postgres" || u.Scheme == "postgresql" {
		out.Schema = true
		if out.Before, out.After, err = postgres.MigrateURL(ctx, u); err != nil {
			return err
		}
	}
	if c.json {
		return json.NewEncoder(c.stdout).Encode(out)
	}
	switch {
	case !out.Schema:
		fmt.Fprintf(c.stdout, "nothing to migrate: a %s backend keeps no schema\n", u.Scheme)
	case out.Before == out.After:
		fmt.Fprintf(c.stdout, "schema at version %d: up to date\n", out.After)
	default:
		fmt.Fprintf(c.stdout, "schema migrated from version %d to %d\n", out.Before, out.After)
	}
	return nil
}
