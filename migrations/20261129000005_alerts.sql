-- Alerts, raised by the ledger statements themselves, so that each is raised
-- exactly once however many calls race: a key's committed spend (spent +
-- reserved) crossing one of its thresholds, a call refused for the cap, a key
-- close to expiry with expected billing still unspent. Each raised alert is
-- queued for the notification webhooks in the same transaction (outbox).

CREATE TABLE alerts (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    vault_key_id          bigint      NOT NULL REFERENCES vault_keys (id),
    kind                  text        NOT NULL CHECK (kind IN ('threshold', 'cap_refused', 'expiring')),
    -- The threshold crossed (kind 'threshold'); 0 for the other kinds.
    threshold_pct         smallint    NOT NULL DEFAULT 0 CHECK (threshold_pct BETWEEN 0 AND 100),
    -- The key's money when raised (cap refusals: at the latest refusal), in
    -- its currency: committed (spent + reserved; expiring: spent), the cap,
    -- and per kind the charge refused or the expected billing left unspent.
    committed_cents       bigint      NOT NULL,
    cap_cents             bigint      NOT NULL,
    amount_cents          bigint,
    -- Calls refused for the cap after the first are counted, not re-raised.
    occurrences           integer     NOT NULL DEFAULT 1,
    raised_at             timestamptz NOT NULL DEFAULT now(),
    last_occurred_at      timestamptz NOT NULL DEFAULT now(),
    -- State is derived: acknowledged once acknowledged_at is set, snoozed
    -- while snoozed_until is ahead, open otherwise.
    acknowledged_at       timestamptz,
    acknowledged_by       bigint REFERENCES operators (id),
    acknowledged_by_token bigint REFERENCES api_tokens (id),
    ack_note              text,
    assigned_to           bigint REFERENCES operators (id),
    snoozed_until         timestamptz,
    CONSTRAINT alerts_once UNIQUE (vault_key_id, kind, threshold_pct),
    CONSTRAINT alerts_ack_complete CHECK (
        acknowledged_at IS NULL OR acknowledged_by IS NOT NULL OR acknowledged_by_token IS NOT NULL)
);
CREATE INDEX alerts_unacknowledged_idx ON alerts (raised_at DESC) WHERE acknowledged_at IS NULL;

-- The outbox: one row per alert event to deliver, and one delivery per
-- configured webhook, retried with backoff by the server's notifier.
CREATE TABLE alert_notifications (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    alert_id   bigint      NOT NULL REFERENCES alerts (id),
    event      text        NOT NULL CHECK (event IN ('alert.raised')),
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Set once a delivery per configured webhook has been planned.
    planned_at timestamptz
);
CREATE INDEX alert_notifications_unplanned_idx ON alert_notifications (id) WHERE planned_at IS NULL;

CREATE TABLE alert_deliveries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    notification_id bigint      NOT NULL REFERENCES alert_notifications (id),
    url             text        NOT NULL,
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_status     smallint,
    last_error      text,
    delivered_at    timestamptz,
    CONSTRAINT alert_deliveries_once UNIQUE (notification_id, url)
);
CREATE INDEX alert_deliveries_due_idx ON alert_deliveries (next_attempt_at) WHERE state = 'pending';

CREATE FUNCTION queue_alert_notification() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO alert_notifications (alert_id, event) VALUES (NEW.id, 'alert.raised');
    PERFORM pg_notify('vaultcap_alerts', NEW.id::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER alerts_notify AFTER INSERT ON alerts
    FOR EACH ROW EXECUTE FUNCTION queue_alert_notification();

-- reserve_spend as before, now raising the alerts: a threshold when this
-- reservation takes committed spend from below it to at or above it (the
-- row lock orders reservations on a key, so exactly one does; the unique
-- constraint keeps a later re-crossing from raising it again), and a cap
-- refusal (raised once, counted after).
CREATE OR REPLACE FUNCTION reserve_spend(
    p_key bigint, p_request uuid, p_idempotency_key text, p_amount bigint,
    p_method text, p_path text, p_stripe_customer text, p_metadata_customer_id text,
    p_billing_period text, p_currency text)
RETURNS TABLE (outcome text, reservation_id bigint, cap bigint, spent bigint, reserved bigint)
LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
    k record;
BEGIN
    -- Recording the reservation first makes a concurrent retry with the same
    -- Idempotency-Key wait on the unique index, then see it as a replay.
    INSERT INTO reservations (vault_key_id, request_id, idempotency_key, amount_cents, method, path,
                              stripe_customer, metadata_customer_id, billing_period, currency)
    VALUES (p_key, p_request, p_idempotency_key, p_amount, p_method, p_path,
            p_stripe_customer, p_metadata_customer_id, p_billing_period, p_currency)
    ON CONFLICT (vault_key_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NULL THEN
        RETURN QUERY SELECT 'replay'::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;

    UPDATE vault_keys v SET reserved_cents = v.reserved_cents + p_amount
    WHERE v.id = p_key AND v.revoked_at IS NULL AND v.expires_at > now()
      AND v.spent_cents + v.reserved_cents + p_amount <= v.cap_cents
    RETURNING v.cap_cents, v.spent_cents + v.reserved_cents AS used, v.alert_thresholds_pct
    INTO k;
    IF FOUND THEN
        INSERT INTO alerts (vault_key_id, kind, threshold_pct, committed_cents, cap_cents)
        SELECT p_key, 'threshold', t, k.used, k.cap_cents
        FROM unnest(k.alert_thresholds_pct) AS t
        WHERE (k.used - p_amount) * 100 < t::bigint * k.cap_cents
          AND k.used * 100 >= t::bigint * k.cap_cents
        ON CONFLICT ON CONSTRAINT alerts_once DO NOTHING;
        RETURN QUERY SELECT 'reserved'::text, new_id, NULL::bigint, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;

    -- Refused: the reservation never existed for anyone else.
    DELETE FROM reservations WHERE id = new_id;
    SELECT v.cap_cents, v.spent_cents, v.reserved_cents,
           v.revoked_at IS NULL AND v.expires_at > now() AS usable
    INTO k FROM vault_keys v WHERE v.id = p_key;
    IF k.usable THEN
        INSERT INTO alerts (vault_key_id, kind, committed_cents, cap_cents, amount_cents)
        VALUES (p_key, 'cap_refused', k.spent_cents + k.reserved_cents, k.cap_cents, p_amount)
        ON CONFLICT ON CONSTRAINT alerts_once
        DO UPDATE SET occurrences = alerts.occurrences + 1, last_occurred_at = now(),
                      committed_cents = EXCLUDED.committed_cents, cap_cents = EXCLUDED.cap_cents,
                      amount_cents = EXCLUDED.amount_cents;
    END IF;
    RETURN QUERY
        SELECT CASE WHEN k.usable THEN 'over_cap' ELSE 'unusable' END,
               NULL::bigint, k.cap_cents, k.spent_cents, k.reserved_cents;
END
$$;
