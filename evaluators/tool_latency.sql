-- tool_latency.sql: one row per tool call of the evaluated episodes with its latency, for the tool-call
-- latency tails (tool_latency_p50 / tool_latency_p99). Episode latency is wall_seconds of episode_metrics.sql.
--
-- Parameters: {{runs}}   the run ids to evaluate, as a SQL list: ('demo-B0', 'demo-R1')
-- Reads the view turns and the temporary table eval_episode_metrics (episode_metrics.sql, materialised by
-- trajlake.evaluators), so each call carries its episode's row index instead of repeating strings.
--
-- A tool call's latency is latency_ms of the turn that returned its observation: a turn with role 'tool', or a
-- non-policy turn carrying a tool_call_id (environments that answer with role 'env').
--
-- Output columns
--   ep_idx       row index of the call's episode in eval_episode_metrics (run, task, pair membership)
--   latency_ms   latency of the tool turn in milliseconds
--
-- Ordered by latency (unknown latencies last), then ep_idx: every subset the statistics take (a run, a slice, a
-- comparison arm) is then sorted too, so their quantile bootstraps' own sorts are nearly free. DuckDB's parallel
-- sort costs less than fetching unordered and sorting in numpy (0.37 s against 0.29 + 0.25 s at 1.8M calls).
SELECT
    m.ep_idx,
    t.latency_ms
FROM turns t
JOIN eval_episode_metrics m ON m.episode_id = t.episode_id
WHERE t.run_id IN {{runs}}
  AND (t.role = 'tool' OR (t.tool_call_id IS NOT NULL AND t.actor <> 'policy'))
ORDER BY t.latency_ms NULLS LAST, m.ep_idx
