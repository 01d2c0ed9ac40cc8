-- The audit page filters by billing period. Without this index, a period
-- older than the newest calls is found by walking the time index back until
-- its rows begin: 50 ms for the first page at 300,000 rows, growing with
-- the log (vaultcap bench audit; figures in the README).
CREATE INDEX audit_log_period_idx ON audit_log (billing_period, at DESC, id DESC)
    WHERE billing_period IS NOT NULL;
