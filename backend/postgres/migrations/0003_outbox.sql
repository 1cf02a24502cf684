CREATE TABLE {{p}}_outbox (
	seq        bigserial   PRIMARY KEY,
	queue      text        NOT NULL,
	id         text        NOT NULL,
	dedupe     text        NOT NULL,
	body       bytea       NOT NULL,
	not_before timestamptz
);
CREATE INDEX {{p}}_outbox_queue ON {{p}}_outbox (queue, seq);
CREATE TABLE {{p}}_outbox_aside (
	seq        bigint      PRIMARY KEY,
	queue      text        NOT NULL,
	id         text        NOT NULL,
	dedupe     text        NOT NULL,
	body       bytea       NOT NULL,
	not_before timestamptz,
	reason     text        NOT NULL,
	moved_at   timestamptz NOT NULL DEFAULT now()
);
