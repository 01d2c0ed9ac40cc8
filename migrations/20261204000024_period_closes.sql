-- Period close: finance's word that a billing period is done. An operator
-- prepares the close; a different approver signs it off. PostgreSQL holds
-- the rules, like it does for cap increases: no path (console, a script
-- with SQL access) signs its own close, signs twice, signs while findings
-- are open or calls are of unknown outcome, changes a signed report, or
-- issues a key for a signed-off period.

CREATE TABLE period_closes (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    billing_period text        NOT NULL CHECK (billing_period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    prepared_at    timestamptz NOT NULL DEFAULT now(),
    prepared_by    bigint      NOT NULL REFERENCES operators (id),
    note           text CHECK (length(note) <= 2000),
    -- A prepared close can be withdrawn (the period is open again) until it
    -- is signed; preparing again makes a new row.
    withdrawn_at   timestamptz,
    withdrawn_by   bigint REFERENCES operators (id),
    signed_at      timestamptz,
    signed_by      bigint REFERENCES operators (id),
    -- The report as signed: its exact bytes (JSON) and their SHA-256, so
    -- anyone can check the frozen report against the hash.
    report         text,
    report_sha256  text,
    CONSTRAINT period_close_four_eyes CHECK (signed_by <> prepared_by),
    CONSTRAINT period_close_signed_complete CHECK (
        (signed_at IS NULL) = (signed_by IS NULL) AND (signed_at IS NULL) = (report IS NULL)),
    CONSTRAINT period_close_report_hash CHECK (
        report_sha256 IS NOT DISTINCT FROM encode(sha256(convert_to(report, 'UTF8')), 'hex')),
    CONSTRAINT period_close_withdrawn_complete CHECK ((withdrawn_at IS NULL) = (withdrawn_by IS NULL)),
    CONSTRAINT period_close_signed_or_withdrawn CHECK (signed_at IS NULL OR withdrawn_at IS NULL)
);
-- One live close per period: preparing twice at once makes one.
CREATE UNIQUE INDEX period_closes_one_live ON period_closes (billing_period)
    WHERE withdrawn_at IS NULL;

-- Preparing needs an active operator (or approver, admin) and a period
-- that has ended. A close starts prepared, now: never already signed or
-- withdrawn (that would skip every rule of the sign-off), never backdated.
CREATE FUNCTION guard_period_close_prepare() RETURNS trigger
LANGUAGE plpgsql AS $$
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
$$;
CREATE TRIGGER period_closes_prepare
    BEFORE INSERT ON period_closes
    FOR EACH ROW EXECUTE FUNCTION guard_period_close_prepare();

-- A close is signed or withdrawn once; then it never changes. Withdrawing
-- needs an active operator (or approver, admin). Signing needs an active
-- approver, a preparer still active, no open finding in the period, and no
-- call of the period's keys still in flight or of unknown outcome. The row
-- lock makes two sign-offs at once one: the second finds the first's row.
-- The period's keys are locked before the calls are counted: a call being
-- reserved holds its key's lock until it commits, so it is counted (and
-- once the keys are revoked, no call is reserved on them again).
CREATE FUNCTION guard_period_close_decision() RETURNS trigger
LANGUAGE plpgsql AS $$
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
$$;
CREATE TRIGGER period_closes_decide_once
    BEFORE UPDATE ON period_closes
    FOR EACH ROW EXECUTE FUNCTION guard_period_close_decision();
CREATE TRIGGER period_closes_no_delete
    BEFORE DELETE ON period_closes
    FOR EACH ROW EXECUTE FUNCTION forbid_rewrite();
REVOKE DELETE, TRUNCATE ON period_closes FROM vaultcap_app;

-- Signing off revokes every key of the period still live, in the same
-- transaction: nothing more is charged against a closed period.
CREATE FUNCTION revoke_signed_period_keys() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE vault_keys
       SET revoked_at = NEW.signed_at, revoked_by = NEW.signed_by,
           revoke_reason = 'billing period ' || NEW.billing_period || ' signed off'
     WHERE billing_period = NEW.billing_period AND revoked_at IS NULL;
    RETURN NULL;
END
$$;
CREATE TRIGGER period_closes_revoke_keys
    AFTER UPDATE OF signed_at ON period_closes
    FOR EACH ROW WHEN (OLD.signed_at IS NULL AND NEW.signed_at IS NOT NULL)
    EXECUTE FUNCTION revoke_signed_period_keys();

-- No new key for a period that is signed off. The live close is locked
-- first: a key made while the period is being signed off waits for the
-- sign-off and is then refused; one made before it is locked and revoked
-- by it.
CREATE FUNCTION refuse_key_for_signed_period() RETURNS trigger
LANGUAGE plpgsql AS $$
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
$$;
CREATE TRIGGER vault_keys_period_open
    BEFORE INSERT ON vault_keys
    FOR EACH ROW EXECUTE FUNCTION refuse_key_for_signed_period();

-- The notification webhooks hear when a close is prepared and signed off.
ALTER TABLE alert_notifications
    ADD COLUMN period_close_id bigint REFERENCES period_closes (id),
    DROP CONSTRAINT alert_notifications_event_check,
    ADD CONSTRAINT alert_notifications_event_check
        CHECK (event IN ('alert.raised', 'cap_increase.requested', 'cap_increase.decided',
                         'finding.unmetered', 'period.prepared', 'period.signed_off')),
    DROP CONSTRAINT alert_notifications_one_subject,
    ADD CONSTRAINT alert_notifications_one_subject
        CHECK (num_nonnulls(alert_id, cap_increase_request_id, finding_id, period_close_id) = 1);

CREATE FUNCTION queue_period_close_notification() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO alert_notifications (period_close_id, event)
    VALUES (NEW.id, CASE TG_OP WHEN 'INSERT' THEN 'period.prepared' ELSE 'period.signed_off' END);
    PERFORM pg_notify('vaultcap_alerts', 'period_close:' || NEW.id);
    RETURN NULL;
END
$$;
CREATE TRIGGER period_closes_notify_prepared
    AFTER INSERT ON period_closes
    FOR EACH ROW EXECUTE FUNCTION queue_period_close_notification();
CREATE TRIGGER period_closes_notify_signed
    AFTER UPDATE OF signed_at ON period_closes
    FOR EACH ROW WHEN (OLD.signed_at IS NULL AND NEW.signed_at IS NOT NULL)
    EXECUTE FUNCTION queue_period_close_notification();
