-- The audit row's hash in one query instead of 22 function calls.
--
-- audit_row_hash encoded each field through audit_chain_field, a SQL
-- function PostgreSQL could not inline (its argument, an expression such as
-- to_char(...), is used three times in its body), so every audited call paid
-- 22 function calls: 0.24 ms of the 0.74 ms that settling and auditing one
-- call took in PostgreSQL. The encoding is unchanged (each field as text, a
-- 4-byte big-endian length and its UTF-8 bytes, or ff ff ff ff for NULL, in
-- table order), so every hash written before this migration still verifies.
-- PL/pgSQL rather than SQL: a session plans the query once and keeps the
-- plan, where a SQL function called from the trigger was planned again for
-- every row (0.17 ms).
CREATE OR REPLACE FUNCTION audit_row_hash(p_prev bytea, r audit_log) RETURNS bytea
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT sha256(p_prev || string_agg(
               CASE WHEN f.v IS NULL THEN '\xffffffff'::bytea
                    ELSE int4send(length(convert_to(f.v, 'UTF8'))) || convert_to(f.v, 'UTF8') END,
               ''::bytea ORDER BY f.n))
    FROM unnest(ARRAY[
        r.id::text,
        to_char(r.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        r.request_id::text,
        r.vault_key_id::text,
        r.key_prefix,
        r.method,
        r.path,
        r.stripe_customer,
        r.metadata_customer_id,
        r.billing_period,
        r.amount_cents::text,
        r.currency,
        r.idempotency_key,
        r.decision,
        r.upstream_status::text,
        r.stripe_object_id,
        r.error_code,
        r.latency_ms::text,
        r.metadata_billing_period,
        r.message,
        to_char(r.chain_day, 'YYYY-MM-DD'),
        r.chain_seq::text
    ]) WITH ORDINALITY AS f(v, n));
END
$$;
