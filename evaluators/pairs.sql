-- pairs.sql: match the episodes of a baseline and a candidate run for paired comparison.
--
-- Parameters: {{baseline}}, {{candidate}}   run ids as SQL string literals
-- Reads the temporary table eval_episode_metrics (episode_metrics.sql, materialised by trajlake.evaluators).
--
-- Two episodes are a pair when they played the same task with the same seed and attempt: equal
-- (task_id, env_seed, attempt), a NULL env_seed matching a NULL one. A key that occurs more than once in either
-- run cannot be paired unambiguously: all its episodes are dropped as 'ambiguous'. Episodes whose key is absent
-- from the other run are dropped as 'unmatched'. The env_version may differ between the two episodes of a pair
-- (comparing environment versions is one use of pairing).
--
-- Output columns (one row per join result; a baseline or candidate index appears in at most one 'pair' row)
--   baseline_idx    ep_idx of the baseline episode, NULL when the key is only in the candidate
--   candidate_idx   ep_idx of the candidate episode, NULL when the key is only in the baseline
--   task_id, env_seed, attempt   the pairing key
--   status          'pair' (kept), 'unmatched' (key in one run only) or 'ambiguous' (key repeated in a run)
WITH
b AS (
    SELECT ep_idx, task_id, env_seed, attempt,
           count(*) OVER (PARTITION BY task_id, env_seed, attempt) AS n_key
    FROM eval_episode_metrics
    WHERE run_id = {{baseline}}
),
c AS (
    SELECT ep_idx, task_id, env_seed, attempt,
           count(*) OVER (PARTITION BY task_id, env_seed, attempt) AS n_key
    FROM eval_episode_metrics
    WHERE run_id = {{candidate}}
)
SELECT
    b.ep_idx AS baseline_idx,
    c.ep_idx AS candidate_idx,
    coalesce(b.task_id, c.task_id) AS task_id,
    coalesce(b.env_seed, c.env_seed) AS env_seed,
    coalesce(b.attempt, c.attempt) AS attempt,
    CASE
        WHEN b.ep_idx IS NULL OR c.ep_idx IS NULL THEN 'unmatched'
        WHEN b.n_key > 1 OR c.n_key > 1 THEN 'ambiguous'
        ELSE 'pair'
    END AS status
FROM b
FULL OUTER JOIN c
    ON b.task_id = c.task_id AND b.env_seed IS NOT DISTINCT FROM c.env_seed AND b.attempt = c.attempt
ORDER BY task_id, env_seed NULLS FIRST, attempt, baseline_idx NULLS FIRST, candidate_idx NULLS FIRST
