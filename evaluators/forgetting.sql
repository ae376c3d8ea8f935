-- forgetting.sql: the turns of the evaluated episodes whose context was trimmed, for the forgetting check of
-- trajlake.evaluators.forgetting (which resolves each trimmed policy turn's dropped range from its
-- context_dropped_hash in Python: the hash is sha256 over a JSON list the SQL cannot rebuild byte for byte).
--
-- Parameters:
--   {{runs}}   the run ids to evaluate, as a SQL list
--
-- A trimmed episode has a policy turn with context_dropped_hash set by a trimming strategy: drop_oldest,
-- summarize, or NULL (lakes written before turns.context_strategy existed, when hf: trimming was drop_oldest).
-- single_turn (B0's one-shot prompt), rerendered (a chat server re-tokenised the history) and server_chat name
-- turns left out of a context for other reasons: they are not trimming.
--
-- Output: one row per turn of those episodes, ordered by (episode_id, turn_idx), with the episode's success.
WITH trimmed AS (
    SELECT DISTINCT episode_id
    FROM turns
    WHERE run_id IN {{runs}}
      AND actor = 'policy'
      AND context_dropped_hash IS NOT NULL
      AND (context_strategy IS NULL OR context_strategy IN ('drop_oldest', 'summarize'))
)
SELECT
    t.episode_id,
    t.turn_idx,
    t.actor,
    t.raw_content,
    t.action_schema,
    t.tool_args,
    t.status,
    t.fault_injected,
    t.context_dropped_hash,
    t.context_strategy,
    e.success
FROM turns t
JOIN trimmed USING (episode_id)
JOIN episodes e ON e.episode_id = t.episode_id AND e.run_id IN {{runs}}
WHERE t.run_id IN {{runs}}
ORDER BY t.episode_id, t.turn_idx
