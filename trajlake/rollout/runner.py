"""The rollout runner: play episodes of an environment with a policy and write them to the lake.

Each episode has a deterministic id (run, task, task version, seed, attempt), so a run that crashed or was
interrupted resumes by skipping the episodes already committed, and never duplicates one. Workers are processes
(``engine="local"``) or Ray tasks (``engine="ray"``); each worker has its own LakeWriter and commits after every
episode, so a worker crash loses at most the episode it was playing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trajlake.envs.core import Env, LoggedStep, ReplayLog, StepResult
from trajlake.envs.policy import (
    BYTE_TOKENIZER_ID,
    ContextSummary,
    Policy,
    PolicyOutput,
    TaskView,
    byte_tokenize,
)
from trajlake.errors import TrajlakeError, one_line
from trajlake.lake.storage import is_uri
from trajlake.record.episode import CostModel, build_episode, price_turns, utcnow
from trajlake.rollout.faults import (
    DEFAULT_FAULT_KINDS,
    NOT_EXECUTED_FAULT_KINDS,
    REPLACING_FAULT_KINDS,
    FaultInjector,
    check_fault_kinds,
)
from trajlake.schemas.vocab import (
    MODEL_STATUSES,
    Actor,
    ErrorClass,
    FaultKind,
    Role,
    Status,
    TerminationReason,
)

if TYPE_CHECKING:
    import duckdb

    from trajlake.record.writer import LakeWriter


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
                 task_view: Callable[[str, str], TaskView] | None = None, sandbox: str | None = None,
                 cost_model: CostModel | None = None, policy_lag: int | None = None,
                 at_turn_boundary: Callable[[Policy], None] | None = None) -> EpisodeRecord:
    """Play one episode and return its rows. ``task_view(task_id, task_version)`` gives the policy's view
    (default: the environment's own, without privileged data); ``cost_model`` prices the turns.
    ``at_turn_boundary(policy)`` runs before every policy turn after the first (a turn boundary: the previous
    observation is in, no token of the next action drawn yet) and may switch the policy to a newer version; each
    policy turn records the version that produced it, and the episode its first and last
    (``policy_version_start`` / ``_end``)."""
    faults = faults or FaultInjector()
    start = utcnow()
    r = env.reset(seed, task_version, task_id=task_id)
    ep_id = episode_id_for(run_id, r.task_id, r.task_version, seed, attempt)
    view = (task_view or (lambda i, v: env.task_view(i, v, oracle=policy.needs_oracle)))(r.task_id, r.task_version)
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
    add_turn(role=Role.USER, actor=Actor.USER, raw_content=r.observation, token_ids=obs_ids,
             loss_mask=np.zeros(obs_ids.shape[0], dtype=np.int8), tokenizer_id=BYTE_TOKENIZER_ID,
             observation_hash=_hash_text(r.observation), env_state_hash=r.state_hash, started_at=start,
             ended_at=max(now, start), latency_ms=(now - start).total_seconds() * 1000, status=Status.OK,
             tokens=len(obs_ids), cost_usd=0.0, tool_seconds=0.0)
    observation = r.observation
    step_idx = 0
    last: StepResult | None = None
    statuses: list[str] = []
    versions_played: list[str] = []
    while True:
        if at_turn_boundary is not None and step_idx > 0:
            at_turn_boundary(policy)
        pv = policy.policy_version
        versions_played.append(pv)
        t0 = utcnow()
        out = policy.act(observation)
        t1 = utcnow()
        action = out.action
        tool = _tool_name(action)
        key = f"{ep_id}#{step_idx}"
        if out.context_token_ids is not None:
            _use_policy_context_tokens(turns[-1], out)
        if out.summary is not None:  # the summary the policy's context now holds, just before the reply
            _add_summary_turn(add_turn, out.summary, t0)
        n_out = _n_tokens(out.token_ids) if out.completion_tokens is None else out.completion_tokens
        pol_idx = add_turn(role=Role.ASSISTANT, actor=Actor.POLICY, policy_version=pv, raw_content=action,
                           token_ids=_array(out.token_ids, np.int32), loss_mask=_array(out.loss_mask, np.int8),
                           behavior_logprobs=_array(out.behavior_logprobs, np.float32),
                           tokenizer_id=out.tokenizer_id, action_schema=tool, tool_call_id=f"call-{step_idx}",
                           tool_args=_tool_args(action), idempotency_key=key, started_at=t0, ended_at=t1,
                           latency_ms=(t1 - t0).total_seconds() * 1000, status=out.status or Status.OK,
                           tokens=n_out, prompt_tokens=out.prompt_tokens, cost_usd=out.cost_usd, tool_seconds=0.0,
                           context_dropped_hash=out.context_dropped_hash, context_strategy=out.context_strategy)
        fault = faults.decide(ep_id, step_idx)
        # budgets count the policy's own reported cost; priced costs are added when the episode is recorded
        step_cost = float(out.cost_usd or 0.0)
        if fault in REPLACING_FAULT_KINDS:
            # The call never reaches the environment: its state is unchanged, the agent sees an error.
            res = StepResult(observation=FaultInjector.observation(fault), reward_components={}, terminated=False,
                             truncated=False, status=Status.ENV_TRANSIENT, cost_usd=0.0,
                             state_hash=last.state_hash if last else r.state_hash, tool=tool, fault_injected=fault)
            # Budgets still count the policy's turn: a faulty environment cannot extend an episode forever.
            res = _count_budget_on_fault(env, res, n_out, step_cost)
        elif fault is not None and fault in env.fault_kinds:
            res = env.step_with_fault(fault, action, key, tokens=n_out, cost_usd=step_cost)
        else:
            res = env.step(action, key, tokens=n_out, cost_usd=step_cost)
            if fault == FaultKind.CONTEXT_TRIM:
                # The call ran and its answer is seen whole; the policy's next context then loses every earlier
                # action/observation pair (recorded only when the policy had something to lose).
                if not res.done and policy.forget_context():
                    res = dataclasses.replace(res, fault_injected=fault)
            elif fault is not None and not res.done:  # a perturbed answer of a call that ran (not the last one)
                seen = FaultInjector.observation(fault) if fault == FaultKind.SLOW_RESPONSE \
                    else FaultInjector.truncate(res.observation)
                status = Status.ENV_TRANSIENT if fault == FaultKind.SLOW_RESPONSE else res.status
                # what the agent sees is the infrastructure's now, even for a user's answer
                res = dataclasses.replace(res, observation=seen, status=status, fault_injected=fault,
                                          observation_actor=Actor.ENV)
        t2 = utcnow()
        statuses.append(res.status)
        if res.status in MODEL_STATUSES and turns[pol_idx]["status"] != Status.ENV_TRANSIENT:
            turns[pol_idx]["status"] = res.status  # a retried model call stays recorded as infrastructure
        for j, ev in enumerate(res.gateway_events):
            events.append({**ev, "episode_id": ep_id, "run_id": run_id, "turn_idx": pol_idx, "event_idx": j})
        obs_ids = byte_tokenize(res.observation)
        # A simulated user's answer (ask_user) is the user's turn, not tool output: mask 0 either way.
        by_user = res.observation_actor == Actor.USER
        add_turn(role=Role.USER if by_user else Role.TOOL, actor=Actor.USER if by_user else Actor.ENV,
                 raw_content=res.observation, token_ids=obs_ids,
                 loss_mask=np.zeros(obs_ids.shape[0], dtype=np.int8), tokenizer_id=BYTE_TOKENIZER_ID,
                 action_schema=res.tool, tool_call_id=f"call-{step_idx}", observation_hash=_hash_text(res.observation),
                 env_state_hash=res.state_hash, started_at=t1, ended_at=t2,
                 latency_ms=(t2 - t1).total_seconds() * 1000, status=res.status, tokens=len(obs_ids),
                 cost_usd=res.cost_usd, tool_seconds=res.tool_seconds, fault_injected=res.fault_injected,
                 reward_components=dict(res.reward_components) or None)
        observation = res.observation
        last = res
        step_idx += 1
        if res.done:
            break
    final = policy.observation_tokens(observation)
    if final is not None:  # the last observation in the policy's tokenizer too: one tokenizer per episode
        _use_policy_context_tokens(turns[-1], PolicyOutput("", pv, context_token_ids=final[0],
                                                           context_tokenizer_id=final[1]))
    _one_tokenizer(turns)
    end = utcnow()
    comps = dict(last.reward_components) if last else {}
    graded = env.success_component in comps
    success = bool(comps[env.success_component] >= 1.0) if graded else None
    reason = last.termination_reason or (TerminationReason.BUDGET_STEPS if last.truncated
                                         else TerminationReason.SUBMITTED)
    error_class = _episode_error_class(bool(success), last, statuses)
    if policy.needs_oracle and not success:
        # The known fix did not solve the task: the task or the environment is broken, not the model.
        error_class = ErrorClass.ENV_BUG
    price_turns(turns, cost_model or CostModel())
    episode = build_episode({
        "episode_id": ep_id, "run_id": run_id, "task_id": r.task_id, "task_version": r.task_version, "split": split,
        "env_id": env.env_id, "env_version": env.env_version, "env_image_digest": env.image_digest, "env_seed": seed,
        "attempt": attempt, "policy_version_start": versions_played[0] if versions_played else pv,
        "policy_version_end": pv, "started_at": start,
        "ended_at": end, "terminated": last.terminated, "truncated": last.truncated, "termination_reason": reason,
        "error_class": error_class, "success": success, "reward_total": float(sum(comps.values())),
        "reward_components": comps, "wall_seconds": (end - start).total_seconds(),
        "injection_attempted": bool(env.injection_attempted),
        "attack_success": None if env.attack_success is None else bool(env.attack_success), "final_state_hash": last.state_hash,
        "sandbox": sandbox or env.sandbox_kind,
        "verification_source": env.verification_source if graded else None, "policy_lag": policy_lag,
    }, turns)
    return EpisodeRecord(episode, turns, events)


def _one_tokenizer(turns: list[dict[str, Any]]) -> None:
    """One tokenizer per episode: when the policy recorded its own token ids (an LM's tokenizer, a server's
    ``served:MODEL``), turns it did not tokenize keep no byte tokens: they become text only (``token_ids``,
    ``loss_mask`` and ``tokenizer_id`` null; ``tokens`` keeps its count). These are the observations no model
    context holds: the last one of a chat-mode ``openai:`` episode (the server tokenizes only what it is sent, and
    nothing is sent after the last observation) and the read-outs of a ``single-turn:`` wrapper. Before, they were
    stored as ``trajlake-bytes-v1`` ids beside ``served:...`` ones, which no trainer can concatenate."""
    if not any(t.get("tokenizer_id") not in (None, BYTE_TOKENIZER_ID) for t in turns):
        return  # scripted policies and text-only servers: byte tokens throughout (or none), one tokenizer
    for t in turns:
        if t.get("tokenizer_id") == BYTE_TOKENIZER_ID:
            t.update(token_ids=None, loss_mask=None, tokenizer_id=None)


def _add_summary_turn(add_turn: Callable[..., int], summary: ContextSummary, at: Any) -> None:
    """Record a context summary as an actor ``summarizer`` turn: its tokens as the model saw them, loss mask 0
    and no log-probs (the policy did not write it), the summariser's version and the hash of what it replaced."""
    ids = np.asarray(summary.token_ids, dtype=np.int32).reshape(-1)
    end = at + dt.timedelta(seconds=summary.seconds)
    add_turn(role=Role.USER, actor=Actor.SUMMARIZER, raw_content=summary.text, token_ids=ids,
             loss_mask=np.zeros(ids.shape[0], dtype=np.int8), tokenizer_id=summary.tokenizer_id, started_at=at,
             ended_at=end, latency_ms=summary.seconds * 1000, status=Status.OK, tokens=int(ids.shape[0]),
             cost_usd=0.0, tool_seconds=0.0, summary_version=summary.summary_version,
             context_dropped_hash=summary.context_dropped_hash, context_strategy="summarize")


def _use_policy_context_tokens(obs_turn: dict[str, Any], out: PolicyOutput) -> None:
    """Record the tokens an LM policy rendered for the observation turn before its own turn (replacing the byte
    tokens), so the turns' token ids concatenate to the model's context."""
    ids = np.asarray(out.context_token_ids, dtype=np.int32).reshape(-1)
    obs_turn.update(token_ids=ids, loss_mask=np.zeros(ids.shape[0], dtype=np.int8),
                    tokenizer_id=out.context_tokenizer_id, tokens=ids.shape[0])


def _count_budget_on_fault(env: Env, res: StepResult, tokens: int, cost: float) -> StepResult:
    ended = env.count_external_step(tokens, cost)
    if ended is None:
        return res
    return StepResult(observation=res.observation + "\n" + ended.observation, reward_components=ended.reward_components,
                      terminated=False, truncated=True, status=Status.BUDGET_EXHAUSTED, cost_usd=ended.cost_usd,
                      state_hash=ended.state_hash, termination_reason=ended.termination_reason, tool=res.tool,
                      tool_seconds=ended.tool_seconds, fault_injected=res.fault_injected)


def _episode_error_class(success: bool, last: StepResult, statuses: Sequence[str]) -> ErrorClass | None:
    if success:
        return None
    if last.truncated:
        if last.status == Status.ENV_BUG or last.termination_reason == TerminationReason.ENV_FAILURE:
            return ErrorClass.ENV_BUG
        return ErrorClass.BUDGET_EXHAUSTED
    if last.status == Status.ENV_BUG:
        return ErrorClass.ENV_BUG
    if Status.SAFETY_BLOCK in statuses and last.termination_reason == TerminationReason.SAFETY_STOP:
        return ErrorClass.SAFETY_BLOCK
    invalid = sum(1 for s in statuses if s == Status.MODEL_INVALID_ACTION)
    if invalid * 2 > len(statuses):
        return ErrorClass.MODEL_INVALID_ACTION
    return ErrorClass.MODEL_BAD_PLAN


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

    Steps whose call an injected fault kept from running (``NOT_EXECUTED_FAULT_KINDS``) are skipped; a call
    that ran under a fault (a slow or truncated answer, a flaky test run) is replayed like any other."""
    ordered = sorted(turns, key=lambda t: t["turn_idx"])
    steps: list[LoggedStep] = []
    turn_of_step: list[int] = []
    i = 1
    while i < len(ordered):
        pol = ordered[i]
        obs = ordered[i + 1] if i + 1 < len(ordered) else None
        if pol["actor"] == "policy" and obs is not None:
            if obs.get("fault_injected") not in NOT_EXECUTED_FAULT_KINDS:
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
    fault_kinds: tuple[str, ...] = DEFAULT_FAULT_KINDS
    """Kinds the injector draws from (``--fault-kinds``)."""
    held_out_fault_kind: str | None = None
    """A kind never injected in this run (``--held-out-fault-kind``): training rollouts leave it out; the
    held-out evaluation run plays ``fault_kinds=(K,)``."""
    max_policy_lag: int | None = None
    turn_upgrades: bool = False
    """Turn-boundary upgrades: before each policy turn after an episode's first, a worker whose policy is behind
    the newest published version that has a checkpoint (``PolicyVersions.publish(label, checkpoint=...)``) loads
    it and plays the rest of the episode with it; never within a turn. Each policy turn records its version
    (``turns.policy_version``), the episode its first and last. Needs a policy that can load a checkpoint (``hf:``)
    and one episode at a time per worker (``batch_episodes`` = 1: a shared model would switch inside other
    episodes' turns)."""
    commit_every_s: float = 30.0
    """A worker commits its finished episodes about this often (0: after every episode). A crash loses at most
    the uncommitted ones, which the resumed run plays again. Each commit adds a version to three Delta tables
    and costs ~0.1 s whatever its size, so frequent commits from many workers grow the log that every reader
    replays and cost more per step (docs/benchmarks.md)."""
    max_pending_episodes: int = 256
    """The most finished episodes a worker holds before handing them to its writer, whatever
    ``commit_every_s`` says. With the writer's own bound (it commits one batch at a time and the hand-over waits
    for the previous commit), a worker whose writer is slower than its player holds at most twice this many
    unacknowledged episodes: the player waits instead of piling them up (a bounded queue)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    cost_model: CostModel = field(default_factory=CostModel)
    """Prices of the run's tokens and tool time (recorded in the run's config)."""
    engine: str = "local"
    """local (processes) or ray; recorded so the run can be played again the same way."""
    attempts: int = 1
    """Attempts per (task, seed): attempt 0..N-1, one group (same group_id), distinct sampling seeds."""
    policy_args: dict[str, str] = field(default_factory=dict)
    """Settings of a language-model policy (``--policy-arg KEY=VALUE``), recorded in the run's config."""
    task_ids: tuple[str, ...] = ()
    """Only these tasks of the split (empty: all)."""
    data_cutoff: str | None = None
    """The policy's training-data cutoff (ISO-8601), for the contamination scan's time split: tasks created
    before it may have been seen in training (``trajlake contamination``)."""
    label: str | None = None
    """``runs.label`` (default: the run id); the trainer labels a stage's runs with the stage name (B1, R1)."""
    policy_name: str | None = None
    """``runs.policy_name`` and the name its versions are published under (``PolicyVersions``; default: the
    policy spec). The trainer gives all its checkpoints one name so that lag counts across them."""
    sampling_seed_rule: str | None = None
    """How the policy's sampling seeds were derived (``runs.config.sampling_seed_rule``), set by the trainer:
    common seeds for evaluation runs (paired comparisons across policies), a fresh stream per policy version for
    training rollouts. None: not recorded (the LM policy's default rule, ``trajlake.policies.lm.sampling_seed``)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Free labels recorded in ``runs.config.tags`` (``trajlake experiment`` names its experiment, arm and training
    seed there); they do not change what the run plays, so a resumed run may differ in them."""
    ray_address: str | None = None
    """The Ray cluster ``engine="ray"`` attaches to (``--ray-address``): ``host:port`` of its head, ``ray://...``
    (Ray Client) or ``auto`` (the cluster ``ray start`` last started on this machine); default ``$RAY_ADDRESS``.
    With neither, a new local cluster with ``workers`` CPUs is started. Not recorded: where a run plays does not
    change what it plays."""


@dataclass
class RolloutSummary:
    planned: int = 0
    skipped_existing: int = 0
    played: int = 0
    written: int = 0
    """Episodes of this run newly committed to the lake (counted in the lake after the workers finished)."""
    successes: int = 0
    failed_items: list[str] = field(default_factory=list)
    worker_stats: list[dict[str, float]] = field(default_factory=list)
    """Per Ray worker that finished: episodes played, the most unacknowledged episodes it held
    (``max_held_episodes``), hand-overs forced by ``max_pending_episodes``, its peak RSS in MB."""
    ray_cluster: str | None = None
    """``engine="ray"``: the GCS address of the cluster the run played on."""
    ray_nodes: list[str] = field(default_factory=list)
    """``engine="ray"``: the ids of the Ray nodes its workers ran on."""


class _Worker:
    """Per-process state: one environment, one policy, one writer."""

    def __init__(self, cfg: RolloutConfig):
        from trajlake.envs import make_env, task_view_fn
        from trajlake.lake.store import Lake
        from trajlake.policies import make_rollout_policy
        from trajlake.record.writer import LakeWriter
        from trajlake.rollout.versions import PolicyVersions

        self.cfg = cfg
        self.env = make_env(cfg.env, split=cfg.split, **cfg.env_kwargs)
        self.versions = PolicyVersions(cfg.lake, cfg.policy_name or cfg.policy)
        self.policy = make_rollout_policy(cfg.env, cfg.policy, self._current_version(), cfg.policy_args)
        self.task_view = task_view_fn(self.env, oracle=self.policy.needs_oracle)
        # The episodes it plays at once (a batched policy's): each on a thread with an environment and a policy
        # of its own; the policies share one model, which decodes their turns together.
        self.batch = max(1, self.policy.batch_episodes)
        if cfg.turn_upgrades and not hasattr(self.policy, "load_checkpoint"):
            raise TrajlakeError(f"turn_upgrades: policy {cfg.policy} cannot load a checkpoint between turns (an hf: "
                                f"policy can)")
        if cfg.turn_upgrades and self.batch > 1:
            raise TrajlakeError(f"turn_upgrades: batch_episodes = {self.batch} shares one model between episodes, "
                                f"which would switch inside their turns; use batch_episodes = 1")
        self.slots: queue.SimpleQueue[tuple[Env, Policy, Callable[[str, str], TaskView]]] = queue.SimpleQueue()
        if self.batch == 1:
            self.slots.put((self.env, self.policy, self.task_view))
        else:
            for i, policy in enumerate(self.policy.concurrent(self.batch)):
                env = self.env if i == 0 else make_env(cfg.env, split=cfg.split, **cfg.env_kwargs)
                self.slots.put((env, policy, task_view_fn(env, oracle=policy.needs_oracle)))
        self.lock = threading.Lock()
        """Guards what the episodes' threads share: versions, the pending episodes, the writer."""
        # The worker hands its finished episodes to the writer in one batch per commit (validation has a fixed
        # cost per call that a 3-step episode cannot amortise); the writer then commits in the background while
        # the next episodes play. Both buffers hold only unacknowledged episodes, which a resumed run replays.
        self.writer = LakeWriter(Lake.open(cfg.lake), max_age_seconds=0.0, handle_signals=False)
        self.pending: list[EpisodeRecord] = []
        self.pending_since: float | None = None
        self.handed = 0  # episodes of the last hand-over (unacknowledged while its commit runs)
        self.played = 0
        self.max_held = 0
        self.cap_handovers = 0
        self.faults = FaultInjector(cfg.fault_rate, cfg.fault_seed, tuple(cfg.fault_kinds), cfg.held_out_fault_kind)

    def _current_version(self) -> str:
        if self.cfg.policy_version:
            return self.cfg.policy_version
        return self.versions.latest_label()

    def run(self, item: WorkItem) -> tuple[str, bool]:
        """Play one episode (thread-safe: up to ``batch`` at once, one per slot)."""
        env, policy, task_view = slot = self.slots.get()
        try:
            with self.lock:
                # Episode-sticky versions: the version is pinned when an episode starts; between episodes a
                # worker whose version lags the latest published one by more than max_policy_lag moves to it.
                if self.cfg.max_policy_lag is not None and not self.cfg.policy_version:
                    lag = self.versions.lag(policy.policy_version)
                    if lag > self.cfg.max_policy_lag:
                        policy.policy_version = self.versions.latest_label()
                lag = self.versions.lag(policy.policy_version)
            rec = play_episode(env, policy, run_id=self.cfg.run_id, task_id=item.task_id,
                               task_version=item.task_version, seed=item.seed, attempt=item.attempt,
                               split=self.cfg.split, faults=self.faults, task_view=task_view,
                               cost_model=self.cfg.cost_model, policy_lag=lag,
                               at_turn_boundary=self.upgrade if self.cfg.turn_upgrades else None)
        finally:
            self.slots.put(slot)
        with self.lock:
            self._keep(rec)
        return rec.episode["episode_id"], bool(rec.episode["success"])

    def upgrade(self, policy: Policy) -> None:
        """At a turn boundary (``turn_upgrades``): load the newest published version that has a checkpoint, when
        the policy is behind it."""
        with self.lock:
            latest = next((v for v in reversed(self.versions.all()) if self.versions.checkpoint(v)), None)
            if latest is None or latest == policy.policy_version or self.versions.lag(policy.policy_version) == 0:
                return
            folder = self.versions.checkpoint(latest)
        assert folder is not None
        load = getattr(policy, "load_checkpoint", None)
        if load is None:
            raise TrajlakeError(f"turn_upgrades: policy {self.cfg.policy} cannot load a checkpoint between turns "
                                f"(an hf: policy can)")
        load(latest, folder)

    def _keep(self, rec: EpisodeRecord) -> None:
        self.pending.append(rec)
        self.played += 1
        self.max_held = max(self.max_held, len(self.pending) + (self.handed if self.writer.committing else 0))
        self.pending_since = self.pending_since if self.pending_since is not None else time.monotonic()
        if len(self.pending) >= self.cfg.max_pending_episodes:
            self.cap_handovers += 1
            self.hand_over()  # waits for the writer's previous commit: the player slows to the writer's pace
        elif time.monotonic() - self.pending_since >= self.cfg.commit_every_s:
            self.hand_over()

    def hand_over(self) -> None:
        """Give the pending episodes to the writer in one batch, which commits them (in the background unless
        ``commit_every_s`` is 0: then before this returns)."""
        batch, self.pending, self.pending_since = self.pending, [], None
        write_records(self.writer, batch, wait=self.cfg.commit_every_s <= 0)
        self.handed = len(batch)

    def stats(self) -> dict[str, float]:
        import resource

        return {"played": self.played, "max_held_episodes": self.max_held, "cap_handovers": self.cap_handovers,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def close(self) -> None:
        try:
            self.hand_over()
        finally:
            self.writer.close()
            envs = [self.env]
            while not self.slots.empty():
                env = self.slots.get()[0]
                if env is not self.env:
                    envs.append(env)
            for env in envs:
                env.close()


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


def _run_items(items: Sequence[WorkItem]) -> Iterator[tuple[str, bool, str | None]]:
    """Play ``items`` on this process's worker, as many at once as its policy batches, as they finish."""
    assert _WORKER is not None
    if _WORKER.batch <= 1:
        yield from (_run_item(it) for it in items)
        return
    # one thread per episode in flight: a finished episode's thread takes the next item (continuous batching)
    with ThreadPoolExecutor(_WORKER.batch, thread_name_prefix="trajlake-episode") as pool:
        for done in as_completed([pool.submit(_run_item, it) for it in items]):
            yield done.result()


def _run_chunk(items: Sequence[WorkItem]) -> list[tuple[str, bool, str | None]]:
    return list(_run_items(items))


def plan(cfg: RolloutConfig) -> list[WorkItem]:
    from trajlake.envs import list_tasks

    tasks = list_tasks(cfg.env, cfg.split, **cfg.env_kwargs)
    if cfg.task_ids:
        missing = set(cfg.task_ids) - {t["task_id"] for t in tasks}
        if missing:
            raise TrajlakeError(f"--tasks: not in split {cfg.split!r}: {', '.join(sorted(missing))}")
        tasks = [t for t in tasks if t["task_id"] in cfg.task_ids]
    return [WorkItem(t["task_id"], t["task_version"], s, a) for t in tasks for s in cfg.seeds
            for a in range(cfg.attempts)]


def existing_episode_ids(con: duckdb.DuckDBPyConnection, run_id: str) -> set[str]:
    """The run's committed episode ids, read on ``con`` (a :func:`trajlake.query.connect` connection)."""
    return {r[0] for r in con.execute("select episode_id from episodes where run_id = ?", [run_id]).fetchall()}


def run_rollout(cfg: RolloutConfig, engine: str | None = None,
                progress: Callable[[int, int], None] | None = None) -> RolloutSummary:
    """Play every (task, seed) of the split not yet in the lake for this run; write tasks and the run row.
    ``engine`` overrides ``cfg.engine``."""
    if engine is not None and engine != cfg.engine:
        cfg = dataclasses.replace(cfg, engine=engine)
    engine = cfg.engine
    from trajlake.envs import check_injection, list_tasks, make_policy, spec, task_rows
    from trajlake.errors import ConflictError
    from trajlake.lake.store import Lake
    from trajlake.policies import check_policy_spec, checkpoint_hash, is_lm_policy, lm_run_config
    from trajlake.provenance import code_version
    from trajlake.query import connect
    from trajlake.record.writer import LakeWriter

    if cfg.env_kwargs.get("injection"):  # one clear error before anything is written
        check_injection(cfg.env, str(cfg.env_kwargs["injection"]))
    injector = FaultInjector(cfg.fault_rate, cfg.fault_seed, tuple(cfg.fault_kinds), cfg.held_out_fault_kind)
    env_class = spec(cfg.env).env_class()
    check_fault_kinds(injector.active_kinds if cfg.fault_rate > 0 else (), cfg.env,
                      env_class.fault_kinds if env_class is not None else ())
    lake = Lake.init(cfg.lake)
    settings = _config_json(cfg)
    settings.update(lm_run_config(cfg.policy, cfg.policy_args,
                                 env_class.tool_docs_for(cfg.env_kwargs) if env_class is not None else {}))
    # one connection for what the lake holds before this call: the run's row and its episodes (a connection
    # costs a second on an object store)
    before = connect(lake)
    old = before.execute("select config from runs where run_id = ?", [cfg.run_id]).fetchall()
    done = existing_episode_ids(before, cfg.run_id)
    before.close()
    if old:
        recorded = _identity(json.loads(old[0][0] or "{}"))
        now = _identity(settings)
        if any(now.get(k) != v for k, v in recorded.items()):
            raise ConflictError(f"run {cfg.run_id!r} exists with another configuration ({old[0][0]}); resume it "
                                f"with the same options or choose a new --run-id")
    probe = make_policy(cfg.env, cfg.policy, cfg.policy_version or "check") if not is_lm_policy(cfg.policy) \
        else None  # an LM policy is checked without loading its model (check_policy_spec)
    check_policy_spec(cfg.env, cfg.policy, cfg.policy_args)
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_tasks(task_rows(cfg.env, list_tasks(cfg.env, None, **cfg.env_kwargs), **cfg.env_kwargs))
        if not old:
            w.write_runs([{"run_id": cfg.run_id, "created_at": utcnow(), "label": cfg.label or cfg.run_id,
                           "config": json.dumps(settings, sort_keys=True),
                           "policy_name": cfg.policy_name or cfg.policy,
                           "policy_version": cfg.policy_version,
                           "policy_checkpoint_hash": getattr(probe, "checkpoint_hash", None) if probe is not None
                           else checkpoint_hash(cfg.policy),
                           "code_version": code_version()}])
    items = plan(cfg)
    todo = [it for it in items if episode_id_for(cfg.run_id, it.task_id, it.task_version, it.seed, it.attempt)
            not in done]
    summary = RolloutSummary(planned=len(items), skipped_existing=len(items) - len(todo))
    results: Iterable[tuple[str, bool, str | None]]
    if engine == "ray":
        results = _run_ray(cfg, todo, summary)
    elif cfg.workers <= 1:
        _init_worker(cfg)
        results = _run_items(todo)
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
    summary.written = len(existing_episode_ids(connect(lake), cfg.run_id)) - len(done)
    if summary.written < summary.played:
        summary.failed_items.append(f"{summary.played - summary.written} played episode(s) were not committed; "
                                    f"run the same command again to resume")
    return summary


def _run_pool(cfg: RolloutConfig, todo: list[WorkItem]) -> Iterator[tuple[str, bool, str | None]]:
    from trajlake.policies import batch_episodes

    ctx = mp.get_context("spawn")
    batch = batch_episodes(cfg.policy, cfg.policy_args)
    with ctx.Pool(cfg.workers, initializer=_init_worker, initargs=(cfg,)) as pool:
        if batch <= 1:
            yield from pool.imap_unordered(_run_item, todo, chunksize=1)
        else:  # a worker plays a chunk's episodes `batch` at once
            size = max(1, min(2 * batch, -(-len(todo) // cfg.workers)))
            for results in pool.imap_unordered(_run_chunk, [todo[i:i + size] for i in range(0, len(todo), size)]):
                yield from results
        pool.close()
        pool.join()


def _run_ray(cfg: RolloutConfig, todo: list[WorkItem], summary: RolloutSummary | None = None
             ) -> Iterator[tuple[str, bool, str | None]]:
    """Play ``todo`` on ``cfg.workers`` Ray actors, one item in flight per actor, on the cluster the caller's
    ``ray.init`` connected to, else the one ``cfg.ray_address`` or ``$RAY_ADDRESS`` names, else a new local one.
    An actor that dies (its node lost, the process killed) fails its item and the rest of the run goes on with
    the others; the episodes it had not committed are played again by the resumed run."""
    try:
        import ray
        from ray.exceptions import RayActorError
    except ImportError as e:
        raise TrajlakeError("--engine ray needs Ray: pip install 'trajlake[ray]'") from e
    _connect_ray(ray, cfg)
    if not is_uri(cfg.lake):
        # Actors on a cluster started elsewhere do not share this process's working directory.
        cfg = dataclasses.replace(cfg, lake=str(Path(cfg.lake).absolute()))
    if summary is not None:
        with contextlib.suppress(AttributeError, RuntimeError):  # Ray Client (ray://) may not expose it
            summary.ray_cluster = ray.get_runtime_context().gcs_address

    from trajlake.policies import batch_episodes

    # an actor runs as many items at once as its policy batches (threads of the actor, one episode each)
    batch = batch_episodes(cfg.policy, cfg.policy_args)
    ray_worker: Any = ray.remote(max_restarts=0)(_RayWorker)
    actors: list[Any] = [ray_worker.options(max_concurrency=batch).remote(cfg) for _ in range(max(1, cfg.workers))]
    pending: dict[Any, tuple[Any, WorkItem]] = {}
    queue = list(todo)
    alive = list(actors)
    for a in actors:
        for _ in range(batch):
            if queue:
                item = queue.pop(0)
                pending[a.run.remote(item)] = (a, item)
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        ref = ready[0]
        actor, item = pending.pop(ref)
        try:
            yield ray.get(ref)
        except RayActorError as e:
            if actor in alive:  # its other items in flight fail the same way
                alive.remove(actor)
            yield f"{item.task_id}/s{item.seed}", False, f"Ray worker died: {str(e).splitlines()[0]}"
            if not alive:
                for left in queue:
                    yield f"{left.task_id}/s{left.seed}", False, "no Ray worker left"
                queue.clear()
            continue
        if queue and actor in alive:
            item = queue.pop(0)
            pending[actor.run.remote(item)] = (actor, item)
    for a in alive:
        try:
            stats = ray.get(a.close.remote())
        except RayActorError:
            continue  # died after its last item: its uncommitted episodes are counted as not written
        node = stats.pop("node_id", None)
        if summary is not None:
            if isinstance(node, str) and node not in summary.ray_nodes:
                summary.ray_nodes.append(node)
            summary.worker_stats.append(stats)


def _connect_ray(ray: Any, cfg: RolloutConfig) -> None:
    """Attach to the cluster ``cfg.ray_address`` or ``$RAY_ADDRESS`` names, or start a local one with
    ``cfg.workers`` CPUs; nothing when the caller has already called ``ray.init``."""
    if ray.is_initialized():
        return
    address = cfg.ray_address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        # "local": a new cluster even when `ray start` left one running here (ray.init would attach to it and
        # then refuse num_cpus).
        ray.init(address="local", num_cpus=max(1, cfg.workers), include_dashboard=False, log_to_driver=False)
        return
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise TrajlakeError(f"--engine ray: cannot attach to the Ray cluster at {address} (--ray-address or "
                            f"$RAY_ADDRESS): {one_line(e)}") from e


class _RayWorker:
    """A Ray actor holding one worker (module level, so Ray serialises it by reference)."""

    def __init__(self, cfg: RolloutConfig):
        _init_worker(cfg)

    def run(self, item: WorkItem) -> tuple[str, bool, str | None]:
        return _run_item(item)

    def close(self) -> dict[str, Any]:
        import ray

        node = {"node_id": ray.get_runtime_context().get_node_id()}
        if _WORKER is None:
            return node
        _WORKER.close()
        return {**_WORKER.stats(), **node}


#: Settings that do not change what a run plays (how fast or where it ran): a resumed run may change them.
_EXECUTION_KEYS = frozenset({"workers", "engine", "commit_every_s", "reproduce", "max_pending_episodes",
                             "tags"})


def _config_json(cfg: RolloutConfig) -> dict[str, Any]:
    """Every setting needed to play the run again (``runs.config``), with the command line that does it."""
    return {"env": cfg.env, "policy": cfg.policy, "split": cfg.split, "seeds": format_seeds(cfg.seeds),
            "fault_rate": cfg.fault_rate, "fault_seed": cfg.fault_seed, "policy_version": cfg.policy_version,
            "max_policy_lag": cfg.max_policy_lag, "env_kwargs": cfg.env_kwargs,
            "cost_model": cfg.cost_model.to_config(), "workers": cfg.workers, "engine": cfg.engine,
            "commit_every_s": cfg.commit_every_s, "reproduce": reproduce_command(cfg),
            # Keys added after the first runs appear only when set, so resuming an older run still matches.
            **({"attempts": cfg.attempts} if cfg.attempts != 1 else {}),
            **({"max_pending_episodes": cfg.max_pending_episodes} if cfg.max_pending_episodes != 256 else {}),
            **({"policy_args": cfg.policy_args} if cfg.policy_args else {}),
            **({"task_ids": list(cfg.task_ids)} if cfg.task_ids else {}),
            **({"data_cutoff": cfg.data_cutoff} if cfg.data_cutoff else {}),
            **({"policy_name": cfg.policy_name} if cfg.policy_name else {}),
            **({"sampling_seed_rule": cfg.sampling_seed_rule} if cfg.sampling_seed_rule else {}),
            # the prompt-injection attack played (also in env_kwargs), named on its own for readers of runs
            **({"injection": cfg.env_kwargs["injection"]} if cfg.env_kwargs.get("injection") else {}),
            **({"fault_kinds": list(cfg.fault_kinds)} if tuple(cfg.fault_kinds) != DEFAULT_FAULT_KINDS else {}),
            **({"held_out_fault_kind": cfg.held_out_fault_kind} if cfg.held_out_fault_kind else {}),
            **({"tags": dict(cfg.tags)} if cfg.tags else {}),
            **({"turn_upgrades": True} if cfg.turn_upgrades else {})}


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a run's config that determines its episodes (compared when a run is resumed). Runs written
    before seeds and prices were recorded lack them: what they lack is not compared."""
    out = {k: v for k, v in config.items() if k not in _EXECUTION_KEYS}
    if "batch_episodes" in out.get("policy_args", {}):  # how many episodes play at once does not change them
        out["policy_args"] = {k: v for k, v in out["policy_args"].items() if k != "batch_episodes"}
    return out


MAX_SEEDS = 1_000_000


def parse_seeds(text: str, *, max_count: int = MAX_SEEDS) -> tuple[int, ...]:
    """``'0,1,2'``, ``'0-4'`` (inclusive) or a mix such as ``'0-2,7'``: non-negative seeds, duplicates dropped,
    order kept. Raises naming the part that is not a seed, a negative seed, or a range too large to play."""
    out: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        lo_text, dash, hi_text = part.partition("-")
        try:
            if dash:
                lo, hi = int(lo_text), int(hi_text)
            else:
                lo = hi = int(part)
        except ValueError as e:
            raise TrajlakeError(f"--seeds: {part!r} is not a non-negative seed or an inclusive range like 0-4"
                                ) from e
        if lo < 0:
            raise TrajlakeError(f"--seeds: {part!r}: seeds are non-negative integers")
        if hi < lo:
            raise TrajlakeError(f"--seeds: {part!r}: the range ends before it starts")
        if hi - lo + 1 + len(out) > max_count:
            raise TrajlakeError(f"--seeds: {text!r} names more than {max_count:,} seeds")
        out += range(lo, hi + 1)
    if not out:
        raise TrajlakeError("--seeds: no seeds given")
    return tuple(dict.fromkeys(out))


def format_seeds(seeds: Sequence[int]) -> str:
    """Seeds as the --seeds option reads them, with consecutive runs as ranges: (0, 1, 2, 5) -> '0-2,5'."""
    parts: list[str] = []
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ",".join(parts)


def reproduce_command(cfg: RolloutConfig) -> str:
    """The ``trajlake rollout`` command line that plays this run again (into the lake it names)."""
    import shlex

    lake = cfg.lake if is_uri(cfg.lake) else str(Path(cfg.lake).absolute())
    args = ["trajlake", "rollout", "--lake", lake, "--env", cfg.env, "--policy", cfg.policy, "--split", cfg.split,
            "--seeds", format_seeds(cfg.seeds), "--run-id", cfg.run_id, "--workers", str(cfg.workers),
            "--engine", cfg.engine, "--commit-every", f"{cfg.commit_every_s:g}"]
    if cfg.fault_rate:
        args += ["--fault-rate", f"{cfg.fault_rate:g}", "--fault-seed", str(cfg.fault_seed)]
    if tuple(cfg.fault_kinds) != DEFAULT_FAULT_KINDS:
        args += ["--fault-kinds", ",".join(cfg.fault_kinds)]
    if cfg.held_out_fault_kind:
        args += ["--held-out-fault-kind", cfg.held_out_fault_kind]
    if cfg.policy_version:
        args += ["--policy-version", cfg.policy_version]
    if cfg.max_policy_lag is not None:
        args += ["--max-policy-lag", str(cfg.max_policy_lag)]
    cm = cfg.cost_model
    args += ["--price-in", repr(cm.price_in), "--price-out", repr(cm.price_out),
             "--price-tool-second", repr(cm.price_tool_second)]
    for k, v in sorted(cfg.env_kwargs.items()):
        args += ["--env-arg", f"{k}={json.dumps(v)}"]
    if cfg.attempts != 1:
        args += ["--attempts", str(cfg.attempts)]
    if cfg.max_pending_episodes != 256:
        args += ["--max-pending-episodes", str(cfg.max_pending_episodes)]
    for k, v in sorted(cfg.policy_args.items()):
        args += ["--policy-arg", f"{k}={v}"]
    if cfg.task_ids:
        args += ["--tasks", ",".join(cfg.task_ids)]
    if cfg.data_cutoff:
        args += ["--data-cutoff", cfg.data_cutoff]
    return shlex.join(args)


__all__ = [
    "EpisodeRecord",
    "RolloutConfig",
    "RolloutSummary",
    "WorkItem",
    "format_seeds",
    "parse_seeds",
    "play_episode",
    "replay_log_from_rows",
    "reproduce_command",
    "run_rollout",
    "write_records",
]
