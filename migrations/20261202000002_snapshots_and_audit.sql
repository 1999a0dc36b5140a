-- Snapshot bodies and the audit log.

-- Every retained version of a key's snapshot, the current one included (the current one is the
-- row whose version equals leases.snapshot_version while leases.snapshot_etag is set). Old
-- versions are pruned by the write that pushes them out of the retention window.
CREATE TABLE snapshot_versions (
    key           text COLLATE "C" NOT NULL REFERENCES leases (key),
    version       bigint      NOT NULL CHECK (version > 0),
    token         bigint      NOT NULL,
    etag          text        NOT NULL,
    size          bigint      NOT NULL,
    content_type  text        NOT NULL,
    updated_at    timestamptz NOT NULL,
    body          bytea       NOT NULL,
    PRIMARY KEY (key, version)
);
-- Bodies are already-compressed or random bytes often enough that TOAST compression costs CPU on
-- the hot write path for little gain; keep them out of line uncompressed.
ALTER TABLE snapshot_versions ALTER COLUMN body SET STORAGE EXTERNAL;

-- Refused fenced writes. Written by the same statement that refuses the write, so a refusal the
-- client hears about is always on record.
CREATE TABLE rejections (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at               timestamptz NOT NULL DEFAULT now(),
    key              text COLLATE "C" NOT NULL,
    reason           text   NOT NULL CHECK (reason IN ('stale_token', 'unknown_token')),
    presented_token  bigint NOT NULL,
    highest_token    bigint,
    holder           text,
    operation        text   NOT NULL CHECK (operation IN ('put', 'delete')),
    request_id       text,
    remote_addr      text,
    principal        text
);
-- Pages are newest first by id: one index per filter that an operator pages by, each ending in id
-- so that a page is an index range scan whatever the size of the log.
CREATE INDEX rejections_key_id ON rejections (key, id DESC);
CREATE INDEX rejections_reason_id ON rejections (reason, id DESC);
-- For since/until and for the retention pruner.
CREATE INDEX rejections_at ON rejections (at);

-- Recovery records replaced by a reconciling grant: what was left behind, and who said it was
-- dealt with.
CREATE TABLE recoveries (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                 timestamptz NOT NULL DEFAULT now(),
    key                text COLLATE "C" NOT NULL,
    reason             text   NOT NULL CHECK (reason IN ('abandoned', 'expired', 'recovery_required')),
    record_owner       text   NOT NULL,
    record_token       bigint NOT NULL,
    record_acquired_at timestamptz NOT NULL,
    record_ended_at    timestamptz NOT NULL,
    record_metadata    jsonb,
    reconciled_by      text   NOT NULL,
    new_token          bigint NOT NULL,
    request_id         text,
    remote_addr        text,
    principal          text
);
CREATE INDEX recoveries_key_id ON recoveries (key, id DESC);
CREATE INDEX recoveries_reason_id ON recoveries (reason, id DESC);
CREATE INDEX recoveries_at ON recoveries (at);
