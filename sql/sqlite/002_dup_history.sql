-- Duplicates per key, as sql/002_dup_history.sql: exact counts by answer and by source, and the
-- last 16 as a JSON array (TEXT), oldest first.
ALTER TABLE idem_keys ADD COLUMN dup_replay      INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_keys ADD COLUMN dup_in_progress INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_keys ADD COLUMN dup_unknown     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_keys ADD COLUMN dup_reconnect   INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_keys ADD COLUMN dup_transport   INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_keys ADD COLUMN dup_harness     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_keys ADD COLUMN dup_model       INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_keys ADD COLUMN dup_late        INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_keys ADD COLUMN dup_history     TEXT    NOT NULL DEFAULT '[]';
