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
SELECT
    m.ep_idx,
    t.latency_ms
FROM turns t
JOIN eval_episode_metrics m ON m.episode_id = t.episode_id
WHERE t.run_id IN {{runs}}
  AND (t.role = 'tool' OR (t.tool_call_id IS NOT NULL AND t.actor <> 'policy'))
