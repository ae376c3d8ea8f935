"""The project's vocabulary: every closed set of names, as enums (installed as ``trajlake.schemas.vocab``).

The table definitions (``schemas/*.json``) are the single source of truth for column enums; each enum here
mirrors one of them, and ``tests/test_vocabulary.py`` fails when they drift apart or when code outside this
module spells a list of these names again. Code names a member through its enum (``ErrorClass.ENV_BUG``);
members are ``str`` subclasses, so they compare equal to the strings stored in the lake and go into SQL
parameters, JSON and Arrow as plain text.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorClass(StrEnum):
    """Error attribution of a failed episode or a turn (seed section 7; ``episodes.error_class``)."""

    MODEL_INVALID_ACTION = "MODEL_INVALID_ACTION"
    """Schema or argument invalid: may give the policy negative feedback."""
    MODEL_BAD_PLAN = "MODEL_BAD_PLAN"
    """Valid actions, failed by decision: task / process reward."""
    ENV_TRANSIENT = "ENV_TRANSIENT"
    """5xx, random timeout; succeeds on replay: retry or truncate, never a wrong answer."""
    ENV_BUG = "ENV_BUG"
    """The oracle fails too, or the state is inconsistent: exclude and fix the environment."""
    SAFETY_BLOCK = "SAFETY_BLOCK"
    """The gateway refused an over-privileged call: a separate risk metric."""
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    """A step / token / cost limit was reached: an efficiency failure, never disguised as a timeout."""


class Status(StrEnum):
    """Outcome of one turn (``turns.status``): OK or an error class."""

    OK = "OK"
    MODEL_INVALID_ACTION = "MODEL_INVALID_ACTION"
    MODEL_BAD_PLAN = "MODEL_BAD_PLAN"
    ENV_TRANSIENT = "ENV_TRANSIENT"
    ENV_BUG = "ENV_BUG"
    SAFETY_BLOCK = "SAFETY_BLOCK"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"


#: Turn statuses caused by the policy's own action (the policy turn carries them, not only the observation).
MODEL_STATUSES: frozenset[str] = frozenset({Status.MODEL_INVALID_ACTION, Status.MODEL_BAD_PLAN, Status.SAFETY_BLOCK})


class TerminationReason(StrEnum):
    """Why an episode ended (``episodes.termination_reason``)."""

    SUCCESS = "success"
    SUBMITTED = "submitted"
    GAVE_UP = "gave_up"
    BUDGET_STEPS = "budget_steps"
    BUDGET_TOKENS = "budget_tokens"
    BUDGET_COST = "budget_cost"
    TIMEOUT = "timeout"
    SAFETY_STOP = "safety_stop"
    ENV_FAILURE = "env_failure"


#: Reasons that end an episode by the task's own semantics (``terminated``).
TERMINATED_REASONS: frozenset[str] = frozenset({
    TerminationReason.SUCCESS, TerminationReason.SUBMITTED, TerminationReason.GAVE_UP,
    TerminationReason.SAFETY_STOP})
#: Reasons that cut an episode by a budget or the infrastructure (``truncated``); a safety stop may be either.
TRUNCATED_REASONS: frozenset[str] = frozenset({
    TerminationReason.BUDGET_STEPS, TerminationReason.BUDGET_TOKENS, TerminationReason.BUDGET_COST,
    TerminationReason.TIMEOUT, TerminationReason.ENV_FAILURE, TerminationReason.SAFETY_STOP})
#: Budget reasons, each naming the budget that was spent.
BUDGET_REASONS: frozenset[str] = frozenset({
    TerminationReason.BUDGET_STEPS, TerminationReason.BUDGET_TOKENS, TerminationReason.BUDGET_COST})


class Role(StrEnum):
    """Chat role of a turn (``turns.role``)."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    ENV = "env"


