-- oracle.sql: episodes of the fixed replay / oracle suite, for `trajlake diagnose`: runs whose policy_name is
-- 'oracle' (a known solution replayed), on the given environment versions. If the oracle's success drops too
-- between two environment versions, the environment or its grader regressed, not the policy. Ungraded oracle
-- episodes (success NULL) say nothing and are left out.
--
-- Parameters: {{env_versions}}   environment versions, as a SQL list: ('1.0', '1.1')
-- Reads the views episodes and runs.
--
-- Output columns
--   run_id, env_version, task_id, env_seed, attempt   as in episodes (the pairing key across versions)
--   success                                           1 when solved, else 0
SELECT
    e.run_id,
    e.env_version,
    e.task_id,
    e.env_seed,
    e.attempt,
    e.success::INTEGER AS success
FROM episodes e
JOIN runs r ON r.run_id = e.run_id
WHERE r.policy_name = 'oracle' AND e.env_version IN {{env_versions}} AND e.success IS NOT NULL
ORDER BY e.env_version, e.task_id, e.env_seed, e.attempt, e.run_id
