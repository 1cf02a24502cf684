package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.Browser = (*Backend)(nil)

// makeBrowseQueries returns Browse's statement per state: a page of the
// job rows in claim order (run_at, id) after the cursor's key, served by
// the (queue, run_at, id) index. $1 queue, $2 and $3 the key after which
// the page starts, $4 the rows to read, $5 the largest body returned.
func makeBrowseQueries(q func(string) string) map[driver.BrowseState]string {
	const sel = `SELECT id, octet_length(body), CASE WHEN octet_length(body) <= $5 THEN body END, run_at, deliveries
		FROM {{p}}_jobs WHERE queue = $1 AND (run_at, id) > ($2, $3) AND `
	const order = ` ORDER BY run_at, id LIMIT $4`
	return map[driver.BrowseState]string{
		driver.BrowseReady:     q(sel + `run_at <= now()` + order),
		driver.BrowseScheduled: q(sel + `token = 0 AND run_at > now()` + order),
		driver.BrowseInFlight:  q(sel + `token <> 0 AND run_at > now()` + order),
	}
}

// keyStart is the key before every row's.
var keyStart = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)

// Browse implements driver.Browser: a read of the job rows, in claim
// order, paged by key (a row's run_at and ID), so that a page costs the
// same wherever it starts. IDs are the rows' IDs.
func (b *Backend) Browse(ctx context.Context, queue string, state driver.BrowseState, cursor string, limit int) (driver.BrowsePage, error) {
	if err := b.check(); err != nil {
		return driver.BrowsePage{}, err
	}
	stmt, ok := b.q.browse[state]
	if !ok {
		return driver.BrowsePage{}, fmt.Errorf("postgres: browse: unknown state %q", state)
	}
	at, id, ok, err := driver.ParseKeyCursor(state, cursor)
	if err != nil {
		return driver.BrowsePage{}, err
	}
	after := keyStart
	if ok {
		if at < keyStart.UnixMicro() { // no row's (and out of the server's range): a forged cursor
			return driver.BrowsePage{}, driver.NewCursorError(state, cursor)
		}
		after = time.UnixMicro(at)
	}
	limit = driver.BrowseLimit(limit)
	rows, err := b.pool.Query(ctx, stmt, queue, after, id, limit+1, driver.MaxBrowseBody)
	if err != nil {
		return driver.BrowsePage{}, b.wrap("browse "+string(state)+" of "+queue, err)
	}
	var (
		page       driver.BrowsePage
		rowID      int64
		size       int
		body       []byte
		runAt      time.Time
		deliveries int
	)
	_, err = pgx.ForEachRow(rows, []any{&rowID, &size, &body, &runAt, &deliveries}, func() error {
		if len(page.Items) == limit {
			last := page.Items[limit-1]
			n, _ := strconv.ParseInt(last.ID, 10, 64)
			page.Next = driver.KeyCursor(last.At.UnixMicro(), n)
			return nil
		}
		page.Items = append(page.Items, driver.BrowseItem{ID: strconv.FormatInt(rowID, 10), Body: body, BodySize: size, At: runAt, Deliveries: deliveries})
		body = nil
		return nil
	})
	if err != nil {
		return driver.BrowsePage{}, b.wrap("browse "+string(state)+" of "+queue, err)
	}
	return page, nil
}
