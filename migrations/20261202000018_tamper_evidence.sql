-- Tamper evidence: an application that cannot rewrite its logs, and an audit
-- log whose rows are chained by hash so that a change made behind the
-- application's back (by a superuser, say) is found.

-- ------------------------------------------------- the application's role

-- Vaultcap runs as a member of `vaultcap_app`, a role that owns nothing: it
-- reads and writes the product's tables, but may only SELECT and INSERT the
-- audit log and the operator action log, and, owning no table, cannot ALTER,
-- DROP or disable a trigger on any. Migrations run as the owner. The role
-- belongs to the cluster, so every database on it shares it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'vaultcap_app') THEN
        BEGIN
            CREATE ROLE vaultcap_app NOLOGIN;
        EXCEPTION
            -- Another database's migration made it at the same moment.
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'the role vaultcap_app does not exist and % may not create it', current_user
                    USING HINT = 'As a superuser: CREATE ROLE vaultcap_app NOLOGIN; '
                                 'then GRANT vaultcap_app TO the role the application logs in as.';
        END;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public, tower_sessions TO vaultcap_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public, tower_sessions TO vaultcap_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO vaultcap_app;
-- Tables later migrations create get the same grants; a later log table
-- revokes what a log must not allow, as below.
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO vaultcap_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO vaultcap_app;

REVOKE UPDATE, DELETE, TRUNCATE ON audit_log, operator_actions FROM vaultcap_app;
-- The migrations' own bookkeeping is the owner's alone.
REVOKE ALL ON _sqlx_migrations FROM vaultcap_app;

-- ---------------------------------------------------- the audit hash chain

-- Every audit row carries `row_hash` = SHA-256(previous row's hash ‖ this
-- row's fields), chained per UTC day of writing (`chain_day`, numbered by
-- `chain_seq`), so writers of different days never wait on each other and a
-- day's chain can be checked on its own. The first row of a day follows the
-- day's genesis hash. The field encoding is `vaultcap audit verify`'s too
-- (server/src/audit_chain.rs): each field as text, as a 4-byte big-endian
-- length and its UTF-8 bytes, or ff ff ff ff for NULL.

-- The newest row of each day's chain. The application may read it (to
-- verify) but not change it: only the chaining trigger, running as the
-- owner, writes here.
CREATE TABLE audit_chain_heads (
    day  date   PRIMARY KEY,
    seq  bigint NOT NULL CHECK (seq >= 0),
    hash bytea  NOT NULL CHECK (length(hash) = 32)
);
REVOKE ALL ON audit_chain_heads FROM vaultcap_app;
GRANT SELECT ON audit_chain_heads TO vaultcap_app;

ALTER TABLE audit_log
    ADD COLUMN chain_day date,
    ADD COLUMN chain_seq bigint,
    ADD COLUMN row_hash  bytea;

CREATE FUNCTION audit_chain_field(v text) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v IS NULL THEN '\xffffffff'::bytea
                ELSE int4send(length(convert_to(v, 'UTF8'))) || convert_to(v, 'UTF8') END
$$;

CREATE FUNCTION audit_chain_genesis(p_day date) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT sha256(convert_to('vaultcap audit chain ' || to_char(p_day, 'YYYY-MM-DD'), 'UTF8'))
$$;

