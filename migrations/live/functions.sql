-- The live definition of every function in Vaultcap's schema, as
-- PostgreSQL prints it after all of migrations/ have run (generated, in
-- name order). Read the rules here; change them with a new migration,
-- then rewrite this file: VAULTCAP_BLESS=1 cargo test -p server --test http
-- schema::the_live_functions. A test fails while the two differ.

CREATE OR REPLACE FUNCTION public.audit_abandoned(p_reservation bigint)
 RETURNS void
 LANGUAGE sql
AS $function$
    INSERT INTO audit_log (at, request_id, vault_key_id, key_prefix, method, path, stripe_customer,
        metadata_customer_id, billing_period, amount_cents, currency, idempotency_key, decision, message)
    SELECT r.created_at, r.request_id, r.vault_key_id, k.secret_prefix, r.method, r.path, r.stripe_customer,
           r.metadata_customer_id, r.billing_period, r.amount_cents, r.currency, r.idempotency_key,
           'outcome_unknown', 'the proxy stopped before the call settled; its retry or Stripe decides'
    FROM reservations r JOIN vault_keys k ON k.id = r.vault_key_id
    WHERE r.id = p_reservation
$function$;

CREATE OR REPLACE FUNCTION public.audit_chain_field(v text)
 RETURNS bytea
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN v IS NULL THEN '\xffffffff'::bytea
                ELSE int4send(length(convert_to(v, 'UTF8'))) || convert_to(v, 'UTF8') END
$function$;

CREATE OR REPLACE FUNCTION public.audit_chain_genesis(p_day date)
 RETURNS bytea
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT sha256(convert_to('vaultcap audit chain ' || to_char(p_day, 'YYYY-MM-DD'), 'UTF8'))
$function$;

CREATE OR REPLACE FUNCTION public.audit_log_add_partitions(p_ahead integer)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.audit_log_chain()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.audit_log_chain_head()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.audit_row_hash(p_prev bytea, r audit_log)
 RETURNS bytea
 LANGUAGE plpgsql
 STABLE
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.count_audited_calls()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    -- Sorted, so two writers lock the same rows in the same order.
    INSERT INTO call_stats AS s (vault_key_id, hour, decision, calls, spent_cents)
    SELECT vault_key_id, date_trunc('hour', at, 'UTC'), decision, count(*),
           coalesce(sum(amount_cents) FILTER (
               WHERE decision = 'allowed' AND upstream_status BETWEEN 200 AND 299), 0)
    FROM appended
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (vault_key_id, hour, decision) DO UPDATE
        SET calls = s.calls + excluded.calls, spent_cents = s.spent_cents + excluded.spent_cents;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.forbid_rewrite()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', pg_partition_root(TG_RELID)::regclass, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$function$;

CREATE OR REPLACE FUNCTION public.guard_four_eyes_decision()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    kind text := TG_ARGV[0];
    what text := replace(TG_ARGV[0], '_', ' ') || ' request';
    decision_fields text[] := ARRAY['decision', 'decided_at', 'decided_by', 'decision_note',
                                    'follow_on_key_id', 'vault_key_id', 'expires_at'];
BEGIN
    IF to_jsonb(NEW) - decision_fields IS DISTINCT FROM to_jsonb(OLD) - decision_fields
       OR NEW.expires_at > OLD.expires_at THEN
        RAISE EXCEPTION '% %: only its decision may be written', what, OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = kind || '_unchanged';
    END IF;
    IF OLD.decision IS NOT NULL THEN
        RAISE EXCEPTION '% % was already %', what, OLD.id, OLD.decision
            USING ERRCODE = 'check_violation', CONSTRAINT = kind || '_decided_once';
    END IF;
    IF NEW.decision IS NULL THEN
        RETURN NEW;
    END IF;
    IF OLD.expires_at <= now() THEN
        RAISE EXCEPTION '% % expired at %', what, OLD.id, OLD.expires_at
            USING ERRCODE = 'check_violation', CONSTRAINT = kind || '_not_expired';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM operators o
                   WHERE o.id = NEW.decided_by AND o.disabled_at IS NULL
                     AND o.role IN ('approver', 'admin')) THEN
        RAISE EXCEPTION 'operator % may not decide a %', NEW.decided_by, what
            USING ERRCODE = 'check_violation', CONSTRAINT = kind || '_decided_by_approver';
    END IF;
    IF NEW.decided_by = OLD.requested_by OR EXISTS (
           SELECT 1 FROM api_tokens t
           WHERE t.id = OLD.requested_by_token AND t.created_by = NEW.decided_by) THEN
        RAISE EXCEPTION 'operator % asked for % %, or made the API token that did', NEW.decided_by, what, OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = kind || '_four_eyes';
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION public.guard_period_close_decision()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    open_findings bigint;
    undecided_calls bigint;
