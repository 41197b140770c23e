-- Idempotency keys of the embedded store (src/store_sqlite.c): the same row as sql/001_keys.sql,
-- for one gateway process. Times are integer milliseconds since the epoch (UTC), always compared
-- with the store's own clock (the writer thread's wall clock), as Postgres compares with now().
CREATE TABLE idem_keys (
    key              TEXT    PRIMARY KEY,
    tool             TEXT    NOT NULL,
    subject          TEXT    NOT NULL,
    args_digest      TEXT    NOT NULL,
    explicit_key     INTEGER NOT NULL DEFAULT 0,
    state            TEXT    NOT NULL
                     CHECK (state IN ('in_progress', 'succeeded', 'failed', 'unknown')),
    -- incremented on every claim or takeover; finish writes only WHERE fence = its claim's fence
    fence            INTEGER NOT NULL DEFAULT 1,
    attempts         INTEGER NOT NULL DEFAULT 1,
    -- a BLOB: stored as received
    result           BLOB,
    result_too_large INTEGER NOT NULL DEFAULT 0,
    first_session_id TEXT,
    first_jsonrpc_id TEXT,
    lease_until      INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    expires_at       INTEGER NOT NULL
);

-- The sweeper deletes in expires_at order.
CREATE INDEX idem_keys_expires_at_idx ON idem_keys (expires_at);
