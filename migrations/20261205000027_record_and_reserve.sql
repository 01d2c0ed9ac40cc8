-- One transaction for the settlements and reservations waiting (issue 20).
--
-- A ledger writer used to commit its settlements and its reservations in
-- separate transactions, each paying a statement's and a commit's fixed
-- cost (most of a call's database time at a few calls in flight). The
-- writer now takes both kinds of waiting calls and writes them here
-- together: reservations first, then settlements and audit rows, so
-- the audit chain's head, which one transaction holds at a time until it
-- commits, is taken as late as possible.
--
-- Every key either half locks is locked first, in key order as every
-- ledger writer locks them; the chain head comes after the keys, as in
-- record_calls alone. So no two writers (of this instance and another)
-- can each hold what the other waits for.

CREATE FUNCTION record_and_reserve(p_records jsonb, p_reserves jsonb)
RETURNS TABLE(call_position bigint, outcome text, reservation_id bigint, cap bigint, spent bigint,
              reserved bigint, earlier_charge text, earlier_state text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM vault_keys k
    WHERE k.id IN (SELECT x.key FROM reserve_calls(p_reserves) x
                   UNION
                   SELECT x.vault_key_id FROM recorded_calls(p_records) x
                   WHERE x.reservation_id IS NOT NULL OR x.release IS NOT NULL)
    ORDER BY k.id
    FOR NO KEY UPDATE;

    RETURN QUERY SELECT * FROM reserve_spend_many(p_reserves);
    PERFORM record_calls(p_records);
END
$$;
