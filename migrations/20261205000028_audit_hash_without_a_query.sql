-- The audit row's hash without a query per row (issue 20).
--
-- audit_row_hash ran a query for every audited call (unnest the fields,
-- encode each, string_agg them in order): an executor started and stopped
-- per row, about 0.08 ms of PostgreSQL's CPU per row, the largest single
-- part of appending an audit row (5 rows: 1.11 ms before, 0.67-0.76 ms
-- after, measured on the backend with pgbench). The fields are now encoded
-- in a PL/pgSQL loop over the same array, whose statements PL/pgSQL
-- evaluates as simple expressions, without the executor. The encoding is
-- unchanged (each field as text, a 4-byte big-endian length and its UTF-8
-- bytes, or ff ff ff ff for NULL, in table order; see audit_chain.rs), so
-- every hash written before this migration still verifies.
CREATE OR REPLACE FUNCTION audit_row_hash(p_prev bytea, r audit_log) RETURNS bytea
LANGUAGE plpgsql STABLE AS $$
DECLARE
    fields text[] := ARRAY[
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
    ];
    field text;
    utf8 bytea;
    encoded bytea := p_prev;
BEGIN
    FOREACH field IN ARRAY fields LOOP
        IF field IS NULL THEN
            encoded := encoded || '\xffffffff'::bytea;
        ELSE
            utf8 := convert_to(field, 'UTF8');
            encoded := encoded || int4send(length(utf8)) || utf8;
        END IF;
    END LOOP;
    RETURN sha256(encoded);
END
$$;
