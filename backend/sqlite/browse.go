package sqlite

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.Browser = (*Backend)(nil)

// makeBrowseQueries returns Browse's statement per state: a page of the
// job rows in claim order (run_at, id) after the cursor's key, served by
// the (queue, run_at, id) index. Parameters: the largest body returned,
// the queue, the key after which the page starts, the rows to read.
func makeBrowseQueries(q func(string) string) map[driver.BrowseState]string {
	const sel = `SELECT id, length(CAST(body AS BLOB)), CASE WHEN length(CAST(body AS BLOB)) <= ?1 THEN CAST(body AS BLOB) END, run_at, deliveries
		FROM {{p}}_jobs WHERE queue = ?2 AND (run_at, id) > (?3, ?4) AND `
	const order = ` ORDER BY run_at, id LIMIT ?5`
	return map[driver.BrowseState]string{
		driver.BrowseReady:     q(sel + `run_at <= NOW` + order),
		driver.BrowseScheduled: q(sel + `token = 0 AND run_at > NOW` + order),
		driver.BrowseInFlight:  q(sel + `token <> 0 AND run_at > NOW` + order),
	}
}

// Browse implements driver.Browser: a read of the job rows (it never waits
// for the writer), in claim order, paged by key (a row's run_at and ID).
// IDs are the rows' IDs.
func (b *Backend) Browse(ctx context.Context, queue string, state driver.BrowseState, cursor string, limit int) (driver.BrowsePage, error) {
	if err := b.check(); err != nil {
		return driver.BrowsePage{}, err
	}
	stmt, ok := b.q.browse[state]
	if !ok {
		return driver.BrowsePage{}, fmt.Errorf("sqlite: browse: unknown state %q", state)
	}
	at, id, ok, err := driver.ParseKeyCursor(state, cursor)
	if err != nil {
		return driver.BrowsePage{}, err
	}
	if !ok {
		at, id = -1<<62, 0
	}
	limit = driver.BrowseLimit(limit)
	rows, err := b.pool().QueryContext(ctx, stmt, driver.MaxBrowseBody, queue, at, id, limit+1)
	if err != nil {
		return driver.BrowsePage{}, b.wrap("browse "+string(state)+" of "+queue, err)
	}
	defer rows.Close()
	var (
		page driver.BrowsePage
		last [2]int64
	)
	for rows.Next() {
		var (
			rowID, runAt, size int64
			deliveries         int
			body               []byte
		)
		if err := rows.Scan(&rowID, &size, &body, &runAt, &deliveries); err != nil {
			return driver.BrowsePage{}, b.wrap("browse "+string(state)+" of "+queue, err)
		}
		if len(page.Items) == limit {
			page.Next = driver.KeyCursor(last[0], last[1])
			break
		}
		it := driver.BrowseItem{ID: strconv.FormatInt(rowID, 10), BodySize: int(size), At: time.UnixMilli(runAt), Deliveries: deliveries}
		if size <= driver.MaxBrowseBody {
			it.Body = nonNil(body)
		}
		page.Items = append(page.Items, it)
		last = [2]int64{runAt, rowID}
	}
	if err := rows.Err(); err != nil {
		return driver.BrowsePage{}, b.wrap("browse "+string(state)+" of "+queue, err)
	}
	return page, nil
}
