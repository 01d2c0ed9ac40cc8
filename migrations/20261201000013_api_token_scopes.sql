-- API tokens hold scopes and expire. A token used to be able to do
-- everything for ever; now it names what it may do (the application maps
-- each API route to one scope) and dies on its own.

ALTER TABLE api_tokens
    ADD COLUMN scopes     text[],
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN revoked_by bigint REFERENCES operators (id);

-- Tokens made before scopes existed could do everything: they keep that
-- for the default lifetime of a new token, so nothing breaks today and
-- nothing lives for ever.
UPDATE api_tokens
SET scopes = '{keys:create,keys:read,keys:revoke,alerts:read,alerts:ack,audit:export,cap_requests:create}',
    expires_at = greatest(now(), created_at) + interval '90 days';

ALTER TABLE api_tokens
    ALTER COLUMN scopes SET NOT NULL,
    ALTER COLUMN expires_at SET NOT NULL,
    ADD CONSTRAINT api_tokens_scopes_known CHECK (
        cardinality(scopes) > 0
        AND scopes <@ '{keys:create,keys:read,keys:revoke,alerts:read,alerts:ack,audit:export,cap_requests:create}'::text[]),
    ADD CONSTRAINT api_tokens_expires_after_creation CHECK (expires_at > created_at),
    ADD CONSTRAINT api_tokens_revoked_by_needs_revocation CHECK (revoked_by IS NULL OR revoked_at IS NOT NULL),
    -- Only the first characters of a secret are ever kept in clear.
    ADD CONSTRAINT api_tokens_prefix_short CHECK (length(token_prefix) <= 12);
