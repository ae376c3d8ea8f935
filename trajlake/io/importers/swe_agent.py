"""``swe-agent``: SWE-agent ``.traj`` files, one episode per file (mapping in docs/importers.md).

Two layouts exist. The older one has ``trajectory`` (steps of action/observation/response/state/thought, and
``execution_time`` since 1.0), ``history`` (the messages the model saw), ``info`` (``exit_status``,
``submission``, ``model_stats``) and ``environment``. The newer demonstration layout has only ``history``,
whose messages carry ``message_type`` (system_prompt/observation/action), ``tool_calls``, ``thought`` and
``action``. Turns come from ``history``; steps that SWE-agent had not yet added to the history when it saved
the file (the final action and/or observation) are appended from ``trajectory``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trajlake.io.importers._common import (
    EpisodeSpec,
    Loc,
    Record,
    RunInfo,
    Source,
    TaskSpec,
    TurnSpec,
    as_list,
    as_obj,
    canonical_json,
    command_name,
    id_str,
    openai_tool_calls,
    opt_int,
    opt_list,
    opt_num,
    opt_obj,
    opt_str,
    req_str,
    short_hash,
    text_of,
)
from trajlake.io.jsonl import json_error_text
from trajlake.schemas.vocab import ErrorClass, Role, Status

FORMAT = "swe-agent"

# exit_status -> (terminated, truncated, termination_reason, error_class); docs/importers.md explains each.
EXIT_STATUS: dict[str, tuple[bool, bool, str, str | None]] = {
    "submitted": (True, False, "submitted", None),
    "exit_command": (True, False, "gave_up", None),
    "exit_forfeit": (True, False, "gave_up", None),
    "exit_format": (True, False, "gave_up", ErrorClass.MODEL_INVALID_ACTION),
    "exit_cost": (False, True, "budget_cost", ErrorClass.BUDGET_EXHAUSTED),
    "exit_context": (False, True, "budget_tokens", ErrorClass.BUDGET_EXHAUSTED),
    "exit_total_execution_time": (False, True, "timeout", ErrorClass.BUDGET_EXHAUSTED),
    "exit_command_timeout": (False, True, "timeout", ErrorClass.BUDGET_EXHAUSTED),
    "exit_api": (False, True, "env_failure", ErrorClass.ENV_TRANSIENT),
    "exit_environment_error": (False, True, "env_failure", ErrorClass.ENV_BUG),
    "exit_error": (False, True, "env_failure", ErrorClass.ENV_BUG),
    "early_exit": (False, True, "env_failure", None),
}
_UNFINISHED = (False, True, "env_failure", None)


def map_exit_status(status: str | None, last_action: str | None, loc: Loc) -> tuple[bool, bool, str, str | None]:
    """(terminated, truncated, termination_reason, error_class) of an ``info.exit_status``.

    ``submitted (<status>)`` is SWE-agent's autosubmission after ``<status>`` ended the run: it maps like
    ``<status>`` (the patch was saved, but the run was cut). Without an exit status the run is complete only
    if its last action was ``submit``; otherwise it was cut before it finished."""
    if status is None:
        if last_action is not None and command_name(last_action) == "submit":
            return EXIT_STATUS["submitted"]
        return _UNFINISHED
    s = status.strip()
    if s.startswith("submitted (") and s.endswith(")"):
        inner = s[len("submitted ("):-1].strip()
        if inner in EXIT_STATUS:
            return EXIT_STATUS[inner]
    if s in EXIT_STATUS:
        return EXIT_STATUS[s]
    loc.fail("info.exit_status", f"unknown exit_status {status[:80]!r} (known: {', '.join(EXIT_STATUS)}, and "
                                 f"'submitted (<known>)')")


def _load(path: Path) -> dict[str, Any]:
    loc = Loc(str(path))
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        loc.fail("*", f"file is not valid UTF-8 (byte {e.start})")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        Loc(f"{path}:{e.lineno}").fail("*", json_error_text(e, with_line=False))
    except RecursionError:
        loc.fail("*", "invalid JSON: nested too deeply")
    doc = as_obj(doc, loc, "file")
    if "history" not in doc:
        loc.fail("history", "not a SWE-agent .traj file: required list `history` is missing")
    return doc


def _replay_config(doc: dict[str, Any]) -> dict[str, Any]:
    """The run's configuration (a JSON string or object in SWE-agent >= 1.0), or {} when absent/unreadable."""
    rc = doc.get("replay_config")
    if isinstance(rc, str):
        try:
            rc = json.loads(rc)
        except (ValueError, RecursionError):
            return {}
    return rc if isinstance(rc, dict) else {}


