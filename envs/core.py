"""The environment contract: reset / step / snapshot / restore / replay / close.

Every trajlake environment implements ``Env``. Results are typed (``ResetResult``, ``StepResult``); an invalid
action gives a ``StepResult`` with status ``MODEL_INVALID_ACTION``, never an exception. ``terminated`` (task
semantics: submitted, solved, gave up) and ``truncated`` (budget or infrastructure) are never both true; spent
budgets end an episode as truncated with status ``BUDGET_EXHAUSTED``.
"""

from __future__ import annotations

import abc
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trajlake.envs.policy import Policy, TaskView
from trajlake.schemas.vocab import Actor, ErrorClass, Status, TerminationReason

from trajlake.errors import EnvError

STATUS_OK = Status.OK
ERROR_CLASSES: tuple[str, ...] = tuple(ErrorClass)

DEFAULT_HUMAN_INTERACTION_USD = 0.50
"""USD for one interaction with the person behind the agent: a confirmation answered by an approver (and the
``ask_user`` action, when it comes). About 30 seconds of a person's time at $60 an hour. This is the one place the
default is set; an environment takes ``human_price_usd`` (``--env-arg human_price_usd=2.0``) and the variable
``TRAJLAKE_HUMAN_INTERACTION_USD`` overrides the default for every environment of a process."""
HUMAN_PRICE_VARIABLE = "TRAJLAKE_HUMAN_INTERACTION_USD"


def human_interaction_usd(override: float | None = None) -> float:
    """The price of one human interaction: ``override`` (an environment's ``human_price_usd``) when given, else
    ``$TRAJLAKE_HUMAN_INTERACTION_USD``, else :data:`DEFAULT_HUMAN_INTERACTION_USD`. Raises EnvError for a
    negative or non-finite price (a typo must not make people free or priceless)."""
    import math
    import os

    raw: Any = override if override is not None else os.environ.get(HUMAN_PRICE_VARIABLE)
    if raw is None or raw == "":
        return DEFAULT_HUMAN_INTERACTION_USD
    try:
        price = float(raw)
    except (TypeError, ValueError):
        raise EnvError(f"human price: expected a number of USD, got {raw!r}") from None
    if not math.isfinite(price) or price < 0:
        raise EnvError(f"human price: must be a non-negative number of USD, got {raw!r}")
    return price


@dataclass(frozen=True)
class Budget:
    """Per-episode budgets; None means unlimited. Exceeding one truncates the episode."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    max_seconds: float | None = None
    """Wall-clock seconds from reset, the policy's thinking included: the first step that ends past it truncates
    the episode (``termination_reason`` ``timeout``). Wall time is not state: a replay never re-triggers it."""

    def __post_init__(self) -> None:
        if self.max_seconds is not None and not (isinstance(self.max_seconds, (int, float))
                                                 and self.max_seconds >= 0):
            raise EnvError(f"budget: max_seconds must be a non-negative number, got {self.max_seconds!r}")

    @classmethod
    def of_task(cls, task: Mapping[str, Any]) -> Budget:
        """The budgets a task record carries (its ``budget``: max_steps, max_tokens, max_cost, max_seconds;
        absent: unlimited)."""
        b = task.get("budget") or {}
        return cls(b.get("max_steps"), b.get("max_tokens"), b.get("max_cost"), b.get("max_seconds"))


@dataclass(frozen=True)
class ResetResult:
    """What ``reset`` returns."""

    episode_id: str
    """A fresh id for the episode that starts."""
    observation: str
    """The initial observation (task statement and tool description)."""
    state_hash: str
    """Hash of the environment state after reset."""
    task_id: str
    task_version: str
    seed: int


@dataclass(frozen=True)
class StepResult:
    """What ``step`` returns."""

    observation: str
    """Text shown to the agent (tool output, or the error message)."""
    reward_components: Mapping[str, float]
    """Named rewards of this step (final rewards arrive on the terminating step)."""
    terminated: bool
    """The episode ended by task semantics (submitted, solved, gave up)."""
    truncated: bool
    """The episode ended by a budget or infrastructure limit."""
    status: str
    """"OK" or an error class (MODEL_INVALID_ACTION, ..., BUDGET_EXHAUSTED)."""
    cost_usd: float
    """Cost of the environment side of the step."""
    state_hash: str
    """Environment state hash after the step."""
    termination_reason: str | None = None
    """Set when the episode ended: one of the episodes.termination_reason values."""
    tool: str | None = None
    """Tool the action called, if it parsed."""
    tool_seconds: float = 0.0
    """Seconds spent running the tool."""
    fault_injected: str | None = None
    """Kind of fault injected on this step (transient, timeout), if any."""
    gateway_events: tuple[Mapping[str, Any], ...] = ()
    """Gateway decisions of this step (gateway_events rows without episode/run/turn/event ids)."""
    taint: tuple[str, ...] = ()
    """Taint labels of the observation (e.g. untrusted_tool_output)."""
    observation_actor: str = Actor.ENV
    """Who produced the observation: ``env`` (tool output, recorded as a ``tool`` turn) or ``user`` (a simulated
    user's answer to ``ask_user``, recorded as a ``user`` turn with actor ``user``)."""

    def __post_init__(self) -> None:
        if self.terminated and self.truncated:
            raise EnvError("a step cannot be both terminated and truncated")
        if self.observation_actor not in (Actor.ENV, Actor.USER):
            raise EnvError(f"observation_actor must be env or user, not {self.observation_actor!r}")
        if self.status != STATUS_OK and self.status not in ERROR_CLASSES:
            raise EnvError(f"unknown status {self.status!r}")

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass(frozen=True)
class Snapshot:
    """Opaque, immutable environment state; only the environment that made it can restore it."""

    env_id: str
    env_version: str
    state_hash: str
    payload: Any = field(repr=False, compare=False)


@dataclass(frozen=True)
class LoggedStep:
    """One recorded action and the state hash it led to."""

    action: str
    idempotency_key: str | None
    state_hash: str
    tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True)