BEGIN
    IF OLD.signed_at IS NOT NULL THEN
        RAISE EXCEPTION 'billing period % was already signed off', OLD.billing_period
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_signed_once';
    END IF;
    IF OLD.withdrawn_at IS NOT NULL THEN
        RAISE EXCEPTION 'this close of % was withdrawn', OLD.billing_period
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_withdrawn_once';
    END IF;
    IF (NEW.billing_period, NEW.prepared_at, NEW.prepared_by, NEW.note)
       IS DISTINCT FROM (OLD.billing_period, OLD.prepared_at, OLD.prepared_by, OLD.note) THEN
        RAISE EXCEPTION 'a prepared close is not edited: withdraw it and prepare again'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_prepared_once';
    END IF;
    IF NEW.withdrawn_at IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM operators o
            WHERE o.id = NEW.withdrawn_by AND o.disabled_at IS NULL
              AND o.role IN ('operator', 'approver', 'admin')) THEN
        RAISE EXCEPTION 'operator % may not withdraw a period close', NEW.withdrawn_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_withdrawn_by_operator';
    END IF;
    IF NEW.signed_at IS NULL THEN
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM operators o
                   WHERE o.id = NEW.signed_by AND o.disabled_at IS NULL
                     AND o.role IN ('approver', 'admin')) THEN
        RAISE EXCEPTION 'operator % may not sign off a period', NEW.signed_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_signed_by_approver';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM operators o
                   WHERE o.id = NEW.prepared_by AND o.disabled_at IS NULL
                     AND o.role IN ('operator', 'approver', 'admin')) THEN
        RAISE EXCEPTION 'the preparer of this close is disabled or no longer an operator: withdraw it and prepare again'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_preparer_active';
    END IF;
    PERFORM 1 FROM vault_keys WHERE billing_period = NEW.billing_period ORDER BY id FOR UPDATE;
    SELECT count(*) INTO open_findings FROM reconciliation_findings
     WHERE billing_period = NEW.billing_period AND resolved_at IS NULL;
    IF open_findings > 0 THEN
        RAISE EXCEPTION '% finding(s) of % are open', open_findings, NEW.billing_period
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_findings_resolved';
    END IF;
    SELECT count(*) INTO undecided_calls FROM reservations r JOIN vault_keys k ON k.id = r.vault_key_id
     WHERE k.billing_period = NEW.billing_period AND r.state IN ('pending', 'outcome_unknown');
    IF undecided_calls > 0 THEN
        RAISE EXCEPTION '% call(s) of % are in flight or of unknown outcome', undecided_calls, NEW.billing_period
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_calls_decided';
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION public.guard_period_close_prepare()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF num_nonnulls(NEW.signed_at, NEW.signed_by, NEW.report, NEW.report_sha256,
                    NEW.withdrawn_at, NEW.withdrawn_by) > 0 THEN
        RAISE EXCEPTION 'a close is prepared first; it is signed off or withdrawn later'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_prepared_first';
    END IF;
    NEW.prepared_at := now();
    IF NOT EXISTS (SELECT 1 FROM operators o
                   WHERE o.id = NEW.prepared_by AND o.disabled_at IS NULL
                     AND o.role IN ('operator', 'approver', 'admin')) THEN
        RAISE EXCEPTION 'operator % may not prepare a period close', NEW.prepared_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_prepared_by_operator';
    END IF;
    IF NEW.billing_period >= to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM') THEN
        RAISE EXCEPTION 'billing period % has not ended yet', NEW.billing_period
            USING ERRCODE = 'check_violation', CONSTRAINT = 'period_close_period_ended';
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION public.intent_metered(p_key bigint, p_intent text)
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $function$
    SELECT sum(amount_cents - released_cents)
    FROM reservations
    WHERE vault_key_id = p_key AND payment_intent = p_intent
      AND state IN ('pending', 'settled', 'outcome_unknown')
