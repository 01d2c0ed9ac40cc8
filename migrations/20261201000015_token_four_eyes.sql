-- One guard for every four-eyes decision (cap increases here, new keys
-- beyond policy next): decided once, by an active approver, before the
-- request expires, and never by whoever asked, nor by the admin who made
-- the API token that asked (otherwise one person could make a token, ask
-- with it and approve; the table's CHECK cannot see through the token).
-- A request's own columns never change: only its decision is written (and
-- its expiry brought forward), so nobody can rewrite who asked or for what
-- before deciding it, or keep it open longer.
-- The trigger's argument names the kind of request: its constraint names
-- start with it (`cap_increase_four_eyes`, …).
CREATE FUNCTION guard_four_eyes_decision() RETURNS trigger
LANGUAGE plpgsql AS $$
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
$$;

DROP TRIGGER cap_increase_requests_decide_once ON cap_increase_requests;
CREATE TRIGGER cap_increase_requests_decide_once
    BEFORE UPDATE ON cap_increase_requests
    FOR EACH ROW EXECUTE FUNCTION guard_four_eyes_decision('cap_increase');
DROP FUNCTION guard_cap_increase_decision();
