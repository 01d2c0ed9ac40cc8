-- Idempotency as Stripe has it, and one lock order for every ledger write.
--
-- Until now a used Idempotency-Key was a replay whatever happened to the
-- first call and whatever the second one said: a key whose first call was
-- released (a 4xx: Stripe saved nothing, or forgot it after 24 h) let any
-- later call with that key through unreserved and uncapped. Now each
-- reservation keeps the fingerprint of its request (method, path, canonical
-- parameters, Stripe-Account; computed by the proxy) and, per vault key and
-- Idempotency-Key, the latest reservation decides:
--
--   released, or older than 24 h     a new call: reserved and capped;
--   another fingerprint              refused: Stripe's idempotency_error;
--   pending (in flight)              refused: Stripe's 409, retry later;
--   settled                          a replay: forwarded, not reserved;
--   outcome_unknown                  this retry resolves it: the reservation
--                                    is pending again and settles with
--                                    Stripe's answer to the retry.
--
-- Lock order: every function that changes a key's money or reservations
-- locks the key's row first and only then its reservations, so the reserve
-- and settle writers (and several proxy processes) never deadlock. Before,
-- a settlement locked a reservation and then waited for the key while a
-- reservation batch held the key and waited on that reservation's index
-- entry (twins racing with one Idempotency-Key: "deadlock detected").
--
-- This is the live definition of reserve_spend, settle_spend and
-- settle_unknown_spend; earlier migrations hold their history.

ALTER TABLE reservations
    ADD COLUMN fingerprint bytea,
    -- The payment intent a call was about: one it created (also in
    -- stripe_charge_id once known) or one whose amount it raised.
    ADD COLUMN payment_intent text,
    -- What a cancelled or partly captured intent gave back of this
    -- reservation's spent amount (spent = amount_cents - released_cents).
    ADD COLUMN released_cents bigint NOT NULL DEFAULT 0 CHECK (released_cents >= 0),
    -- The request as sent (calls with an Idempotency-Key only): while
    -- Stripe remembers the key, sending it again tells what happened.
    ADD COLUMN request_body   text,
    ADD COLUMN stripe_version text,
    -- An older reservation under the same Idempotency-Key that a new call replaced.
    ADD COLUMN superseded  boolean     NOT NULL DEFAULT false,
    -- Until when the process that sent the call (or the retry resolving
    -- it) answers for it: the proxy's own upstream timeout and a margin,
    -- stored with the call so processes with other timeouts agree. A
    -- pending call past it was abandoned (its process stopped): a retry
    -- takes it over, and the sweep records it as outcome unknown.
    ADD COLUMN claimed_until timestamptz NOT NULL DEFAULT now() + interval '2 minutes';
UPDATE reservations SET claimed_until = created_at + interval '2 minutes';

-- A key may be for one connected account (Stripe-Account): its calls must
-- name that account, and no other key's may.
ALTER TABLE vault_keys ADD COLUMN stripe_account text
    CONSTRAINT vault_keys_stripe_account_check CHECK (stripe_account ~ '^acct_[A-Za-z0-9]{1,250}$');

DROP INDEX reservations_idempotency_idx;
CREATE UNIQUE INDEX reservations_idempotency_idx ON reservations (vault_key_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND NOT superseded;
-- The sweep and the unknown-outcome job look for open calls by their lease.
DROP INDEX reservations_open_idx;
CREATE INDEX reservations_open_idx ON reservations (claimed_until)
    WHERE state IN ('pending', 'outcome_unknown');
CREATE INDEX reservations_payment_intent_idx ON reservations (vault_key_id, payment_intent)
    WHERE payment_intent IS NOT NULL;
ALTER TABLE reservations ADD CONSTRAINT reservations_released_within
    CHECK (released_cents <= amount_cents);

DROP FUNCTION reserve_spend_many(jsonb);
DROP FUNCTION reserve_spend(bigint, uuid, text, bigint, text, text, text, text, text, text);

-- The audit row of a call whose process stopped before it settled, as the
-- sweep and a retry taking the call over write it.
CREATE FUNCTION audit_abandoned(p_reservation bigint)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO audit_log (at, request_id, vault_key_id, key_prefix, method, path, stripe_customer,
        metadata_customer_id, billing_period, amount_cents, currency, idempotency_key, decision, message)
    SELECT r.created_at, r.request_id, r.vault_key_id, k.secret_prefix, r.method, r.path, r.stripe_customer,
           r.metadata_customer_id, r.billing_period, r.amount_cents, r.currency, r.idempotency_key,
           'outcome_unknown', 'the proxy stopped before the call settled; its retry or Stripe decides'
    FROM reservations r JOIN vault_keys k ON k.id = r.vault_key_id
    WHERE r.id = p_reservation
$$;

-- Outcomes: reserved (with `earlier_charge` when the duplicate guard flags
-- it), replay, retry_unknown (`reservation_id` is the call being resolved:
-- of unknown outcome, or abandoned by a stopped process), in_flight,
-- idempotency_mismatch, duplicate, over_cap, unusable. `p_lease_secs`: how
-- long the calling process answers for the call.
CREATE FUNCTION reserve_spend(
    p_key bigint, p_request uuid, p_idempotency_key text, p_fingerprint bytea, p_amount bigint,
    p_method text, p_path text, p_stripe_customer text, p_metadata_customer_id text,
    p_billing_period text, p_currency text, p_payment_intent text, p_request_body text,
    p_stripe_version text, p_lease_secs integer)
RETURNS TABLE (outcome text, reservation_id bigint, cap bigint, spent bigint, reserved bigint,
               earlier_charge text, earlier_state text)
LANGUAGE plpgsql AS $$
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
        INTO k FROM vault_keys v WHERE v.id = p_key FOR UPDATE;
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
$$;

-- p_calls: a JSON array of reserve_spend's parameters (`fingerprint` in
-- hex); one row per call, `call_position` being its 1-based place. Calls
-- are taken in ascending key order, so batches lock keys in one order.
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
            key bigint, request uuid, idempotency_key text, fingerprint text, amount bigint, method text,
            path text, stripe_customer text, metadata_customer_id text, billing_period text, currency text,
            payment_intent text, request_body text, stripe_version text, lease_secs integer))
            WITH ORDINALITY AS x(key, request, idempotency_key, fingerprint, amount, method, path,
                                 stripe_customer, metadata_customer_id, billing_period, currency,
                                 payment_intent, request_body, stripe_version, lease_secs, n)
        ORDER BY x.key, x.n
    LOOP
        RETURN QUERY
            SELECT c.n, r.outcome, r.reservation_id, r.cap, r.spent, r.reserved, r.earlier_charge, r.earlier_state
            FROM reserve_spend(c.key, c.request, c.idempotency_key, decode(c.fingerprint, 'hex'), c.amount,
                               c.method, c.path, c.stripe_customer, c.metadata_customer_id,
                               c.billing_period, c.currency, c.payment_intent, c.request_body,
                               c.stripe_version, c.lease_secs) r;
    END LOOP;