class Actor(StrEnum):
    """Who produced a turn (``turns.actor``); only ``policy`` turns may carry loss_mask 1."""

    POLICY = "policy"
    ENV = "env"
    USER = "user"
    SYSTEM = "system"
    SUMMARIZER = "summarizer"
    GATEWAY = "gateway"


class Split(StrEnum):
    """Task split (``tasks.split``, ``episodes.split``); a template family never spans two splits."""

    TRAIN = "train"
    DEV = "dev"
    HIDDEN = "hidden"
    TEST = "test"
    UNKNOWN = "unknown"


class Capability(StrEnum):
    """What a tool call needs from the permission gateway (``gateway_events.capability``)."""

    READ = "read"
    WRITE = "write"
    NETWORK = "network"
    SECRET = "secret"
    EXEC = "exec"
    MEMORY = "memory"
    """The episode's own memory store (``envs/memory.py``): granted only to runs that turn memory on."""


class Decision(StrEnum):
    """The gateway's decision on a proposed call (``gateway_events.decision``)."""

    ALLOW = "allow"
    DENY = "deny"
    MODIFY = "modify"
    CONFIRM = "confirm"


class SideEffectClass(StrEnum):
    """Side-effect class of a call (``gateway_events.side_effect_class``)."""

    READ = "read"
    WRITE = "write"
    IRREVERSIBLE = "irreversible"


class TaxonomyClass(StrEnum):
    """Failure classes of ``evaluators/taxonomy.sql``, in rule order (environment is not a model failure)."""

    ENVIRONMENT = "environment"
    SAFETY = "safety"
    EXECUTION = "execution"
    RECOVERY = "recovery"
    TERMINATION = "termination"
    PERCEPTION = "perception"
    PLANNING = "planning"


class FaultKind(StrEnum):
    """Kinds of faults the rollout fault injector knows (``turns.fault_injected``; importers may record others).

    ``transient``, ``timeout`` and ``http_5xx`` replace the call (it never reaches the environment);
    ``slow_response`` (the call ran, its answer came too late) and ``truncated_result`` (the answer is cut) perturb
    what the agent sees of an executed call; ``stale_element_ids`` (Mini Web), ``flaky_test_run`` (Mini SWE) and
    ``directory_busy`` (tool-lookup) are made by the environment (``Env.fault_kinds``); ``context_trim`` (the call
    ran; the policy's next context loses every earlier action/observation pair, as if its window were tiny) is made
    by the policy (``Policy.forget_context``)."""

    TRANSIENT = "transient"
    TIMEOUT = "timeout"
    HTTP_5XX = "http_5xx"
    SLOW_RESPONSE = "slow_response"
    TRUNCATED_RESULT = "truncated_result"
    STALE_ELEMENT_IDS = "stale_element_ids"
    FLAKY_TEST_RUN = "flaky_test_run"
    DIRECTORY_BUSY = "directory_busy"
    CONTEXT_TRIM = "context_trim"


#: Which JSON column each enum mirrors: (table, column).
ENUM_COLUMNS: dict[type[StrEnum], tuple[str, str]] = {
    ErrorClass: ("episodes", "error_class"),
    Status: ("turns", "status"),
    TerminationReason: ("episodes", "termination_reason"),
    Role: ("turns", "role"),
    Actor: ("turns", "actor"),
    Split: ("tasks", "split"),
    Capability: ("gateway_events", "capability"),
    Decision: ("gateway_events", "decision"),
    SideEffectClass: ("gateway_events", "side_effect_class"),
}

__all__ = [
    "BUDGET_REASONS",
    "ENUM_COLUMNS",
    "MODEL_STATUSES",
    "TERMINATED_REASONS",
    "TRUNCATED_REASONS",
    "Actor",
    "Capability",
    "Decision",
    "ErrorClass",
    "FaultKind",
    "Role",
    "SideEffectClass",
    "Split",
    "Status",
    "TaxonomyClass",
    "TerminationReason",
]
