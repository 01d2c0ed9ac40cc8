-- Keys beyond policy wait for a second person. A key whose cap is above its
-- expected total plus the policy's buffer, or above the ceiling of whoever
-- asks (their API token's or their role's), is not issued: its request is
-- kept here until a different approver decides, as cap increases are.
-- The secret is made when asked and shown to the requester then; only its
-- hash is kept, and it opens nothing until the key is issued on approval.

CREATE TABLE key_requests (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The key as asked for.
    label                text        NOT NULL CHECK (length(label) BETWEEN 1 AND 200),
    billing_period       text        NOT NULL CHECK (billing_period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    currency             text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    expected_total_cents bigint      NOT NULL CHECK (expected_total_cents >= 0),
    buffer_bps           integer     NOT NULL CHECK (buffer_bps BETWEEN 0 AND 100000),
    cap_cents            bigint      NOT NULL CHECK (cap_cents > 0),
    allowed_endpoints    text[]      NOT NULL CHECK (cardinality(allowed_endpoints) > 0),
    alert_thresholds_pct smallint[]  NOT NULL,
    duplicate_policy     text        NOT NULL CHECK (duplicate_policy IN ('off', 'flag', 'block')),
    key_expires_at       timestamptz NOT NULL,
    stripe_account       text,
    secret_hash          bytea       NOT NULL,
    secret_prefix        text        NOT NULL CHECK (length(secret_prefix) <= 12),
    -- Why it is beyond policy, and the most policy would have issued.
    over_policy          text        NOT NULL,
    policy_cap_cents     bigint      NOT NULL CHECK (policy_cap_cents >= 0),
    requested_at         timestamptz NOT NULL DEFAULT now(),
    requested_by         bigint REFERENCES operators (id),
    requested_by_token   bigint REFERENCES api_tokens (id),
    expires_at           timestamptz NOT NULL,
    decision             text CHECK (decision IN ('approved', 'rejected')),
    decided_at           timestamptz,
    decided_by           bigint REFERENCES operators (id),
    decision_note        text CHECK (length(decision_note) <= 2000),
    vault_key_id         bigint REFERENCES vault_keys (id),
    CONSTRAINT key_requests_secret_hash_key UNIQUE (secret_hash),
    CONSTRAINT key_request_one_requester CHECK ((requested_by IS NULL) <> (requested_by_token IS NULL)),
    CONSTRAINT key_request_decision_complete CHECK (
        (decision IS NULL) = (decided_at IS NULL) AND (decision IS NULL) = (decided_by IS NULL)),
    CONSTRAINT key_request_four_eyes CHECK (decided_by <> requested_by),
    CONSTRAINT key_request_issued_when_approved CHECK ((vault_key_id IS NOT NULL) = (decision = 'approved'))
);
CREATE INDEX key_requests_undecided_idx ON key_requests (requested_at) WHERE decision IS NULL;

-- Decided once, by an active approver who neither asked nor made the token
-- that asked, before the request expired; then the row never changes.
CREATE TRIGGER key_requests_decide_once
    BEFORE UPDATE ON key_requests
    FOR EACH ROW EXECUTE FUNCTION guard_four_eyes_decision('key_request');
CREATE TRIGGER key_requests_no_delete
    BEFORE DELETE ON key_requests
    FOR EACH ROW EXECUTE FUNCTION forbid_rewrite();

-- A token may carry a ceiling: the largest cap it may have issued without
-- an approver, in the minor units of the key's currency.
ALTER TABLE api_tokens
    ADD COLUMN max_cap_cents bigint CHECK (max_cap_cents > 0);
