package postgres

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// execer runs one statement and reports the rows it affected: the pool,
// or a caller's transaction.
type execer interface {
	exec(ctx context.Context, sql string, args ...any) (int64, error)
}

// pgxExecer runs statements on a pgx pool, connection or transaction.
type pgxExecer struct {
	x interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	}
}

func (e pgxExecer) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := e.x.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

// sqlExecer runs statements on a database/sql transaction.
type sqlExecer struct{ tx *sql.Tx }

func (e sqlExecer) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	res, err := e.tx.ExecContext(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// txKey is the context key of a caller's transaction.
type txKey struct{}

// WithTx returns a context under which the Backend's Enqueue writes with
// tx, the caller's transaction, instead of a connection of
// their own: the jobs exist when tx commits (their receivers are woken
// then) and never when it rolls back. Enqueue through the platform with
// it:
//
//	err := p.Enqueue(postgres.WithTx(ctx, tx), job)
//
// tx must be on the Backend's database. Its statements fail, and so abort
// tx, as any failed statement does.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, execer(pgxExecer{tx}))
}

// WithSQLTx is WithTx for a database/sql transaction, on the pgx driver
// (github.com/jackc/pgx/v5/stdlib).
func WithSQLTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, execer(sqlExecer{tx}))
}

// db returns the caller's transaction in ctx, or the pool.
func (b *Backend) db(ctx context.Context) execer {
	if e, ok := ctx.Value(txKey{}).(execer); ok {
		return e
	}
	return pgxExecer{b.pool}
}
