-- Payment intents in the reconciliation sync. Stripe keeps a billing job's
-- metadata on the payment intent, not on the charge it makes, so a charge
-- made through a payment intent is attributed to its customer and period
-- through the intent. A sync lists the period's payment intents first, then
-- its charges (each resumable from its own cursor).

CREATE TABLE stripe_payment_intents (
    id             text        PRIMARY KEY CHECK (id ~ '^pi_'),
    status         text        NOT NULL,
    amount_cents   bigint      NOT NULL CHECK (amount_cents >= 0),
    currency       text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    stripe_customer text,
    latest_charge  text,
    -- The billing job's metadata[customer_id] and metadata[billing_period].
    customer_id    text,
    billing_period text,
    created_at     timestamptz NOT NULL,
    synced_at      timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE stripe_syncs
    ADD COLUMN intents_cursor text,
    ADD COLUMN intents_seen   integer NOT NULL DEFAULT 0,
    ADD COLUMN intents_done   boolean NOT NULL DEFAULT false;
