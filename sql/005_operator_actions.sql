-- What operators decided about keys whose outcome was unknown (docs/operator-queue.md): one row
-- per resolution, kept after the key's own row is swept or forgotten, so a key's history
-- outlives it. key_hash is key_hash_hex of the key (the API's name for it); the key itself,
-- which carries the subject, is not kept here.
CREATE TABLE idem_key_actions (
    id             bigserial   PRIMARY KEY,
    key_hash       text        NOT NULL,
    tool           text        NOT NULL,
    subject        text        NOT NULL,
    outcome        text        NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'forget')),
    -- the key's state when it was resolved: unknown, or in_progress past its lease
    previous_state text        NOT NULL,
    -- the name of the admin token (or the operator's user name, from the command line)
    actor          text        NOT NULL,
    note           text,
    -- how long the key waited: since its outcome became unknown, or its lease ran out
    waited_ms      bigint      NOT NULL,
    at             timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX idem_key_actions_key_hash_idx ON idem_key_actions (key_hash);
