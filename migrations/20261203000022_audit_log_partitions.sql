-- The audit log, partitioned by the month its rows were written (their
-- chain day), so that a month no longer kept can be archived and dropped
-- whole instead of deleted row by row, and so that no index grows forever.
--
-- The table as it stands becomes the first partition, `audit_log_history`,
-- holding every month up to and including this one: attached, not copied,
-- so a large log migrates in the time it takes to check it. Vaultcap makes
-- the later months' partitions ahead of time (audit_log_add_partitions).
--
-- The chain day is the partition key, so it must be known before the row is
-- routed: it defaults to the UTC day of writing, the day the chaining
-- trigger gives it (a row naming another day is refused by PostgreSQL when
-- the trigger moves it across a partition, or corrected within one).

-- The old table: its triggers move to the parent (they would otherwise run
-- twice for its rows), and its identity becomes a sequence the parent owns
-- (partitioned tables in PostgreSQL 15 cannot have identity columns).
ALTER TABLE audit_log RENAME TO audit_log_history;
DROP TRIGGER audit_log_append_only ON audit_log_history;
DROP TRIGGER audit_log_no_truncate ON audit_log_history;
DROP TRIGGER audit_log_chain ON audit_log_history;
DROP TRIGGER audit_log_chain_head ON audit_log_history;
DROP TRIGGER audit_log_count_calls ON audit_log_history;
ALTER TABLE audit_log_history ALTER COLUMN id DROP IDENTITY;
-- A partitioned table's key must hold its partition key: (id, chain_day),
-- built for these rows when they are attached.
ALTER TABLE audit_log_history DROP CONSTRAINT audit_log_pkey;
-- Its indexes keep serving its rows, under names of their own; those the
-- parent declares below are attached to them, not built again.
ALTER INDEX audit_log_at_idx RENAME TO audit_log_history_at_idx;
ALTER INDEX audit_log_key_idx RENAME TO audit_log_history_key_idx;
ALTER INDEX audit_log_customer_idx RENAME TO audit_log_history_customer_idx;
ALTER INDEX audit_log_metadata_customer_idx RENAME TO audit_log_history_metadata_customer_idx;
ALTER INDEX audit_log_idempotency_idx RENAME TO audit_log_history_idempotency_idx;
ALTER INDEX audit_log_object_idx RENAME TO audit_log_history_object_idx;
ALTER INDEX audit_log_refused_idx RENAME TO audit_log_history_refused_idx;
ALTER INDEX audit_log_period_idx RENAME TO audit_log_history_period_idx;
ALTER INDEX audit_log_chain_idx RENAME TO audit_log_history_chain_idx;
DROP FUNCTION audit_row_hash(bytea, audit_log_history);

CREATE SEQUENCE audit_log_id_seq AS bigint;
SELECT setval('audit_log_id_seq', coalesce(max(id), 0) + 1, false) FROM audit_log_history;
REVOKE ALL ON SEQUENCE audit_log_id_seq FROM vaultcap_app;
GRANT USAGE ON SEQUENCE audit_log_id_seq TO vaultcap_app;

