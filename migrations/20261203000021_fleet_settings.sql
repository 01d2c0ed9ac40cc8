-- Settings every `vaultcap serve` over this database must share, by the flag
-- that sets them (`--alert-webhook`, `--upstream-timeout-secs`, …), each as
-- its JSON value. The first instance to start records its own; a later one
-- whose flags disagree refuses to start and names the difference, unless it
-- is started with --replace-fleet-settings (the action log records that).
-- The notifier reads the webhooks from here on every pass, so one list
-- serves the whole fleet: an instance started without --alert-webhook used to
-- claim notifications and deliver them to nobody.
CREATE TABLE fleet_settings (
    flag   text        PRIMARY KEY,
    value  jsonb       NOT NULL,
    set_at timestamptz NOT NULL DEFAULT now()
);
