"""The rollout runner: play episodes of an environment with a policy and write them to the lake.

Each episode has a deterministic id (run, task, task version, seed, attempt), so a run that crashed or was
interrupted resumes by skipping the episodes already committed, and never duplicates one. Workers are processes
(``engine="local"``) or Ray tasks (``engine="ray"``); each worker has its own LakeWriter and commits after every
episode, so a worker crash loses at most the episode it was playing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trajlake.envs.core import Env, LoggedStep, ReplayLog, StepResult
from trajlake.rollout.faults import FaultInjector
from trajlake.rollout.policy import BYTE_TOKENIZER_ID, Policy, PolicyOutput, byte_tokenize

if TYPE_CHECKING:
    from trajlake.record.writer import LakeWriter

MODEL_STATUSES = frozenset({"MODEL_INVALID_ACTION", "MODEL_BAD_PLAN", "SAFETY_BLOCK"})


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def episode_id_for(run_id: str, task_id: str, task_version: str, seed: int, attempt: int) -> str:
    return f"{run_id}/{task_id}@{task_version}/s{seed}/a{attempt}"


@dataclass
class EpisodeRecord:
    """Rows of one finished episode, ready for ``LakeWriter.write_batch``."""

    episode: dict[str, Any]
    turns: list[dict[str, Any]]
    events: list[dict[str, Any]]


def _array(values: Any, dtype: type[np.generic]) -> np.ndarray | None:
    """A policy's per-token values as a 1-D array (lists are converted once here, arrays pass through)."""
    return None if values is None else np.asarray(values, dtype=dtype).reshape(-1)


def _n_tokens(ids: Any) -> int:
    return 0 if ids is None else len(ids)


def write_records(writer: LakeWriter, records: Sequence[EpisodeRecord], *, wait: bool = False) -> None:
    """Write finished episodes in one ``write_batch`` (their ids are new: no early duplicate look-up); with
    ``wait``, commit them before returning. Raises ValidationError naming any episode the writer rejected."""
    if not records:
        return
    res = writer.write_batch([r.episode for r in records], [t for r in records for t in r.turns],
                             [e for r in records for e in r.events] or None, check_existing=False)
    if wait:
        writer.flush()
    res.raise_if_rejected()


