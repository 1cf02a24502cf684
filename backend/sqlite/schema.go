package sqlite

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/asyncplatform/asyncplatform/driver"
)

// SchemaVersion is the version of the tables New creates, recorded in
// <prefix>_schema.
const SchemaVersion = 2

// now is the database's clock in milliseconds since the Unix epoch, read
// once per statement after the statement has its locks (so a statement
// that waited for the write lock starts a lease from when it got it).
const now = `CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)`

// schema creates the tables; {{p}} is the prefix.
const schema = `
CREATE TABLE IF NOT EXISTS {{p}}_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS {{p}}_jobs (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	queue      TEXT    NOT NULL,
	body       BLOB    NOT NULL,
	run_at     INTEGER NOT NULL,
	deliveries INTEGER NOT NULL DEFAULT 0,
	token      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS {{p}}_jobs_due ON {{p}}_jobs (queue, run_at, id);
CREATE TABLE IF NOT EXISTS {{p}}_dead (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	queue      TEXT    NOT NULL,
	rec_id     BLOB    NOT NULL,
	body       BLOB    NOT NULL,
	held_until INTEGER NOT NULL DEFAULT 0,
	token      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS {{p}}_dead_queue ON {{p}}_dead (queue, id);
CREATE INDEX IF NOT EXISTS {{p}}_dead_rec ON {{p}}_dead (queue, rec_id);
CREATE TABLE IF NOT EXISTS {{p}}_queues (name TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS {{p}}_store (
	key        TEXT    PRIMARY KEY,
	value      BLOB    NOT NULL,
	rev        INTEGER NOT NULL,
	expires_at INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {{p}}_store_expiry ON {{p}}_store (expires_at) WHERE expires_at <> 0;
CREATE TABLE IF NOT EXISTS {{p}}_seq (name TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO {{p}}_seq (name, n) VALUES ('rev', 0);
CREATE TABLE IF NOT EXISTS {{p}}_outbox (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	queue      TEXT    NOT NULL,
	id         TEXT    NOT NULL,
	dedupe     TEXT    NOT NULL,
	body       BLOB    NOT NULL,
	not_before INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS {{p}}_outbox_queue ON {{p}}_outbox (queue, seq);
CREATE TABLE IF NOT EXISTS {{p}}_outbox_aside (
	seq        INTEGER PRIMARY KEY,
	queue      TEXT    NOT NULL,
	id         TEXT    NOT NULL,
	dedupe     TEXT    NOT NULL,
	body       BLOB    NOT NULL,
	not_before INTEGER NOT NULL,
	reason     TEXT    NOT NULL,
	moved_at   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS {{p}}_outbox_lease (
	queue TEXT    PRIMARY KEY,
	owner INTEGER NOT NULL,
	until INTEGER NOT NULL
) WITHOUT ROWID;
`

