-- An optional second factor for approvers and admins: a TOTP authenticator
-- (RFC 6238: SHA-1, 6 digits, 30-second steps) and single-use recovery codes.
--
-- The shared secret must be readable to check a code, so it is stored as
-- is, like the password hashes beside it: it guards sign-in, not money.
ALTER TABLE operators
    -- Made by "set up", waiting for the first code from the authenticator.
    ADD COLUMN totp_pending_secret bytea,
    -- The confirmed secret: sign-in asks for a code.
    ADD COLUMN totp_secret         bytea,
    ADD COLUMN totp_enabled_at     timestamptz,
    -- The newest time step a code was accepted for: each code signs in once.
    ADD COLUMN totp_last_step      bigint,
    ADD CONSTRAINT operators_totp_whole CHECK ((totp_secret IS NULL) = (totp_enabled_at IS NULL));

-- Only their SHA-256 is kept; each signs in once.
CREATE TABLE recovery_codes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operator_id bigint      NOT NULL REFERENCES operators (id),
    code_hash   bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    used_at     timestamptz,
    CONSTRAINT recovery_codes_once UNIQUE (operator_id, code_hash)
);
