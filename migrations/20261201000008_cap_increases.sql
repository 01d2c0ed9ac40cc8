-- Cap increases with a four-eyes rule: one person (or a billing job's API
-- token) asks for a higher cap with a reason; a different person with the
-- approver role decides, once. PostgreSQL holds the rules, so no code path
-- (console, API, a script with SQL access) can approve its own request,
-- decide twice, or decide after the request has expired.

CREATE TABLE cap_increase_requests (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    vault_key_id       bigint      NOT NULL REFERENCES vault_keys (id),
    -- What the key could move when asked (its cap plus its live follow-on
    -- keys' caps), and what it should be able to move once approved.
    from_cap_cents     bigint      NOT NULL CHECK (from_cap_cents > 0),
    to_cap_cents       bigint      NOT NULL,
    -- Approval raises the key's own cap, or issues a follow-on key for the
    -- difference, linked to this key (vault_keys.parent_key_id).
    apply_as           text        NOT NULL CHECK (apply_as IN ('raise_cap', 'follow_on_key')),
    reason             text        NOT NULL CHECK (length(btrim(reason)) BETWEEN 1 AND 2000),
    -- Where the request was made from: key page, alert, refused call, API.
    origin             text        NOT NULL DEFAULT 'key_page',
    requested_at       timestamptz NOT NULL DEFAULT now(),
    requested_by       bigint REFERENCES operators (id),
    requested_by_token bigint REFERENCES api_tokens (id),
    expires_at         timestamptz NOT NULL,
    -- Undecided until decision is set; the state (pending or expired) is
    -- derived from expires_at and the key, never stored.
    decision           text CHECK (decision IN ('approved', 'rejected')),
    decided_at         timestamptz,
    decided_by         bigint REFERENCES operators (id),
    decision_note      text CHECK (length(decision_note) <= 2000),
    follow_on_key_id   bigint REFERENCES vault_keys (id),
    CONSTRAINT cap_increase_raises CHECK (to_cap_cents > from_cap_cents),
    CONSTRAINT cap_increase_one_requester CHECK ((requested_by IS NULL) <> (requested_by_token IS NULL)),
    CONSTRAINT cap_increase_decision_complete CHECK (
        (decision IS NULL) = (decided_at IS NULL) AND (decision IS NULL) = (decided_by IS NULL)),
    -- The four-eyes rule. (NULL on either side passes: undecided, or asked
    -- for by an API token, which no person can decide as.)
    CONSTRAINT cap_increase_four_eyes CHECK (decided_by <> requested_by),
    CONSTRAINT cap_increase_follow_on_approved CHECK (follow_on_key_id IS NULL OR decision = 'approved')
);
CREATE INDEX cap_increase_requests_key_idx ON cap_increase_requests (vault_key_id, requested_at DESC);
CREATE INDEX cap_increase_requests_undecided_idx ON cap_increase_requests (requested_at)
    WHERE decision IS NULL;

-- A decision is made once, by an active approver, before the request
-- expires; after that the row never changes.
CREATE FUNCTION guard_cap_increase_decision() RETURNS trigger
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
    RETURN NEW;
END
$$;
CREATE TRIGGER cap_increase_requests_decide_once
    BEFORE UPDATE ON cap_increase_requests
    FOR EACH ROW EXECUTE FUNCTION guard_cap_increase_decision();
CREATE TRIGGER cap_increase_requests_no_delete
    BEFORE DELETE ON cap_increase_requests
    FOR EACH ROW EXECUTE FUNCTION forbid_rewrite();

-- The webhook outbox carries cap increase events beside alerts.
ALTER TABLE alert_notifications
    ALTER COLUMN alert_id DROP NOT NULL,
    ADD COLUMN cap_increase_request_id bigint REFERENCES cap_increase_requests (id),
    DROP CONSTRAINT alert_notifications_event_check,
    ADD CONSTRAINT alert_notifications_event_check
        CHECK (event IN ('alert.raised', 'cap_increase.requested', 'cap_increase.decided')),
    ADD CONSTRAINT alert_notifications_one_subject
        CHECK ((alert_id IS NULL) <> (cap_increase_request_id IS NULL));

CREATE FUNCTION queue_cap_increase_notification() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO alert_notifications (cap_increase_request_id, event)
    VALUES (NEW.id, CASE TG_OP WHEN 'INSERT' THEN 'cap_increase.requested' ELSE 'cap_increase.decided' END);
    PERFORM pg_notify('vaultcap_alerts', 'cap_increase:' || NEW.id);
    RETURN NULL;
END
$$;
CREATE TRIGGER cap_increase_requests_notify_requested
    AFTER INSERT ON cap_increase_requests
    FOR EACH ROW EXECUTE FUNCTION queue_cap_increase_notification();
CREATE TRIGGER cap_increase_requests_notify_decided
    AFTER UPDATE OF decision ON cap_increase_requests
    FOR EACH ROW WHEN (OLD.decision IS NULL AND NEW.decision IS NOT NULL)
    EXECUTE FUNCTION queue_cap_increase_notification();

-- A raised cap re-arms the key's alerts: crossing 90 % of the new cap is a
-- new crossing, and a refusal at the new cap is news. (The expiry alert is
-- about unspent billing, not the cap: raised once per key, see
-- alerts::raise_expiring.)
ALTER TABLE alerts
    DROP CONSTRAINT alerts_once,
    ADD CONSTRAINT alerts_once UNIQUE (vault_key_id, kind, threshold_pct, cap_cents);
