-- The claim's token: random, chosen by the gateway for each claim (a new one on every takeover).
-- When the connection carrying a claim dies before its answer arrives, the claim may have
-- committed although the call was never forwarded; once a connection is back, the gateway
-- releases the row only if it still holds that claim (this token, still in progress), so a
-- newer claim of the key is never touched. NULL for rows claimed before this column existed.
ALTER TABLE idem_keys ADD COLUMN claim_token text;
