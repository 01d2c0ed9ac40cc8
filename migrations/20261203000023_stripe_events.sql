-- Live from Stripe: its signed webhook events, each stored once, keep the
-- synced charges and payment intents current between syncs; a charge that no
-- vault key's call made is a finding of its own ('unmetered') and is
-- announced on the notification webhooks.

-- Every event Stripe delivered with a valid signature, once (a redelivery
-- finds its id taken and changes nothing). Never updated or deleted by the
-- application.
CREATE TABLE stripe_events (
    id          text        PRIMARY KEY CHECK (id ~ '^evt_'),
    type        text        NOT NULL,
    -- The object the event is about (`ch_…`, `pi_…`), when it has one.
    object_id   text,
    -- Stripe's `created`: when the event happened, the order to apply in.
    created_at  timestamptz NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    livemode    boolean     NOT NULL,
    -- What Vaultcap did with it: applied; stale (the stored object is
    -- already as new); ignored (a type Vaultcap does not use).
    outcome     text        NOT NULL CHECK (outcome IN ('applied', 'stale', 'ignored')),
    payload     jsonb       NOT NULL
);
CREATE INDEX stripe_events_received_idx ON stripe_events (received_at DESC);
CREATE TRIGGER stripe_events_append_only
    BEFORE UPDATE OR DELETE ON stripe_events
    FOR EACH ROW EXECUTE FUNCTION forbid_rewrite();
REVOKE UPDATE, DELETE, TRUNCATE ON stripe_events FROM vaultcap_app;

-- When Stripe last described the stored object: the event's `created`, or
-- the time a sync read it. An older description arriving later (events come
-- out of order) changes nothing.
ALTER TABLE stripe_charges
    ADD COLUMN described_at    timestamptz,
    -- The Idempotency-Key of the request that made the charge, as Stripe's
    -- event reports it.
    ADD COLUMN idempotency_key text;
ALTER TABLE stripe_payment_intents ADD COLUMN described_at timestamptz;
UPDATE stripe_charges SET described_at = synced_at;
UPDATE stripe_payment_intents SET described_at = synced_at;
ALTER TABLE stripe_charges ALTER COLUMN described_at SET NOT NULL,
                           ALTER COLUMN described_at SET DEFAULT now();
ALTER TABLE stripe_payment_intents ALTER COLUMN described_at SET NOT NULL,
                                   ALTER COLUMN described_at SET DEFAULT now();

-- Unmetered: charges in Stripe that no vault key's call made. Resolved by
-- attributing them to a key (with a reason) or dismissing them.
ALTER TABLE reconciliation_findings
    DROP CONSTRAINT reconciliation_findings_kind_check,
    ADD CONSTRAINT reconciliation_findings_kind_check
        CHECK (kind IN ('orphaned', 'duplicate', 'missing', 'unmetered')),
    DROP CONSTRAINT reconciliation_findings_resolution_check,
    ADD CONSTRAINT reconciliation_findings_resolution_check
        CHECK (resolution IN ('adopted', 'refunded', 'dismissed', 'cleared', 'attributed')),
    ADD COLUMN attributed_key_id bigint REFERENCES vault_keys (id),
    ADD CONSTRAINT reconciliation_findings_attribution_complete
        CHECK ((resolution IS NOT DISTINCT FROM 'attributed') = (attributed_key_id IS NOT NULL));

-- The notification webhooks hear of each unmetered finding when it is
-- found, and again when it reopens with other charges.
ALTER TABLE alert_notifications
    ADD COLUMN finding_id bigint REFERENCES reconciliation_findings (id),
    DROP CONSTRAINT alert_notifications_event_check,
    ADD CONSTRAINT alert_notifications_event_check
        CHECK (event IN ('alert.raised', 'cap_increase.requested', 'cap_increase.decided', 'finding.unmetered')),
    DROP CONSTRAINT alert_notifications_one_subject,
    ADD CONSTRAINT alert_notifications_one_subject
        CHECK (num_nonnulls(alert_id, cap_increase_request_id, finding_id) = 1);

CREATE FUNCTION queue_unmetered_notification() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO alert_notifications (finding_id, event) VALUES (NEW.id, 'finding.unmetered');
    PERFORM pg_notify('vaultcap_alerts', 'finding:' || NEW.id);
    RETURN NULL;
END
$$;
CREATE TRIGGER reconciliation_findings_notify_unmetered
    AFTER INSERT ON reconciliation_findings
    FOR EACH ROW WHEN (NEW.kind = 'unmetered')
    EXECUTE FUNCTION queue_unmetered_notification();
CREATE TRIGGER reconciliation_findings_notify_unmetered_again
    AFTER UPDATE OF charge_ids ON reconciliation_findings
    FOR EACH ROW WHEN (NEW.kind = 'unmetered' AND NEW.resolution IS NULL AND OLD.charge_ids <> NEW.charge_ids)
    EXECUTE FUNCTION queue_unmetered_notification();