CREATE TABLE audit_log (LIKE audit_log_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (chain_day);
ALTER TABLE audit_log
    ALTER COLUMN id SET DEFAULT nextval('audit_log_id_seq'),
    ALTER COLUMN chain_day SET DEFAULT (now() AT TIME ZONE 'UTC')::date,
    ADD PRIMARY KEY (id, chain_day),
    ADD CONSTRAINT audit_log_vault_key_id_fkey FOREIGN KEY (vault_key_id) REFERENCES vault_keys (id);
ALTER SEQUENCE audit_log_id_seq OWNED BY audit_log.id;
-- The same indexes as before, now one per partition.
CREATE INDEX audit_log_at_idx ON audit_log (at DESC, id DESC);
CREATE INDEX audit_log_key_idx ON audit_log (vault_key_id, at DESC, id DESC);
CREATE INDEX audit_log_customer_idx ON audit_log (stripe_customer, at DESC, id DESC)
    WHERE stripe_customer IS NOT NULL;
CREATE INDEX audit_log_metadata_customer_idx ON audit_log (metadata_customer_id, at DESC, id DESC)
    WHERE metadata_customer_id IS NOT NULL;
CREATE INDEX audit_log_idempotency_idx ON audit_log (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX audit_log_object_idx ON audit_log (stripe_object_id)
    WHERE stripe_object_id IS NOT NULL;
CREATE INDEX audit_log_refused_idx ON audit_log (decision, at DESC, id DESC)
    WHERE decision <> 'allowed';
CREATE INDEX audit_log_period_idx ON audit_log (billing_period, at DESC, id DESC)
    WHERE billing_period IS NOT NULL;
CREATE UNIQUE INDEX audit_log_chain_idx ON audit_log (chain_day, chain_seq);

-- The application reads, and appends a call's fields; the log's own columns
-- (the id from the sequence, the chain values from the chaining trigger) it
-- may not name, as GENERATED ALWAYS refused an id before. A column added to
-- the calls must be granted here too. It writes through the parent only:
-- the partitions it may read.
REVOKE ALL ON audit_log FROM vaultcap_app;
GRANT SELECT ON audit_log TO vaultcap_app;
GRANT INSERT (at, request_id, vault_key_id, key_prefix, method, path, stripe_customer,
              metadata_customer_id, billing_period, amount_cents, currency, idempotency_key,
              decision, upstream_status, stripe_object_id, error_code, latency_ms,
              metadata_billing_period, message)
    ON audit_log TO vaultcap_app;
REVOKE ALL ON audit_log_history FROM vaultcap_app;
GRANT SELECT ON audit_log_history TO vaultcap_app;

-- The old rows' partition ends with the month of its last row (before this
-- month when it has none): from the next month on, each month has its own.
DO $$
DECLARE
    this_month date := date_trunc('month', now() AT TIME ZONE 'UTC')::date;
    last_day date := (SELECT max(chain_day) FROM audit_log_history);
BEGIN
    EXECUTE format('ALTER TABLE audit_log ATTACH PARTITION audit_log_history FOR VALUES FROM (MINVALUE) TO (%L)',
                   (date_trunc('month', coalesce(last_day, this_month - 1)) + interval '1 month')::date);
END
$$;

-- A refusal names the log, not the partition the row is in.
CREATE OR REPLACE FUNCTION forbid_rewrite() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', pg_partition_root(TG_RELID)::regclass, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- As before (migration 20), for the parent's row type.
CREATE FUNCTION audit_row_hash(p_prev bytea, r audit_log) RETURNS bytea
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

-- As before. Row triggers on the parent run on the partition the row was
-- routed to, whose row type is the partition's: the hash takes it as the
-- parent's.
CREATE OR REPLACE FUNCTION audit_log_chain() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_day date := (now() AT TIME ZONE 'UTC')::date;
    carried text := current_setting('vaultcap.audit_chain', true);
    v_seq bigint;
    v_prev bytea;
BEGIN
    IF carried IS NOT NULL AND carried <> '' THEN
        -- 'day seq hash', written by this transaction's previous row.
        v_seq := split_part(carried, ' ', 2)::bigint;
        v_prev := decode(split_part(carried, ' ', 3), 'hex');
    ELSE
        SELECT h.seq, h.hash INTO v_seq, v_prev FROM audit_chain_heads h WHERE h.day = v_day FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO audit_chain_heads AS h (day, seq, hash)
            VALUES (v_day, 0, audit_chain_genesis(v_day))
            ON CONFLICT ON CONSTRAINT audit_chain_heads_pkey DO NOTHING;
            SELECT h.seq, h.hash INTO v_seq, v_prev FROM audit_chain_heads h WHERE h.day = v_day FOR UPDATE;
        END IF;
    END IF;
    NEW.chain_day := v_day;
    NEW.chain_seq := v_seq + 1;
    NEW.row_hash := audit_row_hash(v_prev, ROW(NEW.*)::audit_log);
    PERFORM set_config('vaultcap.audit_chain',
                       to_char(v_day, 'YYYY-MM-DD') || ' ' || NEW.chain_seq || ' ' || encode(NEW.row_hash, 'hex'), true);
    RETURN NEW;
END
$$;

CREATE TRIGGER audit_log_append_only
    BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION forbid_rewrite();
CREATE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION forbid_rewrite();
CREATE TRIGGER audit_log_chain
    BEFORE INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_chain();
CREATE TRIGGER audit_log_chain_head
    AFTER INSERT ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_chain_head();
CREATE TRIGGER audit_log_count_calls
    AFTER INSERT ON audit_log
    REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION count_audited_calls();

-- Makes the partitions for this month and the next `p_ahead` months that do
-- not exist yet (a month inside audit_log_history has one); returns how
-- many it made. The application calls it at start and hourly; it may not
-- create tables itself, so this runs as the schema's owner. The application
-- reads a partition and appends to it through the parent only.
CREATE FUNCTION audit_log_add_partitions(p_ahead integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    month date := date_trunc('month', now() AT TIME ZONE 'UTC')::date;
    made integer := 0;
    name text;
BEGIN
    FOR i IN 0 .. least(greatest(p_ahead, 0), 24) LOOP
        name := 'audit_log_' || to_char(month, 'YYYY_MM');
        BEGIN
            EXECUTE format('CREATE TABLE %I PARTITION OF audit_log FOR VALUES FROM (%L) TO (%L)',
                           name, month, (month + interval '1 month')::date);
            EXECUTE format('REVOKE ALL ON %I FROM vaultcap_app', name);
            EXECUTE format('GRANT SELECT ON %I TO vaultcap_app', name);
            made := made + 1;
        EXCEPTION
            -- Covered by audit_log_history, or made by another instance.
            WHEN invalid_object_definition OR duplicate_table THEN NULL;
        END;
        month := (month + interval '1 month')::date;
    END LOOP;
    RETURN made;
END
$$;
REVOKE ALL ON FUNCTION audit_log_add_partitions(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION audit_log_add_partitions(integer) TO vaultcap_app;

SELECT audit_log_add_partitions(3);

-- Months archived and dropped (server/src/audit_archive.rs): what the file
-- held and its checksum, so a restore can be checked against it. Written by
-- the owner as it drops a partition; the application reads it.
CREATE TABLE audit_archives (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition   text        NOT NULL,
    first_day   date,
    last_day    date,
    rows        bigint      NOT NULL CHECK (rows >= 0),
    sha256      text        NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    file        text        NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON audit_archives FROM vaultcap_app;
GRANT SELECT ON audit_archives TO vaultcap_app;
