-- run_facts.sql: what each evaluated run played, for `trajlake diagnose` (did the environment or the task
-- distribution change between two runs?).
--
-- Parameters: {{runs}}   the run ids, as a SQL list: ('demo-B0', 'demo-R1')
-- Reads the view episodes.
--
-- Output columns (one row per distinct combination)
--   run_id, env_id, env_version, env_image_digest, task_id, task_version   as in episodes
--   n_episodes   episodes of the run with that combination
SELECT
    run_id,
    env_id,
    env_version,
    env_image_digest,
    task_id,
    task_version,
    count(*) AS n_episodes
FROM episodes
WHERE run_id IN {{runs}}
GROUP BY ALL
ORDER BY ALL
