-- runs.sql: the runs of the lake, from the runs table and from episodes (a run may have episodes but no row in
-- runs, or a row but no episodes yet).
--
-- Parameters: none. Reads the views runs and episodes.
--
-- Output columns
--   run_id          run id
--   label           human label (runs.label), NULL without a runs row
--   policy_name     runs.policy_name, NULL without a runs row
--   policy_version  runs.policy_version, NULL without a runs row
--   n_episodes      committed episodes of the run
--   grammar_sha256  runs.config.grammar.sha256: the run decoded under that grammar (constrained); NULL: free
SELECT
    coalesce(r.run_id, e.run_id) AS run_id,
    r.label,
    r.policy_name,
    r.policy_version,
    coalesce(e.n_episodes, 0) AS n_episodes,
    CASE WHEN json_valid(r.config) THEN json_extract_string(r.config, '$.grammar.sha256') END AS grammar_sha256
FROM runs r
FULL OUTER JOIN (SELECT run_id, count(*) AS n_episodes FROM episodes GROUP BY run_id) e USING (run_id)
ORDER BY run_id