def _model_name(rc: dict[str, Any]) -> str | None:
    agent = rc.get("agent")
    model = agent.get("model") if isinstance(agent, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return name if isinstance(name, str) and name else None


def _sub(d: Any, *keys: str) -> Any:
    """``d[k1][k2]...``, or None where a level is missing or not an object."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _task_budget(rc: dict[str, Any], loc: Loc) -> tuple[str | None, str | None, float | None, int | None]:
    """(repository, base commit, max cost, max steps) of the task from the replay config: ``env.repo``
    (``base_commit``; ``github_url``, ``repo_name`` or ``path``) and ``agent.model``
    (``per_instance_cost_limit``, ``per_instance_call_limit``; 0 means no limit in SWE-agent)."""
    repo = _sub(rc, "env", "repo")
    repo = repo if isinstance(repo, dict) else {}
    commit = opt_str(repo, "base_commit", loc, "replay_config.env.repo.base_commit")
    source = None
    for k in ("github_url", "repo_name", "path"):
        source = source or opt_str(repo, k, loc, f"replay_config.env.repo.{k}")
    model = _sub(rc, "agent", "model")
    model = model if isinstance(model, dict) else {}
    cost = opt_num(model, "per_instance_cost_limit", loc, "replay_config.agent.model.per_instance_cost_limit")
    calls = opt_int(model, "per_instance_call_limit", loc, "replay_config.agent.model.per_instance_call_limit")
    return (source or None, commit or None, cost if cost is not None and cost > 0 else None,
            calls if calls else None)


def _instance_id(rc: dict[str, Any], path: Path) -> str:
    ps = rc.get("problem_statement")
    pid = ps.get("id") if isinstance(ps, dict) else None
    if isinstance(pid, str | int) and not isinstance(pid, bool) and str(pid):
        return str(pid)
    return path.name[: -len(".traj")] if path.name.endswith(".traj") else path.stem


def parse_traj(doc: dict[str, Any], path: Path, loc: Loc) -> EpisodeSpec:
    """The episode of one ``.traj`` document."""
    history = as_list(doc.get("history"), loc, "history")
    trajectory = opt_list(doc, "trajectory", loc, "trajectory") or []
    info = opt_obj(doc, "info", loc, "info") or {}
    rc = _replay_config(doc)
    model = _model_name(rc)
    turns: list[TurnSpec] = []
    call_names: dict[str, str] = {}
    # per step (non-demo assistant message): the action text and the index of its observation turn
    step_actions: list[str | None] = []
    obs_of_step: dict[int, int] = {}
    pending: tuple[str | None, str | None] = (None, None)  # (tool name, call id) awaiting an observation
    statement: str | None = None
    for i, m in enumerate(history):
        f = f"history[{i}]"
        m = as_obj(m, loc, f)
        role = req_str(m, "role", loc, f"{f}.role")
        if role not in (Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL):
            loc.fail(f"{f}.role", f"unknown role {role!r} (system, user, assistant or tool)")
        content = text_of(m.get("content"), loc, f"{f}.content")
        if m.get("is_demo") is True:  # demonstrations are prompt text written by people, never policy output
            turns.append(TurnSpec(role, "system", content))
            continue
        if role == "system":
            turns.append(TurnSpec("system", "system", content))
        elif role == "assistant":
            action = opt_str(m, "action", loc, f"{f}.action")
            step_actions.append(action)
            calls = openai_tool_calls(m, loc, f)
            if calls:
                for k, (cid, name, args, ok) in enumerate(calls):
                    turns.append(TurnSpec("assistant", "policy", content if k == 0 else None, policy_version=model,
                                          action_schema=name, tool_call_id=cid, tool_args=args,
                                          status="OK" if ok else Status.MODEL_INVALID_ACTION))
                    if cid is not None:
                        call_names[cid] = name
                pending = (calls[0][1], calls[0][0])
            else:
                cmd = command_name(action)
                turns.append(TurnSpec("assistant", "policy", content, policy_version=model, action_schema=cmd,
                                      tool_args=canonical_json({"command": action}) if action is not None else None))
                pending = (cmd, None)
        elif role == "tool" or step_actions:  # after the first action, user messages are observations
            ids = opt_list(m, "tool_call_ids", loc, f"{f}.tool_call_ids") or []
            cid = id_str(ids[0], loc, f"{f}.tool_call_ids[0]") if ids else pending[1]
            tool = call_names.get(cid, pending[0]) if cid is not None else pending[0]
            if step_actions and len(step_actions) - 1 not in obs_of_step:
                obs_of_step[len(step_actions) - 1] = len(turns)
            turns.append(TurnSpec("tool", "env", content, action_schema=tool, tool_call_id=cid))
        else:
            turns.append(TurnSpec("user", "user", content))
            if statement is None:
                statement = content
    _append_unsaved_steps(trajectory, turns, step_actions, obs_of_step, pending, model, loc)
    for k, idx in obs_of_step.items():
        if k < len(trajectory) and isinstance(trajectory[k], dict):
            secs = opt_num(trajectory[k], "execution_time", loc, f"trajectory[{k}].execution_time")
            if secs is not None and secs >= 0:
                turns[idx].tool_seconds = secs
                turns[idx].duration_s = secs
    if not turns:
        loc.fail("history", "trajectory has no messages")
    exit_status = info.get("exit_status")
    if exit_status is not None and not isinstance(exit_status, str):
        exit_status = str(exit_status) if isinstance(exit_status, int) and not isinstance(exit_status, bool) else None
        if exit_status is None:
            loc.fail("info.exit_status", "expected a string")
    last_action = step_actions[-1] if step_actions else None
    terminated, truncated, reason, error_class = map_exit_status(exit_status, last_action, loc)
    stats = opt_obj(info, "model_stats", loc, "info.model_stats") or {}
    cost = opt_num(stats, "instance_cost", loc, "info.model_stats.instance_cost")
    if cost is None:
        cost = opt_num(stats, "total_cost", loc, "info.model_stats.total_cost")
    version = opt_str(info, "swe_agent_version", loc, "info.swe_agent_version")
    task_id = _instance_id(rc, path)
    statement = statement or ""
    source, commit, max_cost, max_steps = _task_budget(rc, loc)
    return EpisodeSpec(
        key=f"file {path.name}", task_id=task_id, task_version=short_hash(statement),
        env_version=version or "unknown",
        terminated=terminated, truncated=truncated, termination_reason=reason, error_class=error_class,
        success=None, turns=turns,  # a .traj file is not graded (the evaluation writes its own report)
        tokens_in=opt_int(stats, "tokens_sent", loc, "info.model_stats.tokens_sent"),
        tokens_out=opt_int(stats, "tokens_received", loc, "info.model_stats.tokens_received"),
        cost_usd=max(0.0, cost) if cost is not None else None, policy_version=model or "unknown",
        task=TaskSpec(statement=statement, family=FORMAT, source=source, commit=commit, max_cost=max_cost,
                      max_steps=max_steps),
    )


def _append_unsaved_steps(trajectory: list[Any], turns: list[TurnSpec], step_actions: list[str | None],
                          obs_of_step: dict[int, int], pending: tuple[str | None, str | None],
                          model: str | None, loc: Loc) -> None:
    """Append the trajectory steps the history lacks: the last step's observation, then whole steps."""
    n = len(step_actions)
    if not trajectory or len(trajectory) < n:
        return
    if n and n - 1 not in obs_of_step:
        step = as_obj(trajectory[n - 1], loc, f"trajectory[{n - 1}]")
        obs = opt_str(step, "observation", loc, f"trajectory[{n - 1}].observation")
        if obs is not None:
            obs_of_step[n - 1] = len(turns)
            turns.append(TurnSpec("tool", "env", obs, action_schema=pending[0], tool_call_id=pending[1]))
    for k in range(n, len(trajectory)):
        step = as_obj(trajectory[k], loc, f"trajectory[{k}]")
        action = opt_str(step, "action", loc, f"trajectory[{k}].action")
        response = opt_str(step, "response", loc, f"trajectory[{k}].response")
        obs = opt_str(step, "observation", loc, f"trajectory[{k}].observation")
        name = command_name(action)
        step_actions.append(action)
        turns.append(TurnSpec("assistant", "policy", response, policy_version=model, action_schema=name,
                              tool_args=canonical_json({"command": action}) if action is not None else None))
        if obs is not None:
            obs_of_step[k] = len(turns)
            turns.append(TurnSpec("tool", "env", obs, action_schema=name))


def open_source(path: Path) -> Source:
    """A ``.traj`` file: one record, the whole file."""
    doc = _load(path)
    loc = Loc(str(path))
    rc = _replay_config(doc)
    env = doc.get("environment")
    info = doc.get("info")
    version = info.get("swe_agent_version") if isinstance(info, dict) else None
    run = RunInfo(policy_name=_model_name(rc),
                  config={"environment": env if isinstance(env, str) else None,
                          "swe_agent_version": version if isinstance(version, str) else None})
    layout = "trajectory" if "trajectory" in doc else "history"
    return Source(format_version=layout, run=run,
                  records=lambda: iter([Record(str(path), lambda: parse_traj(doc, path, loc))]))
