-- reward_components.sql: the named reward components of the evaluated episodes, one row per component, for
-- `trajlake diagnose` (reward drift).
--
-- Parameters: {{runs}}   the run ids, as a SQL list: ('demo-B0', 'demo-R1')
-- Reads the view episodes and the temporary table eval_episode_metrics (episode_metrics.sql).
--
-- Output columns
--   ep_idx      row index of the episode in eval_episode_metrics
--   component   reward component name (a key of episodes.reward_components)
--   value       its value
SELECT
    m.ep_idx,
    c.component,
    c.value
FROM (
    SELECT
        episode_id,
        unnest(map_keys(reward_components)) AS component,
        unnest(map_values(reward_components)) AS value
    FROM episodes
    WHERE run_id IN {{runs}}
) c
JOIN eval_episode_metrics m ON m.episode_id = c.episode_id
