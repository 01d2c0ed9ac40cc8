-- settle_calls' statements are planned once per connection (issue 20).
--
-- pg_stat_statements over `vaultcap bench proxy` showed its settlement CTE
-- planned 3,102 times in 12,127 runs (712 ms of planning): PostgreSQL's
-- plan cache kept choosing a custom plan for the batch's JSON, whose plan
-- is the same whatever the batch holds (the calls drive every join through
-- the reservations' and keys' primary keys).
ALTER FUNCTION settle_calls(jsonb) SET plan_cache_mode = force_generic_plan;
