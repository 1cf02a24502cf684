CREATE TABLE {{p}}_jobs (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue      text COLLATE "C" NOT NULL,
    body       bytea NOT NULL,
    run_at     timestamptz NOT NULL,
    deliveries integer NOT NULL DEFAULT 0,
    token      bigint NOT NULL DEFAULT 0
);
CREATE INDEX {{p}}_jobs_due ON {{p}}_jobs (queue, run_at, id);
CREATE TABLE {{p}}_dead (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue      text COLLATE "C" NOT NULL,
    rec_id     bytea NOT NULL,
    body       bytea NOT NULL,
    held_until timestamptz,
    token      bigint NOT NULL DEFAULT 0
);
CREATE INDEX {{p}}_dead_queue ON {{p}}_dead (queue, id);
CREATE TABLE {{p}}_queues (
    name text COLLATE "C" PRIMARY KEY
);
CREATE SEQUENCE {{p}}_token;
