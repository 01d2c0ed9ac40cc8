-- Vaultcap's shared schema. One database serves every proxy instance and the
-- console; PostgreSQL guards the invariants (money as bigint minor units,
-- spent + reserved never above the cap, an audit log nobody can rewrite).

-- Refuses UPDATE, DELETE and TRUNCATE on the tables it is attached to.
CREATE FUNCTION forbid_rewrite() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- ---------------------------------------------------------------- operators

CREATE TABLE operators (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email         text        NOT NULL,
    role          text        NOT NULL,
    password_hash text        NOT NULL,
    disabled_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    created_by    bigint REFERENCES operators (id),
    CONSTRAINT operators_email_key UNIQUE (email),
    CONSTRAINT operators_email_lowercase CHECK (email = lower(email) AND email LIKE '%_@_%'),
    CONSTRAINT operators_role_check CHECK (role IN ('viewer', 'operator', 'approver', 'admin'))
);

-- Failed sign-ins, for throttling per account and per address. Rows older
-- than the throttle window are pruned at sign-in time.
CREATE TABLE login_failures (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email     text        NOT NULL,
    ip        inet,
    failed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX login_failures_email_idx ON login_failures (email, failed_at);
CREATE INDEX login_failures_ip_idx ON login_failures (ip, failed_at);

-- The console's sessions, in the shape tower-sessions-sqlx-store expects
-- (created here so that the schema has one owner: these migrations).
CREATE SCHEMA tower_sessions;
CREATE TABLE tower_sessions.session (
    id          text PRIMARY KEY NOT NULL,
    data        bytea       NOT NULL,
    expiry_date timestamptz NOT NULL
);
CREATE INDEX session_expiry_idx ON tower_sessions.session (expiry_date);

-- Admin API tokens for the key API and on-call tooling; only a hash is kept.
CREATE TABLE api_tokens (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    token_hash   bytea       NOT NULL,
    token_prefix text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   bigint REFERENCES operators (id),
    last_used_at timestamptz,
    revoked_at   timestamptz,
    CONSTRAINT api_tokens_token_hash_key UNIQUE (token_hash)
);

-- --------------------------------------------------------------- vault keys

CREATE TABLE vault_keys (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- SHA-256 of the secret. The secret has 256 bits of entropy, so a fast
    -- hash is safe and lets the proxy find the key with one index lookup.
    secret_hash          bytea       NOT NULL,
    -- The first characters of the secret, the only part ever shown again.
    secret_prefix        text        NOT NULL,
    vendor               text        NOT NULL DEFAULT 'stripe' CHECK (vendor = 'stripe'),
    label                text        NOT NULL CHECK (length(label) BETWEEN 1 AND 200),
    billing_period       text        NOT NULL CHECK (billing_period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    currency             text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    expected_total_cents bigint      NOT NULL CHECK (expected_total_cents >= 0),
    -- Buffer over the expected total in basis points (1000 = 10 %).
    buffer_bps           integer     NOT NULL DEFAULT 1000 CHECK (buffer_bps BETWEEN 0 AND 100000),
    cap_cents            bigint      NOT NULL CHECK (cap_cents > 0),
    spent_cents          bigint      NOT NULL DEFAULT 0 CHECK (spent_cents >= 0),
    reserved_cents       bigint      NOT NULL DEFAULT 0 CHECK (reserved_cents >= 0),
    -- Method + path patterns, e.g. 'POST /v1/charges'.
    allowed_endpoints    text[]      NOT NULL CHECK (cardinality(allowed_endpoints) > 0),
    alert_thresholds_pct smallint[]  NOT NULL DEFAULT '{90}',
    duplicate_policy     text        NOT NULL DEFAULT 'flag' CHECK (duplicate_policy IN ('off', 'flag', 'block')),
    expires_at           timestamptz NOT NULL,
    -- Status is derived: revoked when revoked_at is set, expired once
    -- expires_at has passed, active otherwise.
    revoked_at           timestamptz,
    revoked_by           bigint REFERENCES operators (id),
    revoke_reason        text,
    -- A follow-on key issued for a cap increase points at the key it extends.
    parent_key_id        bigint REFERENCES vault_keys (id),
    created_at           timestamptz NOT NULL DEFAULT now(),
    created_by           bigint REFERENCES operators (id),
    created_by_token     bigint REFERENCES api_tokens (id),
    CONSTRAINT vault_keys_secret_hash_key UNIQUE (secret_hash),
    CONSTRAINT vault_keys_within_cap CHECK (spent_cents + reserved_cents <= cap_cents),
    CONSTRAINT vault_keys_revocation_complete CHECK ((revoked_at IS NULL) = (revoke_reason IS NULL))
);
CREATE INDEX vault_keys_period_idx ON vault_keys (billing_period, created_at DESC);

-- Amounts the proxy has reserved under a key before forwarding a call, until
-- the call is settled (spent), released (definite failure) or left unknown
-- for reconciliation. A mutable working table; the audit log is the record.
CREATE TABLE reservations (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    vault_key_id    bigint      NOT NULL REFERENCES vault_keys (id),
    request_id      uuid        NOT NULL,
    idempotency_key text,
    amount_cents    bigint      NOT NULL CHECK (amount_cents >= 0),
    state           text        NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'settled', 'released', 'outcome_unknown')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    settled_at      timestamptz,
    CONSTRAINT reservations_request_id_key UNIQUE (request_id)
);
-- A retry with the same Idempotency-Key under the same key must not reserve twice.
CREATE UNIQUE INDEX reservations_idempotency_idx
    ON reservations (vault_key_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX reservations_open_idx ON reservations (created_at)
    WHERE state IN ('pending', 'outcome_unknown');

-- ---------------------------------------------------------------- audit log

-- One row per call that reached the proxy, refusals included. Never updated,
-- never deleted by the application (the trigger below enforces it).
CREATE TABLE audit_log (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                   timestamptz NOT NULL DEFAULT now(),
    request_id           uuid        NOT NULL,
    vault_key_id         bigint REFERENCES vault_keys (id),
    -- The presented key's prefix, kept even when the key is unknown.
    key_prefix           text,
    method               text        NOT NULL,
    path                 text        NOT NULL,
    stripe_customer      text,
    metadata_customer_id text,
    billing_period       text,
    amount_cents         bigint CHECK (amount_cents >= 0),
    currency             text,
    idempotency_key      text,
    decision             text        NOT NULL CHECK (decision IN (
        'allowed', 'replay', 'outcome_unknown',
        'refused_unknown_key', 'refused_revoked', 'refused_expired',
        'refused_endpoint', 'refused_currency', 'refused_amount',
        'refused_cap', 'refused_duplicate', 'refused_unavailable')),
    upstream_status      smallint,
    stripe_object_id     text,
    error_code           text,
    latency_ms           integer CHECK (latency_ms >= 0)
);
-- Newest-first browsing and keyset paging, overall and by the filters the
-- audit page offers most.
CREATE INDEX audit_log_at_idx ON audit_log (at DESC, id DESC);
CREATE INDEX audit_log_key_idx ON audit_log (vault_key_id, at DESC, id DESC);
CREATE INDEX audit_log_customer_idx ON audit_log (stripe_customer, at DESC, id DESC)
    WHERE stripe_customer IS NOT NULL;
CREATE INDEX audit_log_metadata_customer_idx ON audit_log (metadata_customer_id, at DESC, id DESC)
    WHERE metadata_customer_id IS NOT NULL;
CREATE INDEX audit_log_idempotency_idx ON audit_log (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX audit_log_object_idx ON audit_log (stripe_object_id)
    WHERE stripe_object_id IS NOT NULL;
CREATE INDEX audit_log_refused_idx ON audit_log (decision, at DESC, id DESC)
    WHERE decision <> 'allowed';

CREATE TRIGGER audit_log_append_only
    BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION forbid_rewrite();
CREATE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION forbid_rewrite();

-- ---------------------------------------------------------- billing ledger

-- The billing jobs' own ledger, in the shape the seed articles' jobs write:
-- INSERT … ON CONFLICT (customer_id, billing_period) DO NOTHING.
CREATE TABLE billing_records (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id        text        NOT NULL,
    billing_period     text        NOT NULL CHECK (billing_period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    stripe_customer_id text,
    charge_id          text,
    amount_cents       bigint      NOT NULL CHECK (amount_cents >= 0),
    currency           text        NOT NULL DEFAULT 'usd' CHECK (currency ~ '^[a-z]{3}$'),
    status             text        NOT NULL DEFAULT 'charged',
    created_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT billing_records_customer_period_key UNIQUE (customer_id, billing_period)
);
CREATE INDEX billing_records_period_idx ON billing_records (billing_period, status);
CREATE INDEX billing_records_charge_idx ON billing_records (charge_id) WHERE charge_id IS NOT NULL;

-- ---------------------------------------------------------- operator actions

-- Who did what, when: every create, revoke, approve, refund, adopt, dismiss,
-- export and operator change. Append-only like the audit log.
CREATE TABLE operator_actions (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    operator_id  bigint REFERENCES operators (id),
    api_token_id bigint REFERENCES api_tokens (id),
    action       text        NOT NULL,
    subject_type text        NOT NULL,
    subject_id   text,
    details      jsonb       NOT NULL DEFAULT '{}',
    -- Where the action came from: the console, the API (with a token), the
    -- server's command line (a shell user on the host) or Vaultcap itself.
    via          text        NOT NULL CHECK (via IN ('console', 'api', 'cli', 'system')),
    ip           inet,
    CONSTRAINT operator_actions_attributed CHECK (
        (via = 'console' AND operator_id IS NOT NULL)
        OR (via = 'api' AND api_token_id IS NOT NULL)
        OR via IN ('cli', 'system'))
);
CREATE INDEX operator_actions_at_idx ON operator_actions (at DESC, id DESC);
CREATE INDEX operator_actions_operator_idx ON operator_actions (operator_id, at DESC, id DESC);
CREATE INDEX operator_actions_subject_idx ON operator_actions (subject_type, subject_id, at DESC);

CREATE TRIGGER operator_actions_append_only
    BEFORE UPDATE OR DELETE ON operator_actions
    FOR EACH ROW EXECUTE FUNCTION forbid_rewrite();
CREATE TRIGGER operator_actions_no_truncate
    BEFORE TRUNCATE ON operator_actions
    FOR EACH STATEMENT EXECUTE FUNCTION forbid_rewrite();