// migrate creates the tables when missing, in one write transaction, and
// refuses a file whose tables are of a later version. Every version adds
// tables only (version 2: the outbox's), so an earlier file is brought up
// to date by creating the missing ones.
func (b *Backend) migrate(ctx context.Context) error {
	err := b.write(ctx, func(c conn) error {
		if _, err := c.ExecContext(ctx, strings.ReplaceAll(schema, "{{p}}", b.cfg.Prefix)); err != nil {
			return err
		}
		var n, v int
		if err := c.QueryRowContext(ctx, `SELECT count(*), coalesce(max(version), 0) FROM `+b.cfg.Prefix+`_schema`).Scan(&n, &v); err != nil {
			return err
		}
		switch {
		case n == 0:
			_, err := c.ExecContext(ctx, `INSERT INTO `+b.cfg.Prefix+`_schema (version) VALUES (?)`, SchemaVersion)
			return err
		case v > SchemaVersion:
			return fmt.Errorf("the tables are at schema version %d, this backend knows %d", v, SchemaVersion)
		case v < SchemaVersion:
			_, err := c.ExecContext(ctx, `UPDATE `+b.cfg.Prefix+`_schema SET version = ?`, SchemaVersion)
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqlite: creating the tables in %s: %w", b.cfg.Path, err)
	}
	return nil
}

// queries are the statements, with the prefix in them. Times are
// milliseconds since the Unix epoch.
type queries struct {
	declare, delJobs, delDead, delQueue, queues, stats                         string
	enqueue, ready, pick, claim, nextDue, unclaim, ack, extend, requeue        string
	takeJob, insertDead                                                        string
	nextDead, extendDead, removeDead, releaseDead, listDead, deleteDead, purge string
	get, create, update, deleteKey, deleteRev, list, nextRev, sweep            string
	getEach, deleteValue, nextRevs                                             string
	browse                                                                     map[driver.BrowseState]string
}

// readValue and readKey bound a store value and key read off the file:
// one byte past driver.MaxValueLen and driver.MaxStoreKeyLen, which the
// store never writes. They are cut as bytes (CAST AS BLOB): substr counts
// the characters of a TEXT value, up to four bytes each.
var (
	readValue = strconv.Itoa(driver.MaxValueLen + 1)
	readKey   = strconv.Itoa(driver.MaxStoreKeyLen + 1)
)

func makeQueries(p string) queries {
	r := strings.NewReplacer("{{p}}", p, "NOW", now)
	q := r.Replace
	const held = `token = ? AND run_at > NOW`
	const present = `(expires_at = 0 OR expires_at > NOW)`
	return queries{
		declare:  q(`INSERT INTO {{p}}_queues (name) VALUES (?) ON CONFLICT DO NOTHING`),
		delJobs:  q(`DELETE FROM {{p}}_jobs WHERE queue = ?`),
		delDead:  q(`DELETE FROM {{p}}_dead WHERE queue = ?`),
		delQueue: q(`DELETE FROM {{p}}_queues WHERE name = ?`),
		queues: q(`SELECT DISTINCT queue FROM {{p}}_jobs UNION SELECT DISTINCT queue FROM {{p}}_dead
			UNION SELECT name FROM {{p}}_queues ORDER BY 1`),
		stats: q(`SELECT
			coalesce(sum(run_at <= NOW), 0),
			coalesce(sum(token = 0 AND run_at > NOW), 0),
			coalesce(sum(token <> 0 AND run_at > NOW), 0),
			(SELECT count(*) FROM {{p}}_dead WHERE queue = ?1),
			coalesce(min(CASE WHEN run_at <= NOW THEN run_at END), 0)
			FROM {{p}}_jobs WHERE queue = ?1`),
		browse:  makeBrowseQueries(q),
		enqueue: q(`INSERT INTO {{p}}_jobs (queue, body, run_at) VALUES (?, ?, max(?, NOW))`),
		ready:   q(`SELECT 1 FROM {{p}}_jobs WHERE queue = ? AND run_at <= NOW LIMIT 1`),
		pick:    q(`SELECT id, run_at FROM {{p}}_jobs WHERE queue = ? AND run_at <= NOW ORDER BY run_at, id LIMIT ?`),
		claim: q(`UPDATE {{p}}_jobs SET token = ?, deliveries = deliveries + 1, run_at = NOW + ?
			WHERE id IN (SELECT value FROM json_each(?)) RETURNING id, deliveries, substr(CAST(body AS BLOB), 1, ?)`),
		nextDue: q(`SELECT min(run_at) - NOW FROM {{p}}_jobs WHERE queue = ? AND run_at > NOW`),
		unclaim: q(`UPDATE {{p}}_jobs SET token = 0, deliveries = deliveries - 1, run_at = ? WHERE id = ? AND token = ?`),
		ack:     q(`DELETE FROM {{p}}_jobs WHERE id = ? AND ` + held),
		extend:  q(`UPDATE {{p}}_jobs SET run_at = NOW + ? WHERE id = ? AND ` + held),
		requeue: q(`UPDATE {{p}}_jobs SET body = ?, run_at = max(?, NOW), deliveries = 0, token = 0
			WHERE id = ? AND ` + held + ` RETURNING run_at <= NOW`),
		takeJob:    q(`DELETE FROM {{p}}_jobs WHERE id = ? AND ` + held + ` RETURNING queue`),
		insertDead: q(`INSERT INTO {{p}}_dead (queue, rec_id, body) VALUES (?, ?, ?)`),
		nextDead: q(`UPDATE {{p}}_dead SET token = ?, held_until = NOW + ?
			WHERE id = (SELECT id FROM {{p}}_dead WHERE queue = ? AND held_until <= NOW ORDER BY id LIMIT 1)
			RETURNING id, substr(rec_id, 1, ?), substr(CAST(body AS BLOB), 1, ?)`),
		extendDead:  q(`UPDATE {{p}}_dead SET held_until = NOW + ? WHERE id = ? AND token = ? AND held_until > NOW`),
		removeDead:  q(`DELETE FROM {{p}}_dead WHERE id = ? AND token = ? AND held_until > NOW`),
		releaseDead: q(`UPDATE {{p}}_dead SET held_until = 0, token = 0 WHERE id = ? AND token = ? AND held_until > NOW`),
		listDead:    q(`SELECT id, substr(rec_id, 1, ?), substr(CAST(body AS BLOB), 1, ?) FROM {{p}}_dead WHERE queue = ? AND id > ? ORDER BY id LIMIT ?`),
		deleteDead:  q(`DELETE FROM {{p}}_dead WHERE queue = ? AND rec_id = ? AND held_until <= NOW`),
		purge:       q(`DELETE FROM {{p}}_dead WHERE queue = ?`),

		// A value or key read back is cut one byte past its limit
		// (readValue, readKey): the rows are untrusted.
		get: q(`SELECT substr(CAST(value AS BLOB), 1, ` + readValue + `), rev FROM {{p}}_store WHERE key = ? AND ` + present),
		create: q(`INSERT INTO {{p}}_store (key, value, rev, expires_at) VALUES (?1, ?2, ?3, CASE WHEN ?4 = 0 THEN 0 ELSE NOW + ?4 END)
			ON CONFLICT (key) DO UPDATE SET value = excluded.value, rev = excluded.rev, expires_at = excluded.expires_at
			WHERE expires_at <> 0 AND expires_at <= NOW`),
		update: q(`UPDATE {{p}}_store SET value = ?1, rev = ?2, expires_at = CASE WHEN ?3 = 0 THEN 0 ELSE NOW + ?3 END
			WHERE key = ?4 AND rev = ?5 AND ` + present),
		deleteKey: q(`DELETE FROM {{p}}_store WHERE key = ?`),
		deleteRev: q(`DELETE FROM {{p}}_store WHERE key = ? AND rev = ? AND ` + present),
		list: q(`SELECT CAST(substr(CAST(key AS BLOB), 1, ` + readKey + `) AS TEXT) FROM {{p}}_store WHERE key >= ?1 AND key < ?1 || char(127) AND key > ?2 AND ` + present + `
			ORDER BY key LIMIT ?3`),
		nextRev: q(`UPDATE {{p}}_seq SET n = n + 1 WHERE name = 'rev' RETURNING n`),
		// nextRevs takes ?1 revisions at once: the last is returned, the
		// batch's are the ?1 numbers that end with it.
		nextRevs: q(`UPDATE {{p}}_seq SET n = n + ?1 WHERE name = 'rev' RETURNING n`),
		getEach: q(`SELECT CAST(substr(CAST(key AS BLOB), 1, ` + readKey + `) AS TEXT), substr(CAST(value AS BLOB), 1, ` + readValue + `), rev
			FROM {{p}}_store WHERE key IN (SELECT value FROM json_each(?1)) AND ` + present),
		deleteValue: q(`DELETE FROM {{p}}_store WHERE key = ?1 AND CAST(value AS BLOB) = ?2 AND (?3 = 0 OR rev = ?3) AND ` + present),
		sweep: q(`DELETE FROM {{p}}_store WHERE key IN
			(SELECT key FROM {{p}}_store WHERE expires_at <> 0 AND expires_at <= NOW LIMIT 1000)`),
	}
}