END
$$;

-- As before, in the lock order above: the key's row first, by the UPDATE
-- that moves the money, then the reservation; if someone else decided the
-- reservation between the two (the sweep, a retry taking it over), the
-- money goes back and nothing changed.
CREATE OR REPLACE FUNCTION settle_spend(p_reservation bigint, p_state text, p_charge text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    key_id bigint;
    amount bigint;
    spend bigint;
    give_back bigint;
BEGIN
    SELECT vault_key_id, amount_cents INTO key_id, amount
    FROM reservations WHERE id = p_reservation AND state = 'pending';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    spend := CASE WHEN p_state = 'settled' THEN amount ELSE 0 END;
    give_back := CASE WHEN p_state IN ('settled', 'released') THEN amount ELSE 0 END;
    UPDATE vault_keys SET reserved_cents = reserved_cents - give_back, spent_cents = spent_cents + spend
    WHERE id = key_id;
    -- An unknown outcome keeps Stripe's object id too: a declined payment
    -- intent that could not be cancelled stays reserved, bound to its key.
    UPDATE reservations SET state = p_state, settled_at = now(),
        stripe_charge_id = CASE
            WHEN p_state IN ('settled', 'outcome_unknown') AND p_charge IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM reservations o
                                 WHERE o.stripe_charge_id = p_charge AND o.id <> p_reservation)
            THEN p_charge
            -- Settled again (a retry of an unknown outcome): what it knew stays.
            ELSE stripe_charge_id END,
        payment_intent = CASE WHEN p_charge LIKE 'pi\_%' AND payment_intent IS NULL THEN p_charge
                              ELSE payment_intent END
    WHERE id = p_reservation AND state = 'pending';
    IF NOT FOUND THEN
        UPDATE vault_keys SET reserved_cents = reserved_cents + give_back, spent_cents = spent_cents - spend
        WHERE id = key_id;
        RETURN false;
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION settle_unknown_spend(p_reservation bigint, p_state text, p_charge text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    key_id bigint;
    amount bigint;
BEGIN
    IF p_state NOT IN ('settled', 'released') THEN
        RAISE EXCEPTION 'an unknown outcome is settled or released, not %', p_state;
    END IF;
    PERFORM 1 FROM vault_keys
    WHERE id = (SELECT vault_key_id FROM reservations WHERE id = p_reservation) FOR UPDATE;
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

-- What a vault key has metered for one payment intent: the amounts of its
-- creation and of every update that raised it, less what was given back.
-- Calls whose outcome is still open count: they may yet have moved money.
CREATE FUNCTION intent_metered(p_key bigint, p_intent text)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT sum(amount_cents - released_cents)
    FROM reservations
    WHERE vault_key_id = p_key AND payment_intent = p_intent
      AND state IN ('pending', 'settled', 'outcome_unknown')
$$;

-- A payment intent Stripe cancelled, or captured for less than was
-- metered: what it will not take goes back to the key, from its settled
-- reservations (the newest first). `p_keep` is what the intent took.
CREATE FUNCTION release_intent(p_key bigint, p_intent text, p_keep bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    surplus bigint;
    given_back bigint := 0;
    part bigint;
BEGIN
    PERFORM 1 FROM vault_keys WHERE id = p_key FOR UPDATE;
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
$$;

-- As before, and a call that cancelled a payment intent or captured less
-- than was metered (`release`: {"intent", "keep_cents"}) gives the rest back
-- in the same commit as its audit row.
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
                  amount_cents bigint, idempotency_key text, release jsonb)
        WHERE x.reservation_id IS NOT NULL OR x.release IS NOT NULL
        -- In key order, as every ledger writer locks keys.
        ORDER BY x.vault_key_id, x.reservation_id NULLS LAST
    LOOP
        IF c.release IS NOT NULL THEN
            -- A payment intent Stripe cancelled or captured for less.
            PERFORM release_intent(c.vault_key_id, c.release->>'intent', (c.release->>'keep_cents')::bigint);
        END IF;
        IF c.reservation_id IS NULL THEN
            CONTINUE;
        END IF;
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
