-- The PostgreSQL schema of nursery_jobs at version 3 (objects 3), as its _schema.py
-- created it: a database made before version 4 keyed its rows by their texts.
CREATE TABLE IF NOT EXISTS nj_schema (
    id int PRIMARY KEY CHECK (id = 1),
    version int NOT NULL,
    object_schema int NOT NULL
);
CREATE TABLE IF NOT EXISTS nj_hosts (
    host_id text PRIMARY KEY,
    started timestamptz NOT NULL DEFAULT now(),
    heartbeat timestamptz NOT NULL DEFAULT now(),
    flight jsonb NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS nj_namespaces (
    namespace text PRIMARY KEY,
    class_path text NOT NULL
);
CREATE TABLE IF NOT EXISTS nj_objects (
    namespace text NOT NULL,
    object_id text NOT NULL,
    class_path text NOT NULL,
    created_at float8 NOT NULL,
    alarm_time float8,
    alarm_retry int NOT NULL DEFAULT 0,
    owner text,
    epoch bigint NOT NULL DEFAULT 0,
    lease_until timestamptz,
    version bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, object_id)
);
ALTER TABLE nj_objects ADD COLUMN IF NOT EXISTS version bigint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS nj_objects_alarm ON nj_objects (alarm_time)
    WHERE alarm_time IS NOT NULL;
CREATE INDEX IF NOT EXISTS nj_objects_owner ON nj_objects (owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS nj_rows (
    namespace text NOT NULL,
    object_id text NOT NULL,
    tbl text NOT NULL,
    key text NOT NULL,
    data text NOT NULL,
    PRIMARY KEY (namespace, object_id, tbl, key)
);
CREATE TABLE IF NOT EXISTS nj_crashes (
    namespace text NOT NULL,
    object_id text NOT NULL,
    token text NOT NULL,
    started float8 NOT NULL,
    PRIMARY KEY (namespace, object_id, token)
);
CREATE TABLE IF NOT EXISTS nj_calls (
    id bigserial PRIMARY KEY,
    target text NOT NULL,
    caller text NOT NULL,
    namespace text NOT NULL,
    object_id text NOT NULL,
    class_path text NOT NULL,
    name text NOT NULL,
    payload text,
    state text NOT NULL DEFAULT 'pending',
    result text,
    created timestamptz NOT NULL DEFAULT now(),
    take_id bigint
);
ALTER TABLE nj_calls ADD COLUMN IF NOT EXISTS take_id bigint;
CREATE INDEX IF NOT EXISTS nj_calls_target ON nj_calls (target) WHERE state = 'pending';
INSERT INTO nj_schema (id, version, object_schema) VALUES (1, 3, 3);