class ReplayLog:
    """A recorded episode, as needed to re-run it under pinned versions."""

    env_id: str
    env_version: str
    task_id: str
    task_version: str
    seed: int
    reset_state_hash: str
    steps: Sequence[LoggedStep]


@dataclass(frozen=True)
class ReplayReport:
    """Outcome of ``replay``: ``ok`` only if every state hash matched."""

    ok: bool
    steps_replayed: int
    first_divergence: int | None = None
    """Index of the first diverging step (-1: the state after reset), None when all matched."""
    expected_hash: str | None = None
    actual_hash: str | None = None
    message: str = ""


@dataclass(frozen=True)
class Requirement:
    """One thing an environment needs, and whether this machine has it."""

    name: str
    """What is checked, e.g. "sandbox" or "pytest"."""
    ok: bool
    """Whether it is there and works."""
    detail: str
    """What was found (a version, a path, the isolation kind), or what is wrong."""
    fix: str = ""
    """How to fix it when not ok (one line, e.g. the command to run)."""
    required: bool = True
    """False for optional features (their absence is reported, not fatal)."""


@dataclass(frozen=True)
class EvalDocument:
    """One text of a task that a model must not have seen in training: what the contamination scan
    (``trajlake contamination``) compares with the training side, beside the task's statement."""

    task_id: str
    kind: str
    """What the text is, named so in the scan's report: ``gold_patch``, ``hidden_test_names``,
    ``hidden_tests``, ``page``, ... (``statement`` is the scan's own: it reads the ``tasks`` table)."""
    text: str
    code: bool = False
    """Whether the text is code: the near-duplicate scan then renames every identifier, not only code-like
    words."""


#: The documented values of ``Env.sandbox_kind`` (``episodes.sandbox``); an environment may name another kind
#: (``docker``, ``gvisor``) with a short lowercase name. docs/security.md describes the first two.
SANDBOX_KINDS: Mapping[str, str] = {
    "bwrap": "bubblewrap: agent code runs in new user, mount and network namespaces seeing only its workspace",
    "rlimit": "a plain subprocess under resource limits only: agent code can read host files and the network",
    "none": "no code the agent wrote runs: the environment carries out every action itself (Mini Web's clicks)",
}


