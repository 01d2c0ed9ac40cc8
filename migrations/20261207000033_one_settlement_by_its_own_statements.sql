-- A settlement alone goes by one statement per row (issue 20).
--
-- A lone call's settlement is a batch of one, and settle_calls reads it
-- the way it reads a batch: the batch's JSON three times over (the key
-- lock, the claims on charge ids, the update), each through a function of
-- its own, to settle a reservation whose id the JSON names. Alone, its key
-- is locked, its reservation settled and its key's counters moved by a
-- statement each, with the JSON read once. The rules are the batch's: only
-- a pending reservation settles; a settled call moves its amount from
-- reserved to spent, a released one gives it back, an unknown outcome
-- keeps it reserved; Stripe's object id binds the reservation unless
-- another holds it. The key is still locked before the reservation's row,
-- the order every ledger writer keeps. Measured with pgbench on the
-- system cluster, a lone call's reserve and record writes with their
-- commits took 1.25-1.73 ms the batch's way and 1.11-1.56 ms this way
-- (seven alternated runs of each: 0.09-0.19 ms less in six, even in one).

CREATE OR REPLACE FUNCTION settle_calls(p_calls jsonb, p_keys_locked boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_call jsonb;
    v_reservation bigint;
    v_settlement text;
    v_object text;
    v_key bigint;
    v_amount bigint;
BEGIN
    IF jsonb_array_length(p_calls) = 1 THEN
        v_call := p_calls->0;
        v_reservation := (v_call->>'reservation_id')::bigint;
        IF v_reservation IS NULL THEN
            RETURN;
        END IF;
        v_settlement := v_call->>'settlement';
        v_object := v_call->>'stripe_object_id';
        -- The key before the reservation, as every ledger writer locks them.
        IF NOT p_keys_locked THEN
            PERFORM 1 FROM vault_keys k WHERE k.id = (v_call->>'vault_key_id')::bigint FOR NO KEY UPDATE;
        END IF;
        UPDATE reservations r
        SET state = v_settlement, settled_at = now(),
            stripe_charge_id = CASE
                WHEN v_settlement IN ('settled', 'outcome_unknown') AND v_object IS NOT NULL
                     AND NOT EXISTS (SELECT 1 FROM reservations o
                                     WHERE o.stripe_charge_id = v_object AND o.id <> r.id)
                THEN v_object
                ELSE r.stripe_charge_id END,
            payment_intent = CASE WHEN v_object LIKE 'pi\_%' AND r.payment_intent IS NULL
                                  THEN v_object ELSE r.payment_intent END
        WHERE r.id = v_reservation AND r.state = 'pending'
        RETURNING r.vault_key_id, r.amount_cents INTO v_key, v_amount;
        IF FOUND AND v_settlement IN ('settled', 'released') AND v_amount <> 0 THEN
            UPDATE vault_keys k
            SET reserved_cents = k.reserved_cents - v_amount,
                spent_cents = k.spent_cents + CASE WHEN v_settlement = 'settled' THEN v_amount ELSE 0 END
            WHERE k.id = v_key;
        END IF;
        RETURN;
    END IF;

    IF NOT p_keys_locked THEN
        PERFORM 1 FROM vault_keys k
        WHERE k.id IN (SELECT x.vault_key_id
                       FROM recorded_calls(p_calls) x
                       WHERE x.reservation_id IS NOT NULL)
        ORDER BY k.id
        -- The lock an UPDATE of the counters takes: inserts that reference
        -- the key (an audit row, a reservation) are not held up by it.
        FOR NO KEY UPDATE;
    END IF;

    WITH claims AS (
        -- A charge id binds one reservation. Two keys on one account can
        -- both be told the same charge (Stripe's answer to the same
        -- Idempotency-Key and parameters): in one batch, the first of them
        -- in key order takes it, as call by call.
        SELECT DISTINCT ON (x.stripe_object_id) x.reservation_id, x.stripe_object_id
        FROM recorded_calls(p_calls) x
        JOIN reservations p ON p.id = x.reservation_id AND p.state = 'pending'
        WHERE x.settlement IN ('settled', 'outcome_unknown') AND x.stripe_object_id IS NOT NULL
        ORDER BY x.stripe_object_id, x.vault_key_id, x.reservation_id
    ), settled AS (
        UPDATE reservations r
        SET state = x.settlement, settled_at = now(),
            -- An unknown outcome keeps Stripe's object id too: a declined
            -- payment intent that could not be cancelled stays reserved,
            -- bound to its key.
            stripe_charge_id = CASE
                WHEN x.settlement IN ('settled', 'outcome_unknown')
                     AND (x.reservation_id, x.stripe_object_id) IN (SELECT c.reservation_id, c.stripe_object_id
                                                                    FROM claims c)
                     AND NOT EXISTS (SELECT 1 FROM reservations o
                                     WHERE o.stripe_charge_id = x.stripe_object_id AND o.id <> r.id)
                THEN x.stripe_object_id
                -- Settled again (a retry of an unknown outcome): what it knew stays.
                ELSE r.stripe_charge_id END,
            payment_intent = CASE WHEN x.stripe_object_id LIKE 'pi\_%' AND r.payment_intent IS NULL
                                  THEN x.stripe_object_id ELSE r.payment_intent END
        FROM recorded_calls(p_calls) x
        WHERE r.id = x.reservation_id AND r.state = 'pending'
        RETURNING r.vault_key_id, r.amount_cents, x.settlement
    ), moved AS (
        SELECT s.vault_key_id,
               coalesce(sum(s.amount_cents) FILTER (WHERE s.settlement IN ('settled', 'released')), 0)::bigint AS give_back,
               coalesce(sum(s.amount_cents) FILTER (WHERE s.settlement = 'settled'), 0)::bigint AS spend
        FROM settled s
        GROUP BY s.vault_key_id
    )
    UPDATE vault_keys k
    SET reserved_cents = k.reserved_cents - m.give_back, spent_cents = k.spent_cents + m.spend
    FROM moved m
    WHERE k.id = m.vault_key_id AND (m.give_back <> 0 OR m.spend <> 0);
END
$$;
