-- The operators' decisions (as sql/005_operator_actions.sql), so both schemas stay at one
-- version. Times are integer milliseconds since the epoch (UTC).
CREATE TABLE idem_key_actions (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    key_hash       TEXT    NOT NULL,
    tool           TEXT    NOT NULL,
    subject        TEXT    NOT NULL,
    outcome        TEXT    NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'forget')),
    previous_state TEXT    NOT NULL,
    actor          TEXT    NOT NULL,
    note           TEXT,
    waited_ms      INTEGER NOT NULL,
    at             INTEGER NOT NULL
);

CREATE INDEX idem_key_actions_key_hash_idx ON idem_key_actions (key_hash);