def stable_hash(obj: Any) -> str:
    """sha256 of canonical JSON (sorted keys, no whitespace): for state hashes and args hashes."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                     default=str).encode()).hexdigest()


class Env(abc.ABC):
    """The contract every trajlake environment implements."""

    env_id: ClassVar[str]
    env_version: ClassVar[str]
    success_component: ClassVar[str] = "resolved"
    """The reward component that grades an episode: success means it reached 1.0; an episode whose final
    rewards lack it was never graded (``success`` null)."""
    verification_source: ClassVar[str | None] = None
    """How the environment verifies success (``episodes.verification_source``), e.g. ``hidden_tests``."""
    tool_docs: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    """The tools a policy may call, ``{name: {"description": ..., "args": {...}}}`` (what ``task_view`` gives
    as ``TaskView.tools``), on the class so that readers such as the trainer can render an episode's system
    prompt without building the environment (``registry.spec(env_id).load().tool_docs``). Empty: not declared."""

    @classmethod
    def tool_docs_for(cls, env_kwargs: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
        """The tools an instance built with ``env_kwargs`` lists to the policy: ``tool_docs``, unless an argument
        adds some (the built-in environments' ``memory``). A run's grammar is built from it."""
        return cls.tool_docs

    injection_attempted: bool = False
    """Whether the current episode showed the agent an injected instruction (``episodes.injection_attempted``);
    an environment with an injection suite sets it per episode."""
    injection_attacks: ClassVar[tuple[str, ...]] = ()
    """Prompt-injection attacks the environment can play (constructor keyword ``injection=NAME``: the attacked
    variants of its tasks instead of the benign set); empty when it has no injection suite."""
    attack_success: bool | None = None
    """For an episode of an attacked task variant: whether the attacker's goal was achieved by executed effects
    (backend state, side-effect ledger; a blocked call is no success), set when the episode is graded. None when
    the episode played no attacked variant (``episodes.attack_success``)."""

    sandbox_kind: str | None = None
    """The isolation code written by the agent runs in, recorded as ``episodes.sandbox`` of every episode: one
    of :data:`SANDBOX_KINDS` (``bwrap``, ``rlimit``, ``none``) or another short lowercase name; None when not
    declared. An environment whose isolation depends on the machine sets it on the instance at ``reset`` (Mini
    SWE: ``bwrap``, or ``rlimit`` where bubblewrap does not work); the rest declare it on the class."""

    @property
    @abc.abstractmethod
    def image_digest(self) -> str:
        """Hash of the environment's code and task data, written to every episode."""

    @abc.abstractmethod
    def reset(self, seed: int, task_version: str | None = None, *, task_id: str | None = None) -> ResetResult:
        """Start an episode on a task (chosen from the seed unless ``task_id`` is given)."""

    @abc.abstractmethod
    def step(self, action: str, idempotency_key: str | None = None, *, tokens: int = 0,
             cost_usd: float = 0.0) -> StepResult:
        """Apply an action. ``tokens`` and ``cost_usd`` are the policy turn's, counted against the budgets."""

    @abc.abstractmethod
    def snapshot(self) -> Snapshot:
        """Capture the full state (workspace, counters, pending effects)."""

    @abc.abstractmethod
    def restore(self, snapshot: Snapshot) -> None:
        """Return to a snapshot's state exactly (same state hash, same future observations)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources (temporary workspaces, processes)."""

    # -- what an environment supplies to the runner, the CLI and the evaluators (no isinstance checks) --------
    def list_tasks(self) -> list[dict[str, Any]]:
        """The task records this instance plays (its split), sorted by task id. Each has at least task_id,
        task_version and split."""
        raise NotImplementedError(f"{type(self).__name__} does not list its tasks")

    def tokenizer_corpus_tasks(self) -> list[dict[str, Any]]:
        """The tasks whose oracle episodes an environment tokenizer may be trained on
        (``trajlake.policies.tiny.oracle_episodes`` picks its corpus from them): every task it lists, unless the
        environment keeps the list fixed so that its tokenizers, and every model trained with one, stay the same
        when its split grows."""
        return self.list_tasks()

    def task_row(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """The ``tasks`` table row of one of its task records (nothing the agent must not see)."""
        raise NotImplementedError(f"{type(self).__name__} gives no tasks table rows")

    def task_view(self, task_id: str, task_version: str, *, oracle: bool = False) -> TaskView:
        """What a policy may know of a task: the public statement and tools; privileged data (the known
        solution) only when ``oracle``."""
        raise NotImplementedError(f"{type(self).__name__} gives no task views")

    @classmethod
    def policies(cls) -> Mapping[str, Callable[[str], Policy]]:
        """Built-in scripted policies by name (e.g. oracle, heuristic, random); each is called with a policy
        version. An ``oracle`` policy (``needs_oracle``) lets preflight checks and ENV_BUG attribution run."""
        return {}

    @classmethod
    def evaluation_documents(cls, task_ids: Sequence[str]) -> list[EvalDocument]:
        """The texts of these tasks, beyond their statements, that must not appear in training data (Mini SWE:
        the gold patch, the hidden test names and bodies), for the contamination scan. A class method: the scan
        takes task ids of every split from a lake and builds no environment. Ids the environment does not know
        give nothing; by default every task gives nothing (its statement, in the ``tasks`` table, is scanned
        anyway)."""
        return []

    def requirements(self) -> list[Requirement]:
        """What the environment needs on this machine (tools, isolation), checked before a rollout plays and
        printed by ``trajlake doctor``."""
        return []

    def count_external_step(self, tokens: int, cost_usd: float) -> StepResult | None:
        """Count a step that never reached the environment (an injected fault) against the budgets; returns the
        final result when that spends a budget. Environments without budgets count nothing (None)."""
        return None

    fault_kinds: ClassVar[tuple[str, ...]] = ()
    """Fault kinds this environment makes itself (``step_with_fault``), beyond the runner's generic ones: e.g.
    ``stale_element_ids`` (Mini Web), ``flaky_test_run`` (Mini SWE)."""

    def step_with_fault(self, kind: str, action: str, idempotency_key: str | None = None, *, tokens: int = 0,
                        cost_usd: float = 0.0) -> StepResult:
        """``step`` with the environment's own fault ``kind`` (one of :attr:`fault_kinds`) injected. The result
        names the kind in ``fault_injected``; where the kind does not apply to this action (a stale element id
        on an action without one) the step runs normally and ``fault_injected`` is None."""
        raise EnvError(f"{self.env_id} makes no fault of kind {kind!r}")

    def replay(self, log: ReplayLog) -> ReplayReport:
        """Re-run a recorded episode and compare every state hash; reports the first divergence."""
        if log.env_id != self.env_id or log.env_version != self.env_version:
            return ReplayReport(False, 0, -1, message=f"recorded with {log.env_id} {log.env_version}, this is "
                                                       f"{self.env_id} {self.env_version}: versions are pinned")
        r = self.reset(log.seed, log.task_version, task_id=log.task_id)
        if r.state_hash != log.reset_state_hash:
            return ReplayReport(False, 0, -1, log.reset_state_hash, r.state_hash, "state after reset differs")
        for i, s in enumerate(log.steps):
            res = self.step(s.action, s.idempotency_key, tokens=s.tokens, cost_usd=s.cost_usd)
            if res.state_hash != s.state_hash:
                return ReplayReport(False, i, i, s.state_hash, res.state_hash, f"state after step {i} differs")
            if res.done and i != len(log.steps) - 1:
                return ReplayReport(False, i + 1, i + 1, message=f"episode ended at step {i}, the log goes on")
        return ReplayReport(True, len(log.steps))

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SplitTasks:
    """Task lookup for an environment that holds its split's task records (each with task_id, task_version and
    split): ``self.tasks`` sorted by task id, looked up by seed (``reset(seed)``) or by id and version (pinned
    replays). Mix it into an ``Env`` and call ``index_tasks`` in ``__init__``."""

    tasks: list[dict[str, Any]]
    by_id: dict[str, list[dict[str, Any]]]
    split: str | None

    def index_tasks(self, records: Sequence[Mapping[str, Any]], split: str | None, what: str) -> None:
        """Keep the records of ``split`` (None: all); raises naming ``what`` when the split has none."""
        self.tasks = sorted((dict(t) for t in records if split is None or t["split"] == split),
                            key=lambda t: t["task_id"])
        if not self.tasks:
            raise EnvError(f"no {what} tasks in split {split!r}")
        self.by_id = {}
        for t in self.tasks:
            self.by_id.setdefault(t["task_id"], []).append(t)
        self.split = split

    def list_tasks(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self.tasks]

    def task_for(self, seed: int, task_version: str | None = None, task_id: str | None = None) -> dict[str, Any]:
        """The task a reset plays: chosen by the seed, or ``task_id`` at ``task_version`` (default: newest)."""
        if task_id is None:
            task = self.tasks[seed % len(self.tasks)]
            if task_version is not None and task["task_version"] != task_version:
                raise EnvError(f"seed {seed} picks {task['task_id']} at version {task['task_version']}, "
                               f"not {task_version}")
            return task
        versions = self.by_id.get(task_id)
        if not versions:
            raise EnvError(f"unknown task {task_id!r} (split {self.split!r})")
        if task_version is None:
            return versions[-1]
        for t in versions:
            if t["task_version"] == task_version:
                return t
        raise EnvError(f"task {task_id!r} has no version {task_version!r}; pinned replays need that version")


class TrackedBudget:
    """``count_external_step`` for an environment that keeps its budgets in ``self.tracker``, ``self.done``
    for an ended episode, and grades with ``self._final_grade()`` when a budget cuts an episode. Mix it in
    before ``Env``."""

    tracker: BudgetTracker
    done: bool

    def _final_grade(self) -> dict[str, float]:
        raise NotImplementedError

    def state_hash(self) -> str:
        raise NotImplementedError

    def count_external_step(self, tokens: int, cost_usd: float) -> StepResult | None:
        """Count a step that never reached the environment (an injected fault) against the budgets; when
        that spends a budget the episode is truncated and graded, and the final result is returned."""
        if self.done:
            return None
        spent = self.tracker.add(tokens, cost_usd)
        if spent is None:
            return None
        comps = self._final_grade()
        self.done = True
        return StepResult(observation=f"{spent_notice(spent)}.", reward_components=comps,
                          terminated=False, truncated=True, status=Status.BUDGET_EXHAUSTED, cost_usd=0.0,
                          state_hash=self.state_hash(), termination_reason=spent)


def spent_notice(reason: str) -> str:
    """``The steps budget is spent`` (tokens, cost; ``time`` for a timeout): what an observation says when a
    budget ends the episode."""
    what = "time" if reason == TerminationReason.TIMEOUT else reason.removeprefix("budget_")
    return f"The {what} budget is spent"


class BudgetTracker:
    """Counts steps, tokens and cost of an episode, and its wall time from creation (at reset), and says which
    budget, if any, is spent. ``clock``: seconds, monotonic (a test passes its own)."""

    def __init__(self, budget: Budget, clock: Callable[[], float] = time.monotonic):
        self.budget = budget
        self.steps = 0
        self.tokens = 0
        self.cost = 0.0
        self.clock = clock
        self.started = clock()

    def add(self, tokens: int, cost_usd: float) -> str | None:
        """Count one step; returns the termination reason when a budget is now spent."""
        self.steps += 1
        self.tokens += tokens
        self.cost += cost_usd
        b = self.budget
        if b.max_tokens is not None and self.tokens > b.max_tokens:
            return TerminationReason.BUDGET_TOKENS
        if b.max_cost is not None and self.cost > b.max_cost:
            return TerminationReason.BUDGET_COST
        if b.max_steps is not None and self.steps >= b.max_steps:
            return TerminationReason.BUDGET_STEPS
        if b.max_seconds is not None and self.clock() - self.started > b.max_seconds:
            return TerminationReason.TIMEOUT
        return None

    def state(self) -> tuple[int, int, float]:
        return self.steps, self.tokens, self.cost

    def set_state(self, state: tuple[int, int, float]) -> None:
        self.steps, self.tokens, self.cost = state


__all__ = [
    "DEFAULT_HUMAN_INTERACTION_USD",
    "ERROR_CLASSES",
    "HUMAN_PRICE_VARIABLE",
    "SANDBOX_KINDS",
    "STATUS_OK",
    "Budget",
    "BudgetTracker",
    "Env",
    "EnvError",
    "EvalDocument",
    "LoggedStep",
    "ReplayLog",
    "ReplayReport",
    "Requirement",
    "ResetResult",
    "Snapshot",
    "SplitTasks",
    "StepResult",
    "TrackedBudget",
    "human_interaction_usd",
    "spent_notice",
    "stable_hash",
]
