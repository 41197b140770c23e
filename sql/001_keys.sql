-- Idempotency keys: one row per derived or explicit key, shared by every gateway replica.
-- Times are timestamptz and always compared with the database clock (now()), so replicas with
-- skewed clocks agree on leases and expiry.
CREATE TABLE idem_keys (
    key              text        PRIMARY KEY,
    tool             text        NOT NULL,
    subject          text        NOT NULL,
    args_digest      text        NOT NULL,
    explicit_key     boolean     NOT NULL DEFAULT false,
    state            text        NOT NULL
                     CHECK (state IN ('in_progress', 'succeeded', 'failed', 'unknown')),
    -- incremented on every claim or takeover; finish writes only WHERE fence = its claim's fence
    fence            bigint      NOT NULL DEFAULT 1,
    attempts         integer     NOT NULL DEFAULT 1,
    -- bytea, not text: stored as received, whatever the database encoding
    result           bytea,
    result_too_large boolean     NOT NULL DEFAULT false,
    first_session_id text,
    first_jsonrpc_id text,
    lease_until      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    expires_at       timestamptz NOT NULL
);

-- The sweeper deletes in expires_at order.
CREATE INDEX idem_keys_expires_at_idx ON idem_keys (expires_at);
