-- The proxy's duplicate guard: a charge for a customer and billing period
-- that already has a charge through the proxy under another Idempotency-Key
-- is what a redelivered message with a rotated key looks like. Each key's
-- `duplicate_policy` says what happens to it:
--   off   forwarded as any other charge;
--   flag  forwarded, and a duplicate finding is opened as soon as Stripe
--         confirms it (the default);
--   block refused before it reaches Stripe, naming the earlier charge.
-- The check runs in reserve_spend while the key's row is locked, so two
-- calls on one key are checked one after the other.

CREATE INDEX reservations_customer_period_idx ON reservations (billing_period, metadata_customer_id)
    WHERE metadata_customer_id IS NOT NULL AND state IN ('pending', 'settled', 'outcome_unknown');

DROP FUNCTION reserve_spend_many(jsonb);
DROP FUNCTION reserve_spend(bigint, uuid, text, bigint, text, text, text, text, text, text);

-- Outcomes: reserved (with `earlier_charge` when flagged), replay,
-- duplicate (blocked; `earlier_charge` names the charge, or is NULL when the
-- earlier call is still in flight or its outcome is unknown), over_cap,
-- unusable.
CREATE FUNCTION reserve_spend(
    p_key bigint, p_request uuid, p_idempotency_key text, p_amount bigint,
    p_method text, p_path text, p_stripe_customer text, p_metadata_customer_id text,
    p_billing_period text, p_currency text)
RETURNS TABLE (outcome text, reservation_id bigint, cap bigint, spent bigint, reserved bigint,
               earlier_charge text, earlier_state text)
LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
    k record;
    earlier_id text;
    earlier_st text;
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
        RETURN QUERY SELECT 'replay'::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
                            NULL::text, NULL::text;
        RETURN;
    END IF;

    UPDATE vault_keys v SET reserved_cents = v.reserved_cents + p_amount
    WHERE v.id = p_key AND v.revoked_at IS NULL AND v.expires_at > now()
      AND v.spent_cents + v.reserved_cents + p_amount <= v.cap_cents
    RETURNING v.cap_cents, v.spent_cents + v.reserved_cents AS used, v.alert_thresholds_pct,
              v.duplicate_policy
    INTO k;
    IF FOUND THEN
        -- The key's row is locked from here: the earlier calls this one is
        -- checked against are all committed or in this transaction.
        IF k.duplicate_policy <> 'off' AND p_metadata_customer_id IS NOT NULL THEN
            SELECT r.stripe_charge_id, r.state INTO earlier_id, earlier_st
            FROM reservations r
            WHERE r.billing_period = p_billing_period AND r.metadata_customer_id = p_metadata_customer_id
              AND r.metadata_customer_id IS NOT NULL
              AND r.state IN ('pending', 'settled', 'outcome_unknown')
              AND r.id <> new_id
              -- The same Idempotency-Key is Stripe's replay, not a second
              -- charge; no key at all is a different key.
              AND (r.idempotency_key IS NULL OR p_idempotency_key IS NULL
                   OR r.idempotency_key <> p_idempotency_key)
              -- A charge refunded in full no longer counts.
              AND NOT EXISTS (SELECT 1 FROM stripe_charges c
                              WHERE c.id = r.stripe_charge_id AND c.amount_refunded_cents >= c.amount_cents)
            ORDER BY r.state = 'settled' DESC, r.id
            LIMIT 1;
            IF FOUND AND k.duplicate_policy = 'block' THEN
                UPDATE vault_keys SET reserved_cents = reserved_cents - p_amount WHERE id = p_key;
                DELETE FROM reservations WHERE id = new_id;
                RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
                                    earlier_id, earlier_st;
                RETURN;
            END IF;
            -- Flagged only against a charge Stripe confirmed: one still in
            -- flight may fail, and reconciliation sees it if it does not.
            -- The proxy carries the flag to record_calls with the call.
            IF earlier_st IS DISTINCT FROM 'settled' OR earlier_id IS NULL THEN
                earlier_id := NULL;
                earlier_st := NULL;
            END IF;
        END IF;
        INSERT INTO alerts (vault_key_id, kind, threshold_pct, committed_cents, cap_cents)
        SELECT p_key, 'threshold', t, k.used, k.cap_cents
        FROM unnest(k.alert_thresholds_pct) AS t
        WHERE (k.used - p_amount) * 100 < t::bigint * k.cap_cents
          AND k.used * 100 >= t::bigint * k.cap_cents
        ON CONFLICT ON CONSTRAINT alerts_once DO NOTHING;
        RETURN QUERY SELECT 'reserved'::text, new_id, NULL::bigint, NULL::bigint, NULL::bigint,
                            earlier_id, earlier_st;
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
               NULL::bigint, k.cap_cents, k.spent_cents, k.reserved_cents, NULL::text, NULL::text;
END
$$;

