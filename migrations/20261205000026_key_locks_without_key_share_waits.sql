-- Every lock the ledger takes on a vault key is the one an UPDATE of its
-- counters takes (FOR NO KEY UPDATE), not FOR UPDATE. An audit row, a
-- reservation or an alert that references a key takes a KEY SHARE lock on
-- it through its foreign key; FOR UPDATE waits for those, and their
-- writer locks keys in the order its rows come, not in key order. A batch
-- refused over the cap (reserve_spend's long way), a payment intent's
-- release and the settling of an unknown outcome took FOR UPDATE and could
-- deadlock with a writer of audit rows. The functions are otherwise as
-- they were.

CREATE OR REPLACE FUNCTION public.reserve_spend(p_key bigint, p_request uuid, p_idempotency_key text, p_fingerprint bytea, p_amount bigint, p_method text, p_path text, p_stripe_customer text, p_metadata_customer_id text, p_billing_period text, p_currency text, p_payment_intent text, p_request_body text, p_stripe_version text, p_lease_secs integer)
 RETURNS TABLE(outcome text, reservation_id bigint, cap bigint, spent bigint, reserved bigint, earlier_charge text, earlier_state text)
 LANGUAGE plpgsql
AS $function$
DECLARE
    k record;
    fits boolean;
    prior record;
    new_id bigint;
    used bigint;
    earlier_id text;
    earlier_st text;
    abandoned boolean;
    same boolean;
BEGIN
    -- The key's row is locked first, by the UPDATE that reserves when the
    -- amount fits (the common case: one statement, as before), else by a
    -- plain lock. Every outcome below but `reserved` gives the amount back.
    UPDATE vault_keys v SET reserved_cents = v.reserved_cents + p_amount
    WHERE v.id = p_key AND v.revoked_at IS NULL AND v.expires_at > now()
      AND v.spent_cents + v.reserved_cents + p_amount <= v.cap_cents
    RETURNING v.cap_cents, v.spent_cents, v.reserved_cents - p_amount AS reserved_cents,
              v.alert_thresholds_pct, v.duplicate_policy
    INTO k;
    fits := FOUND;
    IF NOT fits THEN
        SELECT v.cap_cents, v.spent_cents, v.reserved_cents, v.alert_thresholds_pct, v.duplicate_policy,
               v.revoked_at IS NULL AND v.expires_at > now() AS usable
        INTO k FROM vault_keys v WHERE v.id = p_key FOR NO KEY UPDATE;
        IF NOT FOUND OR NOT k.usable THEN
            RETURN QUERY SELECT 'unusable'::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
                                NULL::text, NULL::text;
            RETURN;
        END IF;
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        SELECT r.id, r.state, r.fingerprint, r.created_at, r.claimed_until INTO prior
        FROM reservations r
        WHERE r.vault_key_id = p_key AND r.idempotency_key = p_idempotency_key AND NOT r.superseded;
        IF FOUND THEN
            IF prior.state = 'released' OR prior.created_at < now() - interval '24 hours' THEN
                UPDATE reservations SET superseded = true WHERE id = prior.id;
            ELSE
                IF fits THEN
                    UPDATE vault_keys SET reserved_cents = reserved_cents - p_amount WHERE id = p_key;
                END IF;
                -- A settled reservation from before fingerprints (NULL) keeps
                -- the old reading, a replay (Stripe compares parameters
                -- itself); one still open is taken for another request.
                same := prior.fingerprint = p_fingerprint
                        OR (prior.fingerprint IS NULL AND prior.state = 'settled');
                abandoned := prior.state = 'pending' AND prior.claimed_until < now();
                RETURN QUERY SELECT
                    CASE WHEN NOT same THEN 'idempotency_mismatch'
                         WHEN prior.state = 'pending' AND NOT abandoned THEN 'in_flight'
                         WHEN prior.state = 'settled' THEN 'replay'
                         ELSE 'retry_unknown' END,
                    prior.id, NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, prior.state;
                IF same AND (prior.state = 'outcome_unknown' OR abandoned) THEN
                    IF abandoned THEN
                        PERFORM audit_abandoned(prior.id);
                    END IF;
                    UPDATE reservations
                    SET state = 'pending', claimed_until = now() + make_interval(secs => p_lease_secs)
                    WHERE id = prior.id;
                END IF;
                RETURN;
            END IF;
        END IF;
    END IF;

    IF NOT fits THEN
        INSERT INTO alerts (vault_key_id, kind, committed_cents, cap_cents, amount_cents)
        VALUES (p_key, 'cap_refused', k.spent_cents + k.reserved_cents, k.cap_cents, p_amount)
        ON CONFLICT ON CONSTRAINT alerts_once
        DO UPDATE SET occurrences = alerts.occurrences + 1, last_occurred_at = now(),
                      committed_cents = EXCLUDED.committed_cents, cap_cents = EXCLUDED.cap_cents,
                      amount_cents = EXCLUDED.amount_cents;
        RETURN QUERY SELECT 'over_cap'::text, NULL::bigint, k.cap_cents, k.spent_cents, k.reserved_cents,
                            NULL::text, NULL::text;
        RETURN;
    END IF;

    -- The duplicate guard: an earlier charge for this customer and period
    -- under another Idempotency-Key (or none). The key's row is locked, so
    -- every earlier call on this key is committed or in this transaction.
    IF k.duplicate_policy <> 'off' AND p_metadata_customer_id IS NOT NULL THEN
        SELECT r.stripe_charge_id, r.state INTO earlier_id, earlier_st
        FROM reservations r
        WHERE r.billing_period = p_billing_period AND r.metadata_customer_id = p_metadata_customer_id
          AND r.state IN ('pending', 'settled', 'outcome_unknown')
          -- The same Idempotency-Key is Stripe's replay, not a second
          -- charge, unless the earlier call was superseded (a day later,
          -- Stripe has forgotten the key and charges again).
          AND (r.idempotency_key IS NULL OR p_idempotency_key IS NULL
               OR r.idempotency_key <> p_idempotency_key OR r.superseded)
          -- A charge refunded in full no longer counts.
          AND NOT EXISTS (SELECT 1 FROM stripe_charges c
                          WHERE c.id = r.stripe_charge_id AND c.amount_refunded_cents >= c.amount_cents)
        ORDER BY r.state = 'settled' DESC, r.id
        LIMIT 1;
        IF FOUND AND k.duplicate_policy = 'block' THEN
            UPDATE vault_keys SET reserved_cents = reserved_cents - p_amount WHERE id = p_key;
            RETURN QUERY SELECT 'duplicate'::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
                                earlier_id, earlier_st;
            RETURN;
        END IF;
        -- Flagged only against a charge Stripe confirmed: one still in
        -- flight may fail, and reconciliation sees it if it does not.
        IF earlier_st IS DISTINCT FROM 'settled' OR earlier_id IS NULL THEN
            earlier_id := NULL;
            earlier_st := NULL;
        END IF;
    END IF;

    INSERT INTO reservations (vault_key_id, request_id, idempotency_key, fingerprint, amount_cents, method,
                              path, stripe_customer, metadata_customer_id, billing_period, currency,
                              payment_intent, request_body, stripe_version, claimed_until)
    VALUES (p_key, p_request, p_idempotency_key, p_fingerprint, p_amount, p_method, p_path,
            p_stripe_customer, p_metadata_customer_id, p_billing_period, p_currency, p_payment_intent,
            p_request_body, p_stripe_version,
            now() + make_interval(secs => p_lease_secs))
    RETURNING id INTO new_id;

    used := k.spent_cents + k.reserved_cents + p_amount;
    INSERT INTO alerts (vault_key_id, kind, threshold_pct, committed_cents, cap_cents)
    SELECT p_key, 'threshold', t, used, k.cap_cents
    FROM unnest(k.alert_thresholds_pct) AS t
    WHERE (used - p_amount) * 100 < t::bigint * k.cap_cents
      AND used * 100 >= t::bigint * k.cap_cents
    ON CONFLICT ON CONSTRAINT alerts_once DO NOTHING;
    RETURN QUERY SELECT 'reserved'::text, new_id, NULL::bigint, NULL::bigint, NULL::bigint,
                        earlier_id, earlier_st;
END
$function$;

CREATE OR REPLACE FUNCTION public.release_intent(p_key bigint, p_intent text, p_keep bigint)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    r record;
    surplus bigint;
    given_back bigint := 0;
    part bigint;
BEGIN
    PERFORM 1 FROM vault_keys WHERE id = p_key FOR NO KEY UPDATE;
    SELECT coalesce(sum(amount_cents - released_cents), 0) - p_keep INTO surplus
    FROM reservations
    WHERE vault_key_id = p_key AND payment_intent = p_intent AND state = 'settled';
    FOR r IN
        SELECT id, amount_cents - released_cents AS open
        FROM reservations
        WHERE vault_key_id = p_key AND payment_intent = p_intent AND state = 'settled'
          AND amount_cents > released_cents
        ORDER BY id DESC
    LOOP
        EXIT WHEN surplus <= 0;
        part := least(surplus, r.open);
        UPDATE reservations SET released_cents = released_cents + part WHERE id = r.id;
        surplus := surplus - part;
        given_back := given_back + part;
    END LOOP;
    UPDATE vault_keys SET spent_cents = spent_cents - given_back WHERE id = p_key;
    RETURN given_back;
END
$function$;

CREATE OR REPLACE FUNCTION public.settle_unknown_spend(p_reservation bigint, p_state text, p_charge text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    key_id bigint;
    amount bigint;
BEGIN
    IF p_state NOT IN ('settled', 'released') THEN
        RAISE EXCEPTION 'an unknown outcome is settled or released, not %', p_state;
    END IF;
    PERFORM 1 FROM vault_keys
    WHERE id = (SELECT vault_key_id FROM reservations WHERE id = p_reservation) FOR NO KEY UPDATE;
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
$function$;
