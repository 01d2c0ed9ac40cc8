-- Calls per key, hour and decision, with the amount they spent: what the
-- console's counts, charts and "blocked in the last 24 h" read, so no page
-- ever scans the audit log. A statement trigger on the audit log keeps it,
-- in the transaction that appends the rows, whoever appends them (the
-- proxy's ledger, the start-up sweep, demo and benchmark data).
CREATE TABLE call_stats (
    -- NULL for calls whose key was unknown.
    vault_key_id bigint REFERENCES vault_keys (id),
    hour         timestamptz NOT NULL CHECK (hour = date_trunc('hour', hour, 'UTC')),
    decision     text        NOT NULL,
    calls        bigint      NOT NULL CHECK (calls > 0),
    -- What allowed calls that Stripe accepted (2xx) spent: the amounts
    -- settle_spend moves from reserved to spent.
    spent_cents  bigint      NOT NULL CHECK (spent_cents >= 0)
);
ALTER TABLE call_stats ADD CONSTRAINT call_stats_key_hour_decision_key
    UNIQUE NULLS NOT DISTINCT (vault_key_id, hour, decision);
-- "Refused in the last 24 h" reads only refusals.
CREATE INDEX call_stats_refused_idx ON call_stats (hour) WHERE decision LIKE 'refused%';

CREATE FUNCTION count_audited_calls() RETURNS trigger
LANGUAGE plpgsql AS $$
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
$$;

CREATE TRIGGER audit_log_count_calls
    AFTER INSERT ON audit_log
    REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION count_audited_calls();

-- Calls already audited before this migration.
INSERT INTO call_stats (vault_key_id, hour, decision, calls, spent_cents)
SELECT vault_key_id, date_trunc('hour', at, 'UTC'), decision, count(*),
       coalesce(sum(amount_cents) FILTER (
           WHERE decision = 'allowed' AND upstream_status BETWEEN 200 AND 299), 0)
FROM audit_log
GROUP BY 1, 2, 3;

-- The keys list filters by status and sorts by utilization; the overview
-- lists the keys at or above their lowest threshold.
CREATE INDEX vault_keys_created_idx ON vault_keys (created_at DESC, id DESC);
