-- The keys held with an unknown outcome, for /metrics (idemgw_unknown_keys counts them at every
-- scrape). Partial: only those rows are in it, so a claim or a finish of any other row adds
-- nothing to it, and the count reads the few it holds instead of the whole table.
CREATE INDEX idem_keys_unknown_idx ON idem_keys (expires_at) WHERE state = 'unknown';
