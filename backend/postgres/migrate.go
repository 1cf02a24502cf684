package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations are the schema's versions, one file each, named
// NNNN_subject.sql and applied in order; {{p}} stands for Config.Prefix.
// A released file is never changed: a change of schema is a new file.
//
//go:embed migrations/*.sql
var migrations embed.FS

// migration is one version of the schema.
type migration struct {
	version int
	sql     string
}

// loadMigrations returns the embedded migrations in order.
func loadMigrations() ([]migration, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	out := make([]migration, 0, len(names))
	for _, n := range names {
		base := strings.TrimPrefix(n, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("postgres: migration %s: no version number", n)
		}
		b, err := migrations.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// SchemaVersion is the version of the schema this package writes and
// reads: the last of its migrations.
func SchemaVersion() int {
	ms, err := loadMigrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].version
}

// Migrate brings the schema of the tables named by prefix up to
// SchemaVersion, applying each missing migration in a transaction of its
// own under an advisory lock, so that processes starting together apply
// each one once. New calls it unless Config.SkipMigrate is set.
func Migrate(ctx context.Context, pool *pgxpool.Pool, prefix string) error {
	return migrateTo(ctx, pool, prefix, SchemaVersion())
}

// migrateTo applies the missing migrations up to version, and none after.
func migrateTo(ctx context.Context, pool *pgxpool.Pool, prefix string, version int) error {
	if !validPrefix(prefix) {
		return fmt.Errorf("postgres: prefix %q: want 1 to 40 bytes of [a-z0-9_], starting with a letter", prefix)
	}
	ms, err := loadMigrations()
	if err != nil {
		return fmt.Errorf("postgres: reading migrations: %w", err)
	}
	for _, m := range ms {
		if m.version > version {
			break
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('asyncplatform postgres ' || $1))`, prefix); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+prefix+`_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
				return err
			}
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+prefix+`_migrations WHERE version = $1)`, m.version).Scan(&done); err != nil {
				return err
			}
			if done {
				return nil
			}
			if _, err := tx.Exec(ctx, strings.ReplaceAll(m.sql, "{{p}}", prefix)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+prefix+`_migrations (version) VALUES ($1)`, m.version)
			return err
		})
		if err != nil {
			return fmt.Errorf("postgres: migration %d of %s: %w", m.version, prefix, err)
		}
	}
	return nil
}

// validPrefix reports whether s can start the backend's table names.
func validPrefix(s string) bool {
	if s == "" || len(s) > 40 || !('a' <= s[0] && s[0] <= 'z') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Version returns the schema version of the tables named by prefix: the
// last migration applied, 0 when none was.
func Version(ctx context.Context, pool *pgxpool.Pool, prefix string) (int, error) {
	if !validPrefix(prefix) {
		return 0, fmt.Errorf("postgres: prefix %q: want 1 to 40 bytes of [a-z0-9_], starting with a letter", prefix)
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, prefix+"_migrations").Scan(&exists); err != nil {
		return 0, fmt.Errorf("postgres: schema version of %s: %w", prefix, err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+prefix+`_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("postgres: schema version of %s: %w", prefix, err)
	}
	return v, nil
}

// MigrateURL applies the missing migrations of the tables a backend URL
// names (its prefix parameter; see the package documentation, URLs), as
// asyncctl migrate does, and returns the schema version before and after.
// It opens no wake-ups' connection and no store.
func MigrateURL(ctx context.Context, u *url.URL) (before, after int, err error) {
	cfg, err := parseURL(u)
	if err != nil {
		return 0, 0, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return 0, 0, err
	}
	pool, err := pgxpool.New(ctx, cfg.URL)
	if err != nil {
		return 0, 0, fmt.Errorf("postgres: Config.URL: %w", err)
	}
	defer pool.Close()
	if before, err = Version(ctx, pool, cfg.Prefix); err != nil {
		return 0, 0, err
	}
	if err := Migrate(ctx, pool, cfg.Prefix); err != nil {
		return before, 0, err
	}
	after, err = Version(ctx, pool, cfg.Prefix)
	return before, after, err
}
