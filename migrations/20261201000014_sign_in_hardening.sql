-- Failed sign-ins go to the action log with the address they came from.
-- Nobody is signed in then, so a console action may have no operator, but
-- only for that.
ALTER TABLE operator_actions DROP CONSTRAINT operator_actions_attributed;
ALTER TABLE operator_actions ADD CONSTRAINT operator_actions_attributed CHECK (
    (via = 'console' AND operator_id IS NOT NULL)
    OR (via = 'console' AND operator_id IS NULL AND action = 'sign_in_failed')
    OR (via = 'api' AND api_token_id IS NOT NULL)
    OR via IN ('cli', 'system'));