$function$;

CREATE OR REPLACE FUNCTION public.queue_alert_notification()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO alert_notifications (alert_id, event) VALUES (NEW.id, 'alert.raised');
    PERFORM pg_notify('vaultcap_alerts', NEW.id::text);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_cap_increase_notification()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO alert_notifications (cap_increase_request_id, event)
    VALUES (NEW.id, CASE TG_OP WHEN 'INSERT' THEN 'cap_increase.requested' ELSE 'cap_increase.decided' END);
    PERFORM pg_notify('vaultcap_alerts', 'cap_increase:' || NEW.id);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_period_close_notification()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO alert_notifications (period_close_id, event)
    VALUES (NEW.id, CASE TG_OP WHEN 'INSERT' THEN 'period.prepared' ELSE 'period.signed_off' END);
    PERFORM pg_notify('vaultcap_alerts', 'period_close:' || NEW.id);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_unmetered_notification()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO alert_notifications (finding_id, event) VALUES (NEW.id, 'finding.unmetered');
    PERFORM pg_notify('vaultcap_alerts', 'finding:' || NEW.id);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.record_and_reserve(p_records jsonb, p_reserves jsonb)
 RETURNS TABLE(call_position bigint, outcome text, reservation_id bigint, cap bigint, spent bigint, reserved bigint, earlier_charge text, earlier_state text)
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.record_calls(p_calls jsonb, p_keys_locked boolean DEFAULT false)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.recorded_calls(p_calls jsonb)
 RETURNS TABLE(n bigint, vault_key_id bigint, reservation_id bigint, settlement text, stripe_object_id text, duplicate_of text, billing_period text, metadata_customer_id text, currency text, amount_cents bigint, idempotency_key text, release jsonb)
 LANGUAGE plpgsql
 IMMUTABLE ROWS 8
AS $function$
BEGIN
    RETURN QUERY
    SELECT x.n, x.vault_key_id, x.reservation_id, x.settlement, x.stripe_object_id, x.duplicate_of,
           x.billing_period, x.metadata_customer_id, x.currency, x.amount_cents, x.idempotency_key, x.release
    FROM ROWS FROM (jsonb_to_recordset(p_calls) AS (
        vault_key_id bigint, reservation_id bigint, settlement text, stripe_object_id text,
        duplicate_of text, billing_period text, metadata_customer_id text, currency text,
        amount_cents bigint, idempotency_key text, release jsonb))
        WITH ORDINALITY AS x(vault_key_id, reservation_id, settlement, stripe_object_id, duplicate_of,
                             billing_period, metadata_customer_id, currency, amount_cents,
                             idempotency_key, release, n);
END
$function$;

CREATE OR REPLACE FUNCTION public.refuse_key_for_signed_period()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM 1 FROM period_closes
     WHERE billing_period = NEW.billing_period AND withdrawn_at IS NULL FOR SHARE;
    IF EXISTS (SELECT 1 FROM period_closes
               WHERE billing_period = NEW.billing_period AND signed_at IS NOT NULL) THEN
        RAISE EXCEPTION 'billing period % is signed off', NEW.billing_period
            USING ERRCODE = 'check_violation', CONSTRAINT = 'vault_key_period_open';
    END IF;
    RETURN NEW;
END
$function$;

