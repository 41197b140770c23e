-- The keys held with an unknown outcome, for /metrics (as sql/003_unknown_keys.sql): partial,
-- so the count at every scrape reads the few rows in it, not the table, on the writer thread.
CREATE INDEX idem_keys_unknown_idx ON idem_keys (expires_at) WHERE state = 'unknown';
