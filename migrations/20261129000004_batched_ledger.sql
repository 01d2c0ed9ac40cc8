-- The proxy's ledger writes, many calls per statement: whatever calls are
-- waiting when the database is free are reserved (or settled and audited)
-- together, in one round trip and one commit. Each call is still decided by
-- reserve_spend / settle_spend, one after the other, so the rules and their
-- atomicity are those of the single-call functions.
--
-- Calls are taken in ascending key order (arrival order within a key), so
-- two batches touching the same keys lock them in the same order and never
-- deadlock.

-- p_calls: a JSON array of objects with the parameters of reserve_spend
-- (key, request, idempotency_key, amount, method, path, stripe_customer,
-- metadata_customer_id, billing_period, currency). Returns one row per call,
-- `call_position` being its 1-based place in the array.
CREATE FUNCTION reserve_spend_many(p_calls jsonb)
RETURNS TABLE (call_position bigint, outcome text, reservation_id bigint, cap bigint, spent bigint, reserved bigint)
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
            SELECT c.n, r.outcome, r.reservation_id, r.cap, r.spent, r.reserved
            FROM reserve_spend(c.key, c.request, c.idempotency_key, c.amount, c.method, c.path,
                               c.stripe_customer, c.metadata_customer_id, c.billing_period, c.currency) r;
    END LOOP;
END
$$;

-- p_calls: a JSON array of audit rows (audit_log's column names), each with
-- `reservation_id` and `settlement` (settled / released / outcome_unknown)
-- when the call holds a reservation. Settles those reservations and appends
-- every row to the audit log.
CREATE FUNCTION record_calls(p_calls jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT x.reservation_id, x.settlement
        FROM jsonb_to_recordset(p_calls) AS x(vault_key_id bigint, reservation_id bigint, settlement text)
        WHERE x.reservation_id IS NOT NULL
        ORDER BY x.vault_key_id, x.reservation_id
    LOOP
        PERFORM settle_spend(c.reservation_id, c.settlement);
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
