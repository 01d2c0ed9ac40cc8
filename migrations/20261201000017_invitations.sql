-- New operators set their own password from a one-time invitation link
-- (valid 24 hours); nobody else ever sees it. Only the link's hash is kept.
-- An invited operator's password_hash is '!', which no password matches.
CREATE TABLE operator_invitations (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operator_id bigint      NOT NULL REFERENCES operators (id),
    token_hash  bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  bigint REFERENCES operators (id),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz,
    CONSTRAINT operator_invitations_token_hash_key UNIQUE (token_hash),
    CONSTRAINT operator_invitations_expire_after_creation CHECK (expires_at > created_at)
);
CREATE INDEX operator_invitations_operator_idx ON operator_invitations (operator_id);