CREATE FUNCTION reserve_spend_many(p_calls jsonb)
RETURNS TABLE (call_position bigint, outcome text, reservation_id bigint, cap bigint, spent bigint,
               reserved bigint, earlier_charge text, earlier_state text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT *
        FROM ROWS FROM (jsonb_to_recordset(p_calls) AS (
            key bigint, request uuid, idempotency_key text, amount bigint, method text, path text,
            stripe_customer text, metadata_customer_id text, billing_period text, currency text))
            WITH ORDINALITY AS x(key, request, idempotency_key, amount, method, path,
                                 stripe_customer, metadata_customer_id, billing_period, currency, n)
        ORDER BY x.key, x.n
    LOOP
        RETURN QUERY
            SELECT c.n, r.outcome, r.reservation_id, r.cap, r.spent, r.reserved, r.earlier_charge, r.earlier_state
            FROM reserve_spend(c.key, c.request, c.idempotency_key, c.amount, c.method, c.path,
                               c.stripe_customer, c.metadata_customer_id, c.billing_period, c.currency) r;
    END LOOP;
END
$$;

-- As before, and a settled call keeps the id of what Stripe made, set in
-- the same UPDATE that settles it (a charge found once is never matched to
-- an unknown outcome again).
DROP FUNCTION settle_spend(bigint, text);
CREATE FUNCTION settle_spend(p_reservation bigint, p_state text, p_charge text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    key_id bigint;
    amount bigint;
BEGIN
    UPDATE reservations SET state = p_state, settled_at = now(),
        stripe_charge_id = CASE
            WHEN p_state = 'settled' AND p_charge IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM reservations o WHERE o.stripe_charge_id = p_charge)
            THEN p_charge END
    WHERE id = p_reservation AND state = 'pending'
    RETURNING vault_key_id, amount_cents INTO key_id, amount;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_state = 'settled' THEN
        UPDATE vault_keys SET reserved_cents = reserved_cents - amount, spent_cents = spent_cents + amount
        WHERE id = key_id;
    ELSIF p_state = 'released' THEN
        UPDATE vault_keys SET reserved_cents = reserved_cents - amount WHERE id = key_id;
    END IF;
    RETURN true;
END
$$;

-- As before; a call the guard flagged (`duplicate_of`, the earlier charge)
-- that Stripe confirmed opens (or extends) its duplicate finding in the same
-- commit as its audit row.
CREATE OR REPLACE FUNCTION record_calls(p_calls jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT x.*
        FROM jsonb_to_recordset(p_calls)
             AS x(vault_key_id bigint, reservation_id bigint, settlement text, stripe_object_id text,
                  duplicate_of text, billing_period text, metadata_customer_id text, currency text,
                  amount_cents bigint, idempotency_key text)
        WHERE x.reservation_id IS NOT NULL
        ORDER BY x.vault_key_id, x.reservation_id
    LOOP
        PERFORM settle_spend(c.reservation_id, c.settlement, c.stripe_object_id);
        IF c.settlement <> 'settled' OR c.stripe_object_id IS NULL OR c.duplicate_of IS NULL THEN
            CONTINUE;
        END IF;
        INSERT INTO reconciliation_findings AS f (kind, billing_period, customer_id, currency, charge_ids,
            keeper_charge_id, amount_at_risk_cents, explanation)
        VALUES ('duplicate', c.billing_period, c.metadata_customer_id, c.currency,
                ARRAY[c.duplicate_of, c.stripe_object_id], c.duplicate_of, c.amount_cents,
                format('The proxy flagged %s: a second charge for %s in %s under another idempotency key (%s) after %s',
                       c.stripe_object_id, c.metadata_customer_id, c.billing_period,
                       COALESCE(c.idempotency_key, 'none'), c.duplicate_of))
        ON CONFLICT ON CONSTRAINT reconciliation_findings_once DO UPDATE SET
            -- Open: one more charge on it. Resolved: news, a new finding.
            charge_ids = CASE WHEN f.resolved_at IS NULL THEN f.charge_ids || c.stripe_object_id
                              ELSE EXCLUDED.charge_ids END,
            keeper_charge_id = CASE WHEN f.resolved_at IS NULL THEN f.keeper_charge_id
                                    ELSE EXCLUDED.keeper_charge_id END,
            amount_at_risk_cents = CASE WHEN f.resolved_at IS NULL
                                        THEN f.amount_at_risk_cents + EXCLUDED.amount_at_risk_cents
                                        ELSE EXCLUDED.amount_at_risk_cents END,
            explanation = EXCLUDED.explanation,
            last_detected_at = now(),
            resolution = NULL, resolved_at = NULL, resolved_by = NULL, resolution_note = NULL
        WHERE NOT (c.stripe_object_id = ANY (f.charge_ids));
    END LOOP;

    INSERT INTO audit_log (request_id, vault_key_id, key_prefix, method, path, stripe_customer,
        metadata_customer_id, metadata_billing_period, billing_period, amount_cents, currency,
        idempotency_key, decision, upstream_status, stripe_object_id, error_code, message, latency_ms)
    SELECT request_id, vault_key_id, key_prefix, method, path, stripe_customer,
        metadata_customer_id, metadata_billing_period, billing_period, amount_cents, currency,
        idempotency_key, decision, upstream_status, stripe_object_id, error_code, message, latency_ms
    FROM jsonb_populate_recordset(NULL::audit_log, p_calls);
END
$$;
