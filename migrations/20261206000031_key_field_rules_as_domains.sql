-- A key's field rules checked when a field is written, not on every spend
-- (issue 20).
--
-- PostgreSQL checks every CHECK constraint of a table on every UPDATE, and
-- reads each one's expression from the catalog again for every statement.
-- vault_keys had 14: the ledger's two counter updates a batch (reserve, then
-- settle) re-read and re-ran the rules for the label, the billing period's
-- and the currency's patterns, the endpoint list and the rest, none of which
-- a spend changes. Measured on the backend (pgbench, prepared, rolled
-- back), `UPDATE vault_keys SET reserved_cents = reserved_cents + 1`:
--
--   keys updated   14 table constraints   5, and 9 domains
--   1              0.20 ms                0.15 ms
--   15             0.43 ms                0.23 ms
--
-- (15 keys is a batch of 17 calls over 100 keys; the three pattern rules
-- cost about 13 us a row).
--
-- A domain's rule runs when a value of that column is written (an INSERT,
-- or an UPDATE that sets it), never for the columns an UPDATE leaves alone,
-- and PostgreSQL keeps its expression cached. Each rule keeps its
-- constraint's name, so errors name the same rule as before. The rules a
-- spend must meet (the counters, cap_cents > 0, spent + reserved <= cap)
-- and a revocation's reason stay table constraints; cap_cents also because
-- the ledger's functions return it as a bigint, which RETURN QUERY would
-- refuse from a domain.
--
-- vault_keys is rewritten once (a few thousand rows at most) and its
-- billing-period index rebuilt.

CREATE DOMAIN key_vendor AS text
    CONSTRAINT vault_keys_vendor_check CHECK (VALUE = 'stripe');
CREATE DOMAIN key_label AS text
    CONSTRAINT vault_keys_label_check CHECK (length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN key_billing_period AS text
    CONSTRAINT vault_keys_billing_period_check CHECK (VALUE ~ '^[0-9]{4}-(0[1-9]|1[0-2])$');
CREATE DOMAIN key_currency AS text
    CONSTRAINT vault_keys_currency_check CHECK (VALUE ~ '^[a-z]{3}$');
CREATE DOMAIN key_expected_total_cents AS bigint
    CONSTRAINT vault_keys_expected_total_cents_check CHECK (VALUE >= 0);
CREATE DOMAIN key_buffer_bps AS integer
    CONSTRAINT vault_keys_buffer_bps_check CHECK (VALUE BETWEEN 0 AND 100000);
CREATE DOMAIN key_allowed_endpoints AS text[]
    CONSTRAINT vault_keys_allowed_endpoints_check CHECK (cardinality(VALUE) > 0);
CREATE DOMAIN key_duplicate_policy AS text
    CONSTRAINT vault_keys_duplicate_policy_check CHECK (VALUE IN ('off', 'flag', 'block'));
CREATE DOMAIN key_stripe_account AS text
    CONSTRAINT vault_keys_stripe_account_check CHECK (VALUE ~ '^acct_[A-Za-z0-9]{1,250}$');

ALTER TABLE vault_keys
    DROP CONSTRAINT vault_keys_vendor_check,
    DROP CONSTRAINT vault_keys_label_check,
    DROP CONSTRAINT vault_keys_billing_period_check,
    DROP CONSTRAINT vault_keys_currency_check,
    DROP CONSTRAINT vault_keys_expected_total_cents_check,
    DROP CONSTRAINT vault_keys_buffer_bps_check,
    DROP CONSTRAINT vault_keys_allowed_endpoints_check,
    DROP CONSTRAINT vault_keys_duplicate_policy_check,
    DROP CONSTRAINT vault_keys_stripe_account_check,
    ALTER COLUMN vendor TYPE key_vendor,
    ALTER COLUMN label TYPE key_label,
    ALTER COLUMN billing_period TYPE key_billing_period,
    ALTER COLUMN currency TYPE key_currency,
    ALTER COLUMN expected_total_cents TYPE key_expected_total_cents,
    ALTER COLUMN buffer_bps TYPE key_buffer_bps,
    ALTER COLUMN allowed_endpoints TYPE key_allowed_endpoints,
    ALTER COLUMN duplicate_policy TYPE key_duplicate_policy,
    ALTER COLUMN stripe_account TYPE key_stripe_account;
