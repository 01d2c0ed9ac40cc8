-- What the ledger's write would cost without four of its parts: an upper
-- bound on what redesigning them could save, NEVER a migration (it drops
-- the audit log's hash chain and the console's audit indexes, and leaves
-- every reservation pending). For `scripts/ledger-writes` as it is, and for
-- `vaultcap bench proxy` copied into migrations/ for one release build (and
-- removed again): with reservations leased for a day, so that no sweep
-- runs during the bench, and its books check fails, as no reservation
-- settles. Its reserve_spend_many is migration 30's with that lease, so a
-- batch of one takes the short way, not migration 32's call-by-call way:
-- it speaks for batches of two or more (8 and 64 in flight), not for one
-- call alone.

-- Settlements kept apart: a narrow insert-only table, the reservation row untouched.
CREATE TABLE settlements (reservation_id bigint PRIMARY KEY, state text NOT NULL,
                          stripe_charge_id text, settled_at timestamptz NOT NULL DEFAULT now());
CREATE OR REPLACE FUNCTION settle_calls(p_calls jsonb, p_keys_locked boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT p_keys_locked THEN
        PERFORM 1 FROM vault_keys k
        WHERE k.id IN (SELECT x.vault_key_id FROM recorded_calls(p_calls) x WHERE x.reservation_id IS NOT NULL)
        ORDER BY k.id FOR NO KEY UPDATE;
    END IF;
    WITH settled AS (
        INSERT INTO settlements (reservation_id, state, stripe_charge_id)
        SELECT x.reservation_id, x.settlement, x.stripe_object_id
        FROM recorded_calls(p_calls) x WHERE x.reservation_id IS NOT NULL
        ON CONFLICT DO NOTHING
        RETURNING reservation_id, state
    ), moved AS (
        -- The amounts as the proxy sends them, not read from the reservations.
        SELECT x.vault_key_id,
               coalesce(sum(x.amount_cents) FILTER (WHERE s.state IN ('settled', 'released')), 0)::bigint AS give_back,
               coalesce(sum(x.amount_cents) FILTER (WHERE s.state = 'settled'), 0)::bigint AS spend
        FROM settled s JOIN recorded_calls(p_calls) x ON x.reservation_id = s.reservation_id
        GROUP BY x.vault_key_id
    )
    UPDATE vault_keys k
    SET reserved_cents = k.reserved_cents - m.give_back, spent_cents = k.spent_cents + m.spend
    FROM moved m
    WHERE k.id = m.vault_key_id AND (m.give_back <> 0 OR m.spend <> 0);
END
$$;

-- No hash chain: each row numbered from a sequence, no hash, no head.
CREATE SEQUENCE chain_free_seq;
CREATE OR REPLACE FUNCTION audit_log_chain() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.chain_day := (now() AT TIME ZONE 'UTC')::date;
    NEW.chain_seq := nextval('chain_free_seq');
    NEW.row_hash := '\x00';
    RETURN NEW;
END
$$;
DROP TRIGGER audit_log_chain_head ON audit_log;

-- The console's audit filters unindexed, as an audit row costs without them.
DROP INDEX audit_log_customer_idx, audit_log_metadata_customer_idx, audit_log_idempotency_idx,
           audit_log_object_idx, audit_log_refused_idx, audit_log_period_idx;

-- No per-hour call counts.
DROP TRIGGER audit_log_count_calls ON audit_log;

-- Leases of a day (see above); otherwise reserve_spend_many as in migration 30.
CREATE OR REPLACE FUNCTION reserve_spend_many(p_calls jsonb, p_keys_locked boolean DEFAULT false)
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

    -- The short way, when every leader is plain (see migration 25).
    RETURN QUERY
    WITH every AS MATERIALIZED (
        SELECT x.*,
               CASE WHEN x.idempotency_key IS NULL THEN x.n
                    ELSE first_value(x.n) OVER (PARTITION BY x.key, x.idempotency_key ORDER BY x.n) END AS leader
        FROM reserve_calls(p_calls) x
    ), calls AS MATERIALIZED (
        SELECT * FROM every e WHERE e.n = e.leader
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
               now() + interval '1 day'
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
    -- A follower is answered as reserve_spend answers a call whose
    -- Idempotency-Key holds a pending reservation of the same key.
    SELECT e.n,
           CASE WHEN e.n = x.n THEN 'reserved'
                WHEN NOT (e.fingerprint = x.fingerprint) THEN 'idempotency_mismatch'
                ELSE 'in_flight' END,
           m.id, NULL::bigint, NULL::bigint, NULL::bigint, NULL::text,
           CASE WHEN e.n = x.n THEN NULL ELSE 'pending' END
    FROM every e
    JOIN calls x ON x.n = e.leader
    JOIN made m ON m.request_id = x.request
    ORDER BY e.n;
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