CREATE OR REPLACE FUNCTION public.release_intent(p_key bigint, p_intent text, p_keep bigint)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    r record;
    surplus bigint;
    given_back bigint := 0;
    part bigint;
BEGIN
    PERFORM 1 FROM vault_keys WHERE id = p_key FOR NO KEY UPDATE;
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
$function$;

CREATE OR REPLACE FUNCTION public.reserve_calls(p_calls jsonb)
 RETURNS TABLE(n bigint, key bigint, request uuid, idempotency_key text, fingerprint bytea, amount bigint, method text, path text, stripe_customer text, metadata_customer_id text, billing_period text, currency text, payment_intent text, request_body text, stripe_version text, lease_secs integer)
 LANGUAGE plpgsql
 IMMUTABLE ROWS 8
AS $function$
BEGIN
    RETURN QUERY
    SELECT x.n, x.key, x.request, x.idempotency_key, decode(x.fingerprint, 'hex'), x.amount, x.method, x.path,
           x.stripe_customer, x.metadata_customer_id, x.billing_period, x.currency, x.payment_intent,
           x.request_body, x.stripe_version, x.lease_secs
    FROM ROWS FROM (jsonb_to_recordset(p_calls) AS (
        key bigint, request uuid, idempotency_key text, fingerprint text, amount bigint, method text,
        path text, stripe_customer text, metadata_customer_id text, billing_period text, currency text,
        payment_intent text, request_body text, stripe_version text, lease_secs integer))
        WITH ORDINALITY AS x(key, request, idempotency_key, fingerprint, amount, method, path,
                             stripe_customer, metadata_customer_id, billing_period, currency,
                             payment_intent, request_body, stripe_version, lease_secs, n);
END
$function$;

CREATE OR REPLACE FUNCTION public.reserve_spend(p_key bigint, p_request uuid, p_idempotency_key text, p_fingerprint bytea, p_amount bigint, p_method text, p_path text, p_stripe_customer text, p_metadata_customer_id text, p_billing_period text, p_currency text, p_payment_intent text, p_request_body text, p_stripe_version text, p_lease_secs integer)
 RETURNS TABLE(outcome text, reservation_id bigint, cap bigint, spent bigint, reserved bigint, earlier_charge text, earlier_state text)
 LANGUAGE plpgsql
AS $function$
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
        INTO k FROM vault_keys v WHERE v.id = p_key FOR NO KEY UPDATE;
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
$function$;

CREATE OR REPLACE FUNCTION public.reserve_spend_many(p_calls jsonb, p_keys_locked boolean DEFAULT false)
 RETURNS TABLE(call_position bigint, outcome text, reservation_id bigint, cap bigint, spent bigint, reserved bigint, earlier_charge text, earlier_state text)
 LANGUAGE plpgsql
AS $function$
DECLARE
    c record;
BEGIN
    -- One call: by its own rules, as a batch that is not plain goes.
    IF jsonb_array_length(p_calls) > 1 THEN
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
    END IF;

    -- One call, or not plain (or no calls): one call at a time, in key order.
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
$function$;

CREATE OR REPLACE FUNCTION public.revoke_signed_period_keys()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE vault_keys
       SET revoked_at = NEW.signed_at, revoked_by = NEW.signed_by,
           revoke_reason = 'billing period ' || NEW.billing_period || ' signed off'
     WHERE billing_period = NEW.billing_period AND revoked_at IS NULL;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION public.settle_calls(p_calls jsonb, p_keys_locked boolean DEFAULT false)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION public.settle_unknown_spend(p_reservation bigint, p_state text, p_charge text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    key_id bigint;
    amount bigint;
BEGIN
    IF p_state NOT IN ('settled', 'released') THEN
        RAISE EXCEPTION 'an unknown outcome is settled or released, not %', p_state;
    END IF;
    PERFORM 1 FROM vault_keys
    WHERE id = (SELECT vault_key_id FROM reservations WHERE id = p_reservation) FOR NO KEY UPDATE;
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
$function$;