def _hash_text(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def play_episode(env: Env, policy: Policy, *, run_id: str, task_id: str, task_version: str | None, seed: int,
                 attempt: int = 0, split: str = "unknown", faults: FaultInjector | None = None,
                 task_view: Callable[[str, str], Any] | None = None, sandbox: str | None = None) -> EpisodeRecord:
    """Play one episode and return its rows. ``task_view(task_id, task_version)`` gives the policy's view."""
    faults = faults or FaultInjector()
    start = utcnow()
    r = env.reset(seed, task_version, task_id=task_id)
    ep_id = episode_id_for(run_id, r.task_id, r.task_version, seed, attempt)
    if task_view is None:
        from trajlake.rollout.policy import TaskView

        view = TaskView(r.task_id, r.task_version, r.observation, {})
    else:
        view = task_view(r.task_id, r.task_version)
    policy.attempt = attempt  # attempts of one group sample with distinct seeds
    policy.reset(view, seed)
    pv = policy.policy_version
    turns: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []

    def add_turn(**row: Any) -> int:
        row.setdefault("episode_id", ep_id)
        row.setdefault("run_id", run_id)
        row["turn_idx"] = len(turns)
        turns.append(row)
        return row["turn_idx"]

    obs_ids = byte_tokenize(r.observation)
    now = utcnow()
    add_turn(role="user", actor="user", raw_content=r.observation, token_ids=obs_ids,
             loss_mask=np.zeros(obs_ids.shape[0], dtype=np.int8),
             tokenizer_id=BYTE_TOKENIZER_ID, observation_hash=_hash_text(r.observation), env_state_hash=r.state_hash,
             started_at=start, ended_at=max(now, start), latency_ms=(now - start).total_seconds() * 1000, status="OK",
             tokens=len(obs_ids), cost_usd=0.0, tool_seconds=0.0)
    observation = r.observation
    step_idx = 0
    last: StepResult | None = None
    statuses: list[str] = []
    cost = 0.0
    tokens_in = tokens_out = 0
    while True:
        t0 = utcnow()
        out = policy.act(observation)
        t1 = utcnow()
        action = out.action
        tool = _tool_name(action)
        key = f"{ep_id}#{step_idx}"
        if out.context_token_ids is not None:
            tokens_in += _use_policy_context_tokens(turns[-1], out)
        n_out = _n_tokens(out.token_ids) if out.completion_tokens is None else out.completion_tokens
        tokens_out += n_out
        tokens_in += out.prompt_tokens
        cost += out.cost_usd
        pol_idx = add_turn(role="assistant", actor="policy", policy_version=pv, raw_content=action,
                           token_ids=_array(out.token_ids, np.int32), loss_mask=_array(out.loss_mask, np.int8),
                           behavior_logprobs=_array(out.behavior_logprobs, np.float32),
                           tokenizer_id=out.tokenizer_id, action_schema=tool, tool_call_id=f"call-{step_idx}",
                           tool_args=_tool_args(action), idempotency_key=key, started_at=t0, ended_at=t1,
                           latency_ms=(t1 - t0).total_seconds() * 1000, status=out.status or "OK",
                           tokens=n_out, cost_usd=out.cost_usd, tool_seconds=0.0,
                           context_dropped_hash=out.context_dropped_hash, **_strategy_column(out))
        fault = faults.decide(ep_id, step_idx)
        if fault is not None:
            # The call never reaches the environment: its state is unchanged, the agent sees an error.
            res = StepResult(observation=FaultInjector.observation(fault), reward_components={}, terminated=False,
                             truncated=False, status="ENV_TRANSIENT", cost_usd=0.0,
                             state_hash=last.state_hash if last else r.state_hash, tool=tool, fault_injected=fault)
            # Budgets still count the policy's turn: a faulty environment cannot extend an episode forever.
            res = _count_budget_on_fault(env, res, n_out, out.cost_usd)
        else:
            res = env.step(action, key, tokens=n_out, cost_usd=out.cost_usd)
        t2 = utcnow()
        statuses.append(res.status)
        if res.status in MODEL_STATUSES and turns[pol_idx]["status"] != "ENV_TRANSIENT":
            turns[pol_idx]["status"] = res.status  # a retried model call stays recorded as infrastructure
        for j, ev in enumerate(res.gateway_events):
            events.append({**ev, "episode_id": ep_id, "run_id": run_id, "turn_idx": pol_idx, "event_idx": j})
        obs_ids = byte_tokenize(res.observation)
        add_turn(role="tool", actor="env", raw_content=res.observation, token_ids=obs_ids,
                 loss_mask=np.zeros(obs_ids.shape[0], dtype=np.int8), tokenizer_id=BYTE_TOKENIZER_ID, action_schema=res.tool,
                 tool_call_id=f"call-{step_idx}", observation_hash=_hash_text(res.observation),
                 env_state_hash=res.state_hash, started_at=t1, ended_at=t2,
                 latency_ms=(t2 - t1).total_seconds() * 1000, status=res.status, tokens=len(obs_ids),
                 cost_usd=res.cost_usd, tool_seconds=res.tool_seconds, fault_injected=res.fault_injected,
                 reward_components=dict(res.reward_components) or None)
        cost += res.cost_usd
        tokens_in += len(obs_ids)
        observation = res.observation
        last = res
        step_idx += 1
        if res.done:
            break
    final = policy.observation_tokens(observation)
    if final is not None:  # the last observation in the policy's tokenizer too, for one tokenizer per episode
        final_ids = np.asarray(final[0], dtype=np.int32)
        tokens_in += final_ids.shape[0] - len(turns[-1]["token_ids"])
        turns[-1].update(token_ids=final_ids, loss_mask=np.zeros(final_ids.shape[0], dtype=np.int8),
                         tokenizer_id=final[1], tokens=final_ids.shape[0])
    end = utcnow()
    comps = dict(last.reward_components) if last else {}
    success = bool(comps.get("resolved", 0.0) >= 1.0)
    reason = last.termination_reason or ("budget_steps" if last.truncated else "submitted")
    error_class = _episode_error_class(success, last, statuses)
    if policy.needs_oracle and not success:
        # The known fix did not solve the task: the task or the environment is broken, not the model.
        error_class = "ENV_BUG"
    episode = {
        "episode_id": ep_id, "run_id": run_id, "task_id": r.task_id, "task_version": r.task_version, "split": split,
        "env_id": env.env_id, "env_version": env.env_version, "env_image_digest": env.image_digest, "env_seed": seed,
        "group_id": f"{r.task_id}:{r.task_version}:{seed}:{env.env_version}", "attempt": attempt,
        "policy_version_start": pv, "policy_version_end": pv, "started_at": start, "ended_at": end,
        "n_turns": len(turns),
        "n_policy_tokens": sum(int(np.sum(t["loss_mask"])) for t in turns if t.get("loss_mask") is not None),
        "terminated": last.terminated, "truncated": last.truncated, "termination_reason": reason,
        "error_class": error_class, "success": success, "reward_total": float(sum(comps.values())),
        "reward_components": comps, "tokens_in": tokens_in, "tokens_out": tokens_out, "cost_usd": cost,
        "tool_seconds": float(sum(t["tool_seconds"] for t in turns)), "wall_seconds": (end - start).total_seconds(),
        "faults_injected": sum(1 for t in turns if t.get("fault_injected")),
        "injection_attempted": False, "final_state_hash": last.state_hash,
        "sandbox": sandbox or getattr(env, "sandbox_kind", None),
    }
    return EpisodeRecord(episode, turns, events)


def _use_policy_context_tokens(obs_turn: dict[str, Any], out: PolicyOutput) -> int:
    """Record the tokens an LM policy rendered for the observation turn before its own turn (replacing the byte
    tokens), so the turns concatenate to the model's context. Returns the change of the turn's token count."""
    ids = np.asarray(out.context_token_ids, dtype=np.int32).reshape(-1)
    delta = ids.shape[0] - _n_tokens(obs_turn.get("token_ids"))
    obs_turn.update(token_ids=ids, loss_mask=np.zeros(ids.shape[0], dtype=np.int8),
                    tokenizer_id=out.context_tokenizer_id, tokens=ids.shape[0])
    return delta


@cache
def _has_context_strategy_column() -> bool:
    from trajlake.schema import table_def

    return any(c.name == "context_strategy" for c in table_def("turns").columns)


def _strategy_column(out: PolicyOutput) -> dict[str, Any]:
    # turns.context_strategy arrives with schema 1.1; before it the strategy is only in the run's config.
    return {"context_strategy": out.context_strategy} if _has_context_strategy_column() else {}


def _count_budget_on_fault(env: Env, res: StepResult, tokens: int, cost: float) -> StepResult:
    count = getattr(env, "count_external_step", None)
    if count is None:
        return res
    ended: StepResult | None = count(tokens, cost)
    if ended is None:
        return res
    return StepResult(observation=res.observation + "\n" + ended.observation, reward_components=ended.reward_components,
                      terminated=False, truncated=True, status="BUDGET_EXHAUSTED", cost_usd=ended.cost_usd,
                      state_hash=ended.state_hash, termination_reason=ended.termination_reason, tool=res.tool,
                      tool_seconds=ended.tool_seconds, fault_injected=res.fault_injected)


def _episode_error_class(success: bool, last: StepResult, statuses: Sequence[str]) -> str | None:
    if success:
        return None
    if last.truncated:
        if last.status == "ENV_BUG" or last.termination_reason == "env_failure":
            return "ENV_BUG"
        return "BUDGET_EXHAUSTED"
    if last.status == "ENV_BUG":
        return "ENV_BUG"
    if "SAFETY_BLOCK" in statuses and last.termination_reason == "safety_stop":
        return "SAFETY_BLOCK"
    invalid = sum(1 for s in statuses if s == "MODEL_INVALID_ACTION")
    if invalid * 2 > len(statuses):
        return "MODEL_INVALID_ACTION"
    return "MODEL_BAD_PLAN"


def _parse_action(action: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(action)
    except (ValueError, TypeError):
        return None
    return obj if isinstance(obj, dict) else None


def _tool_name(action: str) -> str | None:
    obj = _parse_action(action)
    tool = obj.get("tool") if obj else None
    return tool if isinstance(tool, str) else None


def _tool_args(action: str) -> str | None:
    obj = _parse_action(action)
    if obj is None or "args" not in obj:
        return None
    return json.dumps(obj["args"], sort_keys=True, ensure_ascii=False)


def replay_log_from_rows(episode: dict[str, Any], turns: Sequence[dict[str, Any]]) -> tuple[ReplayLog, list[int]]:
    """Rebuild the replay log of a stored episode; also returns each logged step's policy turn_idx.

    Steps whose call was replaced by an injected fault never reached the environment and are skipped."""
    ordered = sorted(turns, key=lambda t: t["turn_idx"])
    steps: list[LoggedStep] = []
    turn_of_step: list[int] = []
    i = 1
    while i < len(ordered):
        pol = ordered[i]
        obs = ordered[i + 1] if i + 1 < len(ordered) else None
        if pol["actor"] == "policy" and obs is not None:
            if not obs.get("fault_injected"):
                steps.append(LoggedStep(action=pol["raw_content"] or "", idempotency_key=pol.get("idempotency_key"),
                                        state_hash=obs["env_state_hash"], tokens=_n_tokens(pol.get("token_ids")),
                                        cost_usd=float(pol.get("cost_usd") or 0.0)))
                turn_of_step.append(pol["turn_idx"])
            i += 2
        else:
            i += 1
    log = ReplayLog(env_id=episode["env_id"], env_version=episode["env_version"], task_id=episode["task_id"],
                    task_version=episode["task_version"], seed=int(episode["env_seed"]),
                    reset_state_hash=ordered[0]["env_state_hash"], steps=steps)
    return log, turn_of_step


# -- running many episodes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkItem:
    task_id: str
    task_version: str
    seed: int
    attempt: int = 0


@dataclass(frozen=True)
class RolloutConfig:
    """A rollout run (what ``trajlake rollout`` is given)."""

    lake: str
    run_id: str
    env: str
    policy: str
    split: str
    seeds: tuple[int, ...]
    workers: int = 1
    fault_rate: float = 0.0
    fault_seed: int = 0
    policy_version: str | None = None
    max_policy_lag: int | None = None
    commit_every_s: float = 30.0
    """A worker commits its finished episodes about this often (0: after every episode). A crash loses at most
    the uncommitted ones, which the resumed run plays again. Each commit adds a version to three Delta tables
    and costs ~0.1 s whatever its size, so frequent commits from many workers grow the log that every reader
    replays and cost more per step (docs/benchmarks.md)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1
    """Attempts per (task, seed): attempt 0..N-1, one group (same group_id), distinct sampling seeds."""
    policy_args: dict[str, str] = field(default_factory=dict)
    """Settings of an LM policy (``--policy-arg KEY=VALUE``), recorded in the run's config."""
    task_ids: tuple[str, ...] = ()
    """Only these tasks of the split (empty: all)."""


@dataclass
class RolloutSummary:
    planned: int = 0
    skipped_existing: int = 0
    played: int = 0
    written: int = 0
    """Episodes of this run newly committed to the lake (counted in the lake after the workers finished)."""
    successes: int = 0
    failed_items: list[str] = field(default_factory=list)


class _Worker:
    """Per-process state: one environment, one policy, one writer."""

    def __init__(self, cfg: RolloutConfig):
        from trajlake import LakeWriter, open_lake
        from trajlake.envs import make_env, task_view_fn
        from trajlake.policies import make_rollout_policy
        from trajlake.rollout.versions import PolicyVersions

        self.cfg = cfg
        self.env = make_env(cfg.env, split=cfg.split, **cfg.env_kwargs)
        self.versions = PolicyVersions(Path(cfg.lake), cfg.policy)
        self.policy = make_rollout_policy(cfg.env, cfg.policy, self._current_version(), cfg.policy_args)
        self.task_view = task_view_fn(self.env, oracle=self.policy.needs_oracle)
        # The worker hands its finished episodes to the writer in one batch per commit (validation has a fixed
        # cost per call that a 3-step episode cannot amortise); the writer then commits in the background while
        # the next episodes play. Both buffers hold only unacknowledged episodes, which a resumed run replays.
        self.writer = LakeWriter(open_lake(cfg.lake), max_age_seconds=0.0, handle_signals=False)
        self.pending: list[EpisodeRecord] = []
        self.pending_since: float | None = None
        self.faults = FaultInjector(cfg.fault_rate, cfg.fault_seed)

    def _current_version(self) -> str:
        if self.cfg.policy_version:
            return self.cfg.policy_version
        return self.versions.latest_label()

    def run(self, item: WorkItem) -> tuple[str, bool]:
        # Episode-sticky versions: the version is pinned when an episode starts; between episodes a worker
        # whose version lags the latest published one by more than max_policy_lag moves to the latest.
        if self.cfg.max_policy_lag is not None and not self.cfg.policy_version:
            lag = self.versions.lag(self.policy.policy_version)
            if lag > self.cfg.max_policy_lag:
                self.policy.policy_version = self.versions.latest_label()
        rec = play_episode(self.env, self.policy, run_id=self.cfg.run_id, task_id=item.task_id,
                           task_version=item.task_version, seed=item.seed, attempt=item.attempt,
                           split=self.cfg.split, faults=self.faults, task_view=self.task_view)
        self.pending.append(rec)
        self.pending_since = self.pending_since if self.pending_since is not None else time.monotonic()
        if time.monotonic() - self.pending_since >= self.cfg.commit_every_s:
            self.hand_over()
        return rec.episode["episode_id"], bool(rec.episode["success"])

    def hand_over(self) -> None:
        """Give the pending episodes to the writer in one batch, which commits them (in the background unless
        ``commit_every_s`` is 0: then before this returns)."""
        batch, self.pending, self.pending_since = self.pending, [], None
        write_records(self.writer, batch, wait=self.cfg.commit_every_s <= 0)

    def close(self) -> None:
        try:
            self.hand_over()
        finally:
            self.writer.close()
            self.env.close()


_WORKER: _Worker | None = None


def _init_worker(cfg: RolloutConfig) -> None:
    global _WORKER
    _WORKER = _Worker(cfg)
    # Pool workers leave through multiprocessing's exit path: commit what the writer still buffers.
    mp_util.Finalize(_WORKER, _WORKER.close, exitpriority=10)


def _run_item(item: WorkItem) -> tuple[str, bool, str | None]:
    assert _WORKER is not None
    try:
        ep, ok = _WORKER.run(item)
        return ep, ok, None
    except Exception as e:  # one broken episode must not stop the run; it is reported and retried on resume
        return f"{item.task_id}/s{item.seed}", False, f"{type(e).__name__}: {e}"


def plan(cfg: RolloutConfig) -> list[WorkItem]:
    from trajlake.envs import list_tasks

    tasks = list_tasks(cfg.env, cfg.split, **cfg.env_kwargs)
    if cfg.task_ids:
        missing = set(cfg.task_ids) - {t["task_id"] for t in tasks}
        if missing:
            from trajlake.errors import TrajlakeError

            raise TrajlakeError(f"--tasks: not in split {cfg.split!r}: {', '.join(sorted(missing))}")
        tasks = [t for t in tasks if t["task_id"] in cfg.task_ids]
    return [WorkItem(t["task_id"], t["task_version"], s, a) for t in tasks for s in cfg.seeds
            for a in range(cfg.attempts)]


def existing_episode_ids(lake: str, run_id: str) -> set[str]:
    from trajlake import connect

    con = connect(lake)
    return {r[0] for r in con.execute("select episode_id from episodes where run_id = ?", [run_id]).fetchall()}


def run_rollout(cfg: RolloutConfig, engine: str = "local",
                progress: Callable[[int, int], None] | None = None) -> RolloutSummary:
    """Play every (task, seed) of the split not yet in the lake for this run; write tasks and the run row."""
    from trajlake import LakeWriter, connect, open_lake
    from trajlake.envs import list_tasks, task_rows
    from trajlake.errors import ConflictError

    lake = open_lake(cfg.lake, create=True)
    config = json.dumps(_config_json(cfg), sort_keys=True)
    old = connect(lake).execute("select config from runs where run_id = ?", [cfg.run_id]).fetchall()
    if old and old[0][0] != config:
        raise ConflictError(f"run {cfg.run_id!r} exists with another configuration ({old[0][0]}); resume it with "
                            f"the same options or choose a new --run-id")
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_tasks(task_rows(cfg.env, list_tasks(cfg.env, None, **cfg.env_kwargs)))
        if not old:
            w.write_runs([{"run_id": cfg.run_id, "created_at": utcnow(), "label": cfg.run_id, "config": config,
                           "policy_name": cfg.policy, "policy_version": cfg.policy_version,
                           "code_version": _code_version()}])
    items = plan(cfg)
    done = existing_episode_ids(cfg.lake, cfg.run_id)
    todo = [it for it in items if episode_id_for(cfg.run_id, it.task_id, it.task_version, it.seed, it.attempt)
            not in done]
    summary = RolloutSummary(planned=len(items), skipped_existing=len(items) - len(todo))
    results: Iterable[tuple[str, bool, str | None]]
    if engine == "ray":
        results = _run_ray(cfg, todo)
    elif cfg.workers <= 1:
        _init_worker(cfg)
        results = (_run_item(it) for it in todo)
    else:
        results = _run_pool(cfg, todo)
    for n, (ep, ok, err) in enumerate(results, start=1):
        if err is not None:
            summary.failed_items.append(f"{ep}: {err}")
        else:
            summary.played += 1
            summary.successes += int(ok)
        if progress:
            progress(n, len(todo))
    if engine != "ray" and cfg.workers <= 1 and _WORKER is not None:
        _WORKER.close()
    summary.written = len(existing_episode_ids(cfg.lake, cfg.run_id)) - len(done)
    if summary.written < summary.played:
        summary.failed_items.append(f"{summary.played - summary.written} played episode(s) were not committed; "
                                    f"run the same command again to resume")
    return summary


def _run_pool(cfg: RolloutConfig, todo: list[WorkItem]) -> Iterator[tuple[str, bool, str | None]]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(cfg.workers, initializer=_init_worker, initargs=(cfg,)) as pool:
        yield from pool.imap_unordered(_run_item, todo, chunksize=1)
        pool.close()
        pool.join()


def _run_ray(cfg: RolloutConfig, todo: list[WorkItem]) -> Iterator[tuple[str, bool, str | None]]:
    try:
        import ray
    except ImportError as e:
        from trajlake.errors import TrajlakeError

        raise TrajlakeError("--engine ray needs Ray: pip install 'trajlake[ray]'") from e
    if not ray.is_initialized():
        ray.init(num_cpus=max(1, cfg.workers), include_dashboard=False, log_to_driver=False)

    ray_worker: Any = ray.remote(_RayWorker)
    actors: list[Any] = [ray_worker.remote(cfg) for _ in range(max(1, cfg.workers))]
    pending = {}
    queue = list(todo)
    for a in actors:
        if queue:
            pending[a.run.remote(queue.pop(0))] = a
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        ref = ready[0]
        actor = pending.pop(ref)
        yield ray.get(ref)
        if queue:
            pending[actor.run.remote(queue.pop(0))] = actor
    ray.get([a.close.remote() for a in actors])


class _RayWorker:
    """A Ray actor holding one worker (module level, so Ray serialises it by reference)."""

    def __init__(self, cfg: RolloutConfig):
        _init_worker(cfg)

    def run(self, item: WorkItem) -> tuple[str, bool, str | None]:
        return _run_item(item)

    def close(self) -> None:
        if _WORKER is not None:
            _WORKER.close()


def _config_json(cfg: RolloutConfig) -> dict[str, Any]:
    return {"env": cfg.env, "policy": cfg.policy, "split": cfg.split, "fault_rate": cfg.fault_rate,
            "fault_seed": cfg.fault_seed, "policy_version": cfg.policy_version, "max_policy_lag": cfg.max_policy_lag,
            "env_kwargs": cfg.env_kwargs,
            # Keys added after the first runs appear only when set, so resuming an older run still matches.
            **({"attempts": cfg.attempts} if cfg.attempts != 1 else {}),
            **({"policy_args": cfg.policy_args} if cfg.policy_args else {}),
            **({"task_ids": list(cfg.task_ids)} if cfg.task_ids else {})}


def _code_version() -> str:
    from trajlake._version import __version__

    return os.environ.get("TRAJLAKE_CODE_VERSION", __version__)


__all__ = ["EpisodeRecord", "RolloutConfig", "RolloutSummary", "WorkItem", "play_episode", "replay_log_from_rows",
           "run_rollout", "write_records"]
