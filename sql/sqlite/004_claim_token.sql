-- The claim's token (as sql/004_claim_token.sql), so both schemas stay at one version. The
-- embedded store's claim commits in the gateway's own process: its answer is never lost, and
-- the column stays NULL.
ALTER TABLE idem_keys ADD COLUMN claim_token TEXT;
