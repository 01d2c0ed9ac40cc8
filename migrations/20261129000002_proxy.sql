-- What the proxy needs beyond the foundation schema.

-- A reservation carries the call it was made for, so that a call cut off
-- between reserve and settle (a killed process) can still be written to the
-- audit log, as outcome unknown, by the start-up sweep.
ALTER TABLE reservations
    ADD COLUMN method               text NOT NULL DEFAULT 'POST',
    ADD COLUMN path                 text NOT NULL DEFAULT '',
    ADD COLUMN stripe_customer      text,
    ADD COLUMN metadata_customer_id text,
    ADD COLUMN billing_period       text,
    ADD COLUMN currency             text;

-- Audit rows also keep metadata[billing_period] and the proxy instance's
-- view of why a call was refused.
ALTER TABLE audit_log
    ADD COLUMN metadata_billing_period text,
    ADD COLUMN message                 text;

-- The proxy looks tokens up by hash on every key API call.
CREATE INDEX api_tokens_active_idx ON api_tokens (token_hash) WHERE revoked_at IS NULL;

-- A request the proxy cannot read (not form-encoded, a parameter twice)
-- is refused as an invalid request.
ALTER TABLE audit_log DROP CONSTRAINT audit_log_decision_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_decision_check CHECK (decision IN (
    'allowed', 'replay', 'outcome_unknown',
    'refused_unknown_key', 'refused_revoked', 'refused_expired',
    'refused_endpoint', 'refused_currency', 'refused_amount', 'refused_invalid_request',
    'refused_cap', 'refused_duplicate', 'refused_unavailable'));
