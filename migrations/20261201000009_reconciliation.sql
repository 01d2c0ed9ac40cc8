-- Reconciliation: Stripe's charges as last synced, compared with the
-- billing jobs' ledger (billing_records). Detection writes findings that
-- operators resolve; running it again updates them, never duplicates them.

-- Charges as Stripe reported them at the last sync that saw them, with the
-- billing job's metadata (customer_id, billing_period) lifted out.
CREATE TABLE stripe_charges (
    id                    text        PRIMARY KEY CHECK (id ~ '^(ch|py)_'),
    payment_intent        text,
    stripe_customer       text,
    amount_cents          bigint      NOT NULL CHECK (amount_cents >= 0),
    amount_refunded_cents bigint      NOT NULL DEFAULT 0 CHECK (amount_refunded_cents >= 0),
    currency              text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    -- Stripe's status: succeeded, pending or failed.
    status                text        NOT NULL,
    customer_id           text,
    billing_period        text,
    created_at            timestamptz NOT NULL,
    synced_at             timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT stripe_charges_refund_within_amount CHECK (amount_refunded_cents <= amount_cents)
);
CREATE INDEX stripe_charges_period_customer_idx ON stripe_charges (billing_period, customer_id);

-- One sync of a period's charges from Stripe: how far it got (resumable
-- from `cursor`, the last charge stored) and what it saw. One runs per
-- period at a time (an advisory lock in the sync).
CREATE TABLE stripe_syncs (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    billing_period text        NOT NULL CHECK (billing_period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    -- The created range asked for: the period and a margin either side.
    created_from   timestamptz NOT NULL,
    created_to     timestamptz NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    cursor         text,
    pages          integer     NOT NULL DEFAULT 0,
    charges_seen   integer     NOT NULL DEFAULT 0,
    -- Why the last attempt stopped early (cleared when it goes on).
    error          text
);
CREATE INDEX stripe_syncs_period_idx ON stripe_syncs (billing_period, id DESC);

CREATE TABLE reconciliation_findings (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind                 text        NOT NULL CHECK (kind IN ('orphaned', 'duplicate', 'missing')),
    billing_period       text        NOT NULL CHECK (billing_period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    customer_id          text        NOT NULL,
    currency             text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    -- The charges the finding is about, oldest first (missing: the charge
    -- id the ledger names), and for a duplicate the one to keep.
    charge_ids           text[]      NOT NULL,
    keeper_charge_id     text,
    -- Money at risk: the live charges without a ledger row (orphaned), the
    -- live charges beyond the keeper (duplicate), the amount the ledger says
    -- was charged (missing).
    amount_at_risk_cents bigint      NOT NULL CHECK (amount_at_risk_cents >= 0),
    -- Why it was classified so, in a sentence.
    explanation          text        NOT NULL,
    detected_at          timestamptz NOT NULL DEFAULT now(),
    last_detected_at     timestamptz NOT NULL DEFAULT now(),
    -- Open until resolved: adopted, refunded, dismissed by a person, or
    -- cleared when a later detection no longer finds it.
    resolution           text CHECK (resolution IN ('adopted', 'refunded', 'dismissed', 'cleared')),
    resolved_at          timestamptz,
    resolved_by          bigint REFERENCES operators (id),
    resolution_note      text,
    CONSTRAINT reconciliation_findings_once UNIQUE (kind, billing_period, customer_id, currency),
    CONSTRAINT reconciliation_findings_resolution_complete CHECK ((resolution IS NULL) = (resolved_at IS NULL))
);
CREATE INDEX reconciliation_findings_open_idx ON reconciliation_findings (billing_period, kind)
    WHERE resolved_at IS NULL;

-- A call whose outcome was unknown (a 5xx, a timeout, a killed proxy) stays
-- reserved until reconciliation knows it: 'settled' when Stripe has the
-- charge (it moves to spent), 'released' when a later sync shows Stripe
-- never made it. Only app/src/ssr/data/spend.rs calls this, like the other
-- ledger functions.
ALTER TABLE reservations ADD COLUMN stripe_charge_id text;
CREATE UNIQUE INDEX reservations_stripe_charge_idx ON reservations (stripe_charge_id)
    WHERE stripe_charge_id IS NOT NULL;

CREATE FUNCTION settle_unknown_spend(p_reservation bigint, p_state text, p_charge text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    key_id bigint;
    amount bigint;
BEGIN
    IF p_state NOT IN ('settled', 'released') THEN
        RAISE EXCEPTION 'an unknown outcome is settled or released, not %', p_state;
    END IF;
    UPDATE reservations SET state = p_state, settled_at = now(), stripe_charge_id = p_charge
    WHERE id = p_reservation AND state = 'outcome_unknown'
    RETURNING vault_key_id, amount_cents INTO key_id, amount;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_state = 'settled' THEN
        UPDATE vault_keys SET reserved_cents = reserved_cents - amount, spent_cents = spent_cents + amount
        WHERE id = key_id;
    ELSE
        UPDATE vault_keys SET reserved_cents = reserved_cents - amount WHERE id = key_id;
    END IF;
    RETURN true;
END
$$;
