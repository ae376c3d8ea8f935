"""Every exception type trajlake defines, in one place (``tests/test_architecture.py`` keeps it so).

All derive from :class:`TrajlakeError`, so a caller can catch the whole family and the CLI prints any of them as
one line with a non-zero exit. Where callers also catch a built-in base (``ValueError``, ``RuntimeError``,
``AssertionError``), the type keeps it beside ``TrajlakeError``. The modules that raise them re-export them under
their old names (``trajlake.envs.core.EnvError`` is this module's ``EnvError``).

Not listed here: private control-flow exceptions that never leave their module (``trajlake.io.jsonl._FieldError``,
``trajlake.envs.gateway._Denied``, ``trajlake.envs.mini_web.app._BadForm``), and the task libraries' own
exceptions in ``envs/mini_swe/libraries`` (task data, not trajlake code).
"""

from __future__ import annotations

from dataclasses import dataclass


class TrajlakeError(Exception):
    """Base class of all trajlake errors; the CLI prints its message on one line and exits non-zero."""


class LakeNotFoundError(TrajlakeError):
    """The path holds no trajlake lake (run `trajlake init`)."""


class SchemaVersionError(TrajlakeError):
    """Data written with a schema major version this trajlake cannot read."""


class SchemaDefinitionError(TrajlakeError):
    """A table definition in schemas/ is malformed."""


@dataclass(frozen=True)
class Issue:
    """One validation problem, located as precisely as possible."""

    table: str
    episode_id: str | None
    turn_idx: int | None
    field: str
    message: str
    source: str | None = None  # file:line for ingested input

    def __str__(self) -> str:
        where = []
        if self.source:
            where.append(self.source)
        if self.episode_id is not None:
            where.append(f"episode {self.episode_id}")
        if self.turn_idx is not None:
            where.append(f"turn {self.turn_idx}")
        loc = ", ".join(where) if where else self.table
        return f"{loc}: {self.table}.{self.field}: {self.message}"


class ValidationError(TrajlakeError):
    """One or more rows failed validation; nothing of the affected episodes was written."""

    def __init__(self, issues: list[Issue]):
        self.issues = issues
        first = str(issues[0]) if issues else "invalid input"
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        super().__init__(first + more)


class ConflictError(TrajlakeError):
    """An episode id already exists in the lake with different content."""


class IntegrityError(TrajlakeError):
    """The lake's stored data does not match its hashes or schema (see `trajlake verify`)."""


class QueryError(TrajlakeError):
    """A query against the lake failed."""


# -- the lake ----------------------------------------------------------------------------------------------------
class ConcurrentChangeError(TrajlakeError):
    """A maintenance transaction lost a race with another one; nothing was changed."""


# -- environments ------------------------------------------------------------------------------------------------
class EnvError(TrajlakeError):
    """Misuse of an environment by the caller (step before reset, restore of a foreign snapshot, ...)."""


class UnknownEnvironmentError(TrajlakeError):
    """No environment is registered (or discoverable) under a name."""


class EnvCheckError(TrajlakeError, AssertionError):
    """The environment breaks the contract; the message says how."""


class TransientToolError(TrajlakeError):
    """Raised by a handler when the tool failed transiently and did not take effect; the call may be retried.

    The gateway reports it as status ``ENV_TRANSIENT``; it neither caches the result under the idempotency key
    nor counts the call against the side-effect budget."""


class PatchError(TrajlakeError, ValueError):
    """A diff could not be parsed or does not apply to the given text."""


class BuildError(TrajlakeError, RuntimeError):
    """The task set cannot be built (e.g. a library's clean suite does not pass reliably)."""


class BrowserUnavailable(TrajlakeError, RuntimeError):
    """Chromium or Playwright is missing; the message says which."""


# -- rendering of LM turns ---------------------------------------------------------------------------------------
class TemplateError(TrajlakeError, ValueError):
    """The tokenizer's chat template cannot give token-exact multi-turn contexts."""


class GrammarError(TrajlakeError):
    """Grammar-constrained decoding: the grammar library is missing, a grammar does not compile, or stored tokens
    do not replay under their run's grammar."""


# -- importers ---------------------------------------------------------------------------------------------------
class PrefixError(TrajlakeError):
    """Per-turn tokenization differs from tokenizing the whole conversation, first at ``turn``."""

    def __init__(self, turn: int, message: str):
        super().__init__(message)
        self.turn = turn
        self.message = message


# -- evaluators --------------------------------------------------------------------------------------------------
class StatsInputError(TrajlakeError, ValueError):
    """Invalid input to a statistics function (shape mismatch, NaN values, impossible counts)."""


class UnknownRunError(TrajlakeError):
    """A run id given on the command line is not in the lake."""


# -- the trainer -------------------------------------------------------------------------------------------------
class TrainDataError(TrajlakeError):
    """Turn rows the trainer cannot use as they are (missing turn, misaligned arrays, a text-only episode without
    the trainer's tokenizer); the message names the episode, the turn and the field."""


class RetokenizationError(TrainDataError):
    """An episode re-rendered with the trainer's tokenizer breaks the prefix property (its per-turn pieces do not
    concatenate to the tokenization of the whole text), or a trimmed context was recorded with another
    tokenizer; ``on_mismatch="skip"`` skips and counts such episodes instead."""


class ConfigError(TrajlakeError):
    """The training config is malformed (names the file and the key)."""


class TrainError(TrajlakeError):
    """The training run cannot go on (names the stage and what to do)."""


class PlateauError(TrainError):
    """A supervised stage's ``plateau_check`` found its mean training loss still above the bar at the check's step:
    the stage stops there and registers no checkpoint (``trajlake experiment`` restarts B1 from a new
    initialisation when its ``[b1] restarts`` allow)."""

    def __init__(self, message: str, *, mean_loss: float, step: int) -> None:
        super().__init__(message)
        self.mean_loss = mean_loss
        self.step = step


# -- language-model policies -------------------------------------------------------------------------------------
class ContextOverflowError(TrajlakeError):
    """The context does not fit the window even after trimming."""


class ModelServerError(TrajlakeError):
    """The model server kept failing (timeouts, 5xx) after every retry: infrastructure, not a model error."""


# -- rollouts ----------------------------------------------------------------------------------------------------
class PreflightError(TrajlakeError):
    """The environment cannot work on this machine; nothing was written."""


class OracleFailedError(TrajlakeError):
    """The oracle failed a task it played: grading or the environment is broken (ENV_BUG)."""


def one_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (Rust errors from delta-rs append a backtrace when
    ``RUST_BACKTRACE`` is set); the exception's type name when the message is empty."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
