-- What the ledger's write would cost without four of its parts: an upper
-- bound on what redesigning them could save, NEVER a migration (it drops
-- the audit log's hash chain and the console's audit indexes, and leaves
-- every reservation pending). For `scripts/ledger-writes` as it is, and for
-- `vaultcap bench proxy` copied into migrations/ for one release build (and
-- removed again): with reservations leased for a day, so that no sweep
-- runs during the bench, and its books check fails, as no reservation
-- settles. The lease is set by a trigger (a few microseconds a
-- reservation, counted against this bound).

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

-- Leases of a day (see above), set as each reservation is written.
CREATE FUNCTION lease_for_a_day() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.claimed_until := now() + interval '1 day';
    RETURN NEW;
END
$$;
CREATE TRIGGER reservations_lease_for_a_day BEFORE INSERT ON reservations
    FOR EACH ROW EXECUTE FUNCTION lease_for_a_day();
