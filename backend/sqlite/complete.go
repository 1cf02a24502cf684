package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/asyncplatform/asyncplatform/driver"
)

// ErrNotInHandler is returned by CompleteTx under a context that is not a
// handler's of this Backend.
var ErrNotInHandler = errors.New("sqlite: not a handler's context of this backend")

// CompleteTx settles the job whose handler runs under ctx within tx, the
// handler's own transaction: the job's row is deleted in tx, so the
// handler's writes in tx and the job's completion commit together, or
// neither does. The handler then returns nil as usual, and the platform's
// own settle finds the job done (it records the success, releases the
// unique key, and so on).
//
// It returns driver.ErrLeaseLost (wrapped) when the delivery is no longer
// held (its lease ran out and another worker may have the job): roll tx
// back. When tx rolls back for any reason, return an error from the
// handler (the job is retried as usual): a nil return completes the job
// without tx's writes.
//
// tx must be on the Backend's database file and begun IMMEDIATE, as the
// transactions of Backend.DB are. It holds the file's write lock until it
// ends, and the platform's lease extensions for every running job of the
// file wait for it (for at most Config.BusyTimeout): keep it short.
func (b *Backend) CompleteTx(ctx context.Context, tx *sql.Tx) error {
	if err := b.check(); err != nil {
		return err
	}
	d := driver.DeliveryFrom(ctx)
	if d == nil {
		return ErrNotInHandler
	}
	h, ok := d.Handle.(handle)
	if !ok {
		return ErrNotInHandler
	}
	res, err := tx.ExecContext(ctx, b.q.ack, h.id, h.token)
	if err != nil {
		return fmt.Errorf("sqlite: complete in a transaction: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlite: complete in a transaction: %w", err)
	}
	if n == 0 {
		return errLost("complete in a transaction")
	}
	b.completed.Store(h, struct{}{})
	return nil
}
