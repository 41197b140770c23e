-- Duplicates per key (store_record_duplicate): exact counts by how each was answered and by
-- which layer most likely retried (src/dupsource.c), and the last 16 of them as a JSON array,
-- oldest first: {"at", "source", "answered", "jsonrpc_id", "session_id", "gap_ms"}. Written by
-- the statement that already adds replays to attempts; reset with attempts when an expired row
-- starts a new life. `idemgw key --show` prints them; `idemgw report` adds them up per tool
-- (a scan of the table, on purpose: an index on updated_at would slow every claim and finish
-- to speed up an operator's occasional look).
ALTER TABLE idem_keys
    ADD COLUMN dup_replay      integer NOT NULL DEFAULT 0,
    ADD COLUMN dup_in_progress integer NOT NULL DEFAULT 0,
    ADD COLUMN dup_unknown     integer NOT NULL DEFAULT 0,
    ADD COLUMN dup_reconnect   integer NOT NULL DEFAULT 0,
    ADD COLUMN dup_transport   integer NOT NULL DEFAULT 0,
    ADD COLUMN dup_harness     integer NOT NULL DEFAULT 0,
    ADD COLUMN dup_model       integer NOT NULL DEFAULT 0,
    ADD COLUMN dup_late        integer NOT NULL DEFAULT 0,
    ADD COLUMN dup_history     jsonb   NOT NULL DEFAULT '[]'::jsonb;
