-- A request filed with an API token is its maker's request too: the admin
-- who made the token may not decide what the token asked for (otherwise one
-- person could make a token, ask with it and approve). Same rule as
-- cap_increase_four_eyes, which cannot see through the token by itself.
CREATE OR REPLACE FUNCTION guard_cap_increase_decision() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.decision IS NOT NULL THEN
        RAISE EXCEPTION 'cap increase request % was already %', OLD.id, OLD.decision
            USING ERRCODE = 'check_violation', CONSTRAINT = 'cap_increase_decided_once';
    END IF;
    IF NEW.decision IS NULL THEN
        RETURN NEW;
    END IF;
    IF OLD.expires_at <= now() THEN
        RAISE EXCEPTION 'cap increase request % expired at %', OLD.id, OLD.expires_at
            USING ERRCODE = 'check_violation', CONSTRAINT = 'cap_increase_not_expired';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM operators o
                   WHERE o.id = NEW.decided_by AND o.disabled_at IS NULL
                     AND o.role IN ('approver', 'admin')) THEN
        RAISE EXCEPTION 'operator % may not decide cap increases', NEW.decided_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'cap_increase_decided_by_approver';
    END IF;
    IF EXISTS (SELECT 1 FROM api_tokens t
               WHERE t.id = OLD.requested_by_token AND t.created_by = NEW.decided_by) THEN
        RAISE EXCEPTION 'operator % made the API token that asked for request %', NEW.decided_by, OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'cap_increase_four_eyes';
    END IF;
    RETURN NEW;
END
$$;
