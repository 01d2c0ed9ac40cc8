-- The proxy's two ledger steps as functions, so that each is one round trip
-- and one commit: reserve before forwarding, settle (with the call's audit
-- row, in the same statement) after. The rules are those of
-- app/src/ssr/data/spend.rs, which is their only caller.

-- Reserves p_amount under p_key for one call. Outcomes:
--   reserved  (reservation_id set)
--   replay    (the Idempotency-Key was already used under this key)
--   over_cap  (cap, spent, reserved describe the key)
--   unusable  (the key is revoked or expired)
CREATE FUNCTION reserve_spend(
    p_key bigint, p_request uuid, p_idempotency_key text, p_amount bigint,
    p_method text, p_path text, p_stripe_customer text, p_metadata_customer_id text,
    p_billing_period text, p_currency text)
RETURNS TABLE (outcome text, reservation_id bigint, cap bigint, spent bigint, reserved bigint)
LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
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

    UPDATE vault_keys SET reserved_cents = reserved_cents + p_amount
    WHERE id = p_key AND revoked_at IS NULL AND expires_at > now()
      AND spent_cents + reserved_cents + p_amount <= cap_cents;
    IF FOUND THEN
        RETURN QUERY SELECT 'reserved'::text, new_id, NULL::bigint, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;

    -- Refused: the reservation never existed for anyone else.
    DELETE FROM reservations WHERE id = new_id;
    RETURN QUERY
        SELECT CASE WHEN k.revoked_at IS NULL AND k.expires_at > now() THEN 'over_cap' ELSE 'unusable' END,
               NULL::bigint, k.cap_cents, k.spent_cents, k.reserved_cents
        FROM vault_keys k WHERE k.id = p_key;
END
$$;

-- Settles a pending reservation: 'settled' moves it to spent, 'released'
-- gives it back, 'outcome_unknown' keeps it reserved for reconciliation.
-- A reservation that is no longer pending (a sweep got there first) is left
-- alone. Returns whether it was pending.
CREATE FUNCTION settle_spend(p_reservation bigint, p_state text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    key_id bigint;
    amount bigint;
BEGIN
    UPDATE reservations SET state = p_state, settled_at = now()
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
