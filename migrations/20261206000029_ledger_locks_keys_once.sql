-- A ledger batch locks its keys once, and decides its short way in the
-- statement that takes it (issue 20).
--
-- record_and_reserve locked the keys of both halves of a batch, then
-- reserve_spend_many locked its keys again and settle_calls its own: each
-- lock a statement of its own (about 0.065 ms of PostgreSQL's CPU, with
-- the batch's JSON read again), for rows the transaction already held.
-- The two now take `p_keys_locked`: true only from a caller that has
-- locked every key of the calls, in key order, in this transaction.
--
-- reserve_spend_many tested whether a batch is plain in one statement and
-- reserved it in the next, reading the JSON in each. The test is now part
-- of the reserving statement: its writes happen only when the batch is
-- plain, and a batch that is not (no row comes back) goes call by call as
-- before. The test reads the keys as locked above, so its answer holds.

DROP FUNCTION reserve_spend_many(jsonb);
CREATE FUNCTION reserve_spend_many(p_calls jsonb, p_keys_locked boolean DEFAULT false)
RETURNS TABLE(call_position bigint, outcome text, reservation_id bigint, cap bigint, spent bigint,
              reserved bigint, earlier_charge text, earlier_state text)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    IF NOT p_keys_locked THEN
        -- The batch's keys, locked in key order as every ledger writer
        -- locks them (the lock an UPDATE of the counters takes).
        PERFORM 1 FROM vault_keys k
        WHERE k.id IN (SELECT x.key FROM reserve_calls(p_calls) x)
        ORDER BY k.id
        FOR NO KEY UPDATE;
    END IF;

    -- The short way, for a batch of plain calls (see migration 25).
    RETURN QUERY
    WITH calls AS MATERIALIZED (SELECT * FROM reserve_calls(p_calls)
    ), plain AS MATERIALIZED (
        SELECT NOT EXISTS (
            SELECT 1
            FROM (SELECT x.key, sum(x.amount)::bigint AS total FROM calls x GROUP BY x.key) t
            LEFT JOIN vault_keys k ON k.id = t.key
            WHERE k.id IS NULL OR k.revoked_at IS NOT NULL OR k.expires_at <= now()
               OR k.spent_cents + k.reserved_cents + t.total > k.cap_cents
            UNION ALL
            SELECT 1 FROM calls x
            JOIN reservations r ON r.vault_key_id = x.key AND r.idempotency_key = x.idempotency_key
                               AND NOT r.superseded
            UNION ALL
            SELECT 1 FROM calls x WHERE x.idempotency_key IS NOT NULL
            GROUP BY x.key, x.idempotency_key HAVING count(*) > 1
            UNION ALL
            SELECT 1 FROM calls x
            JOIN vault_keys k ON k.id = x.key AND k.duplicate_policy <> 'off'
            JOIN reservations r ON r.billing_period = x.billing_period
                               AND r.metadata_customer_id = x.metadata_customer_id
                               AND r.state IN ('pending', 'settled', 'outcome_unknown')
            UNION ALL
            SELECT 1 FROM calls x WHERE x.metadata_customer_id IS NOT NULL
            GROUP BY x.billing_period, x.metadata_customer_id HAVING count(*) > 1
        ) AS yes
    ), counted AS (
        UPDATE vault_keys k SET reserved_cents = k.reserved_cents + t.total
        FROM (SELECT x.key, sum(x.amount)::bigint AS total FROM calls x GROUP BY x.key) t
        WHERE k.id = t.key AND (SELECT p.yes FROM plain p)
        RETURNING k.id, k.spent_cents + k.reserved_cents - t.total AS committed_before, k.cap_cents,
                  k.alert_thresholds_pct
    ), made AS (
        INSERT INTO reservations (vault_key_id, request_id, idempotency_key, fingerprint, amount_cents,
                                  method, path, stripe_customer, metadata_customer_id, billing_period,
                                  currency, payment_intent, request_body, stripe_version, claimed_until)
        SELECT x.key, x.request, x.idempotency_key, x.fingerprint, x.amount, x.method,
               x.path, x.stripe_customer, x.metadata_customer_id, x.billing_period, x.currency,
               x.payment_intent, x.request_body, x.stripe_version,
               now() + make_interval(secs => x.lease_secs)
        FROM calls x
        WHERE (SELECT p.yes FROM plain p)
        ORDER BY x.key, x.n
        RETURNING id, request_id
    ), used AS (
        -- What each call leaves committed on its key, in the batch's order.
        SELECT x.key, x.amount, k.cap_cents, k.alert_thresholds_pct,
               k.committed_before + sum(x.amount) OVER (PARTITION BY x.key ORDER BY x.n)::bigint AS committed
        FROM calls x JOIN counted k ON k.id = x.key
    ), alerted AS (
        INSERT INTO alerts (vault_key_id, kind, threshold_pct, committed_cents, cap_cents)
        SELECT u.key, 'threshold', t, u.committed, u.cap_cents
        FROM used u, unnest(u.alert_thresholds_pct) AS t
        WHERE (u.committed - u.amount) * 100 < t::bigint * u.cap_cents
          AND u.committed * 100 >= t::bigint * u.cap_cents
        ON CONFLICT ON CONSTRAINT alerts_once DO NOTHING
    )
    SELECT x.n, 'reserved'::text, m.id, NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::text
    FROM calls x JOIN made m ON m.request_id = x.request
    ORDER BY x.n;
    IF FOUND THEN
        RETURN;
    END IF;

    -- Not plain (or no calls): one call at a time, in key order.
    FOR c IN
        SELECT * FROM reserve_calls(p_calls) x
        ORDER BY x.key, x.n
    LOOP
        RETURN QUERY
            SELECT c.n, r.outcome, r.reservation_id, r.cap, r.spent, r.reserved, r.earlier_charge, r.earlier_state
            FROM reserve_spend(c.key, c.request, c.idempotency_key, c.fingerprint, c.amount,
                               c.method, c.path, c.stripe_customer, c.metadata_customer_id,
                               c.billing_period, c.currency, c.payment_intent, c.request_body,
                               c.stripe_version, c.lease_secs) r;
    END LOOP;
END
$$;

-- Settlement and recording, as before (migration 25) but for the lock.
DROP FUNCTION record_calls(jsonb);
DROP FUNCTION settle_calls(jsonb);
CREATE FUNCTION settle_calls(p_calls jsonb, p_keys_locked boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
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

CREATE FUNCTION record_calls(p_calls jsonb, p_keys_locked boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    -- The batch's JSON is read by jsonpath tests first: most batches hold
    -- no release and no flagged duplicate, and a batch of refusals no
    -- reservation, so their statements (each reading the JSON again) are
    -- skipped.
    IF jsonb_path_exists(p_calls, '$[*].release ? (@.type() != "null")') THEN
        -- A payment intent Stripe cancelled or captured for less gives
        -- back what its earlier calls settled (rare): call by call, as
        -- before, each release before its own call settles.
        FOR c IN
            SELECT x.vault_key_id, x.release, x.n
            FROM recorded_calls(p_calls) x
            WHERE x.reservation_id IS NOT NULL OR x.release IS NOT NULL
            ORDER BY x.vault_key_id, x.reservation_id NULLS LAST
        LOOP
            IF c.release IS NOT NULL THEN
                PERFORM release_intent(c.vault_key_id, c.release->>'intent', (c.release->>'keep_cents')::bigint);
            END IF;
            PERFORM settle_calls(jsonb_build_array(p_calls->(c.n::int - 1)), p_keys_locked);
        END LOOP;
    ELSIF jsonb_path_exists(p_calls, '$[*].reservation_id ? (@.type() != "null")') THEN
        PERFORM settle_calls(p_calls, p_keys_locked);
    END IF;

    -- A second charge for a customer and period, flagged by the proxy.
    IF jsonb_path_exists(p_calls, '$[*].duplicate_of ? (@.type() != "null")') THEN
        FOR c IN
            SELECT x.*
            FROM recorded_calls(p_calls) x
            WHERE x.reservation_id IS NOT NULL AND x.settlement = 'settled' AND x.stripe_object_id IS NOT NULL
              AND x.duplicate_of IS NOT NULL
            ORDER BY x.vault_key_id
        LOOP
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
    END IF;

    INSERT INTO audit_log (request_id, vault_key_id, key_prefix, method, path, stripe_customer,
        metadata_customer_id, metadata_billing_period, billing_period, amount_cents, currency,
        idempotency_key, decision, upstream_status, stripe_object_id, error_code, message, latency_ms)
    SELECT request_id, vault_key_id, key_prefix, method, path, stripe_customer,
        metadata_customer_id, metadata_billing_period, billing_period, amount_cents, currency,
        idempotency_key, decision, upstream_status, stripe_object_id, error_code, message, latency_ms
    FROM jsonb_populate_recordset(NULL::audit_log, p_calls);
END
$$;

-- Every key of both halves locked here, once.
CREATE OR REPLACE FUNCTION record_and_reserve(p_records jsonb, p_reserves jsonb)
RETURNS TABLE(call_position bigint, outcome text, reservation_id bigint, cap bigint, spent bigint,
              reserved bigint, earlier_charge text, earlier_state text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM vault_keys k
    WHERE k.id IN (SELECT x.key FROM reserve_calls(p_reserves) x
                   UNION
                   SELECT x.vault_key_id FROM recorded_calls(p_records) x
                   WHERE x.reservation_id IS NOT NULL OR x.release IS NOT NULL)
    ORDER BY k.id
    FOR NO KEY UPDATE;

    RETURN QUERY SELECT * FROM reserve_spend_many(p_reserves, p_keys_locked => true);
    PERFORM record_calls(p_records, p_keys_locked => true);
END
$$;