-- Every column of the row, in table order. A column added to audit_log must
-- be added here and in audit_chain.rs (a test compares the list with the
-- table's columns).
CREATE FUNCTION audit_row_hash(p_prev bytea, r audit_log) RETURNS bytea
LANGUAGE sql STABLE AS $$
    SELECT sha256(p_prev
        || audit_chain_field(r.id::text)
        || audit_chain_field(to_char(r.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
        || audit_chain_field(r.request_id::text)
        || audit_chain_field(r.vault_key_id::text)
        || audit_chain_field(r.key_prefix)
        || audit_chain_field(r.method)
        || audit_chain_field(r.path)
        || audit_chain_field(r.stripe_customer)
        || audit_chain_field(r.metadata_customer_id)
        || audit_chain_field(r.billing_period)
        || audit_chain_field(r.amount_cents::text)
        || audit_chain_field(r.currency)
        || audit_chain_field(r.idempotency_key)
        || audit_chain_field(r.decision)
        || audit_chain_field(r.upstream_status::text)
        || audit_chain_field(r.stripe_object_id)
        || audit_chain_field(r.error_code)
        || audit_chain_field(r.latency_ms::text)
        || audit_chain_field(r.metadata_billing_period)
        || audit_chain_field(r.message)
        || audit_chain_field(to_char(r.chain_day, 'YYYY-MM-DD'))
        || audit_chain_field(r.chain_seq::text))
$$;

-- Appends the new row to its day's chain. The first audit row a transaction
-- writes locks the day's head (the ledger writes its audit rows after the
-- money moved, so this lock is taken last) and holds it until commit, so a
-- chain never forks and never skips a number. Later rows of the same
-- transaction continue from a transaction-local setting instead of the
-- table: a statement writing 200,000 rows must not update one row 200,000
-- times. The head is written once per statement (below). Whatever chain
-- values an INSERT names are overwritten.
CREATE FUNCTION audit_log_chain() RETURNS trigger
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
    NEW.row_hash := audit_row_hash(v_prev, NEW);
    PERFORM set_config('vaultcap.audit_chain',
                       to_char(v_day, 'YYYY-MM-DD') || ' ' || NEW.chain_seq || ' ' || encode(NEW.row_hash, 'hex'), true);
    RETURN NEW;
END
$$;

-- The day's head, once per statement, from where its last row left it.
CREATE FUNCTION audit_log_chain_head() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    carried text := current_setting('vaultcap.audit_chain', true);
BEGIN
    IF carried IS NOT NULL AND carried <> '' THEN
        UPDATE audit_chain_heads
        SET seq = split_part(carried, ' ', 2)::bigint, hash = decode(split_part(carried, ' ', 3), 'hex')
        WHERE day = split_part(carried, ' ', 1)::date;
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION audit_log_chain_head() FROM PUBLIC;
REVOKE ALL ON FUNCTION audit_log_chain() FROM PUBLIC;

-- Rows written before this migration join the chain of the day they were
-- written, in the order they were written.
ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only;
DO $$
DECLARE
    r audit_log;
    day date;
    seq bigint := 0;
    prev bytea;
BEGIN
    FOR r IN SELECT * FROM audit_log ORDER BY (at AT TIME ZONE 'UTC')::date, id LOOP
        IF day IS DISTINCT FROM (r.at AT TIME ZONE 'UTC')::date THEN
            IF day IS NOT NULL THEN
                INSERT INTO audit_chain_heads (day, seq, hash) VALUES (day, seq, prev);
            END IF;
            day := (r.at AT TIME ZONE 'UTC')::date;
            seq := 0;
            prev := audit_chain_genesis(day);
        END IF;
        seq := seq + 1;
        r.chain_day := day;
        r.chain_seq := seq;
        prev := audit_row_hash(prev, r);
        UPDATE audit_log SET chain_day = day, chain_seq = seq, row_hash = prev WHERE id = r.id;
    END LOOP;
    IF day IS NOT NULL THEN
        INSERT INTO audit_chain_heads (day, seq, hash) VALUES (day, seq, prev);
    END IF;
END
$$;
ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only;

ALTER TABLE audit_log
    ALTER COLUMN chain_day SET NOT NULL,
    ALTER COLUMN chain_seq SET NOT NULL,
    ALTER COLUMN row_hash SET NOT NULL;
-- One row per place in a day's chain: the order `audit verify` walks.
CREATE UNIQUE INDEX audit_log_chain_idx ON audit_log (chain_day, chain_seq);

CREATE TRIGGER audit_log_chain
    BEFORE INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_chain();
CREATE TRIGGER audit_log_chain_head
    AFTER INSERT ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_chain_head();

-- What the last check of each day's chain found, as `vaultcap serve`'s
-- checker and `vaultcap audit verify` record it: verified up to
-- `verified_seq` (whose hash is `verified_hash`, where the next check
-- resumes), or broken at `broken_row_id` for the reason in `problem`.
CREATE TABLE audit_chain_checks (
    day           date        PRIMARY KEY,
    verified_seq  bigint      NOT NULL CHECK (verified_seq >= 0),
    verified_hash bytea       NOT NULL,
    verified_at   timestamptz,
    checked_at    timestamptz NOT NULL DEFAULT now(),
    broken_row_id bigint,
    problem       text
);
