"""Seeded fault injection for rollouts, and the fault curriculum.

Which fault a step gets is a pure function of the injector's seed, the episode id and the step index, so reruns
and resumed runs inject the same faults. Kinds (``trajlake.schemas.vocab.FaultKind``, recorded per turn in
``turns.fault_injected``):

- ``transient``, ``timeout``, ``http_5xx``: the call never reaches the environment; the agent sees an error.
- ``slow_response``: the call ran, but its answer came after the time limit: the agent sees a timeout and must
  check the state before retrying (a retry with the same idempotency key is deduplicated by the gateway).
- ``truncated_result``: the call ran; the agent sees only the first third of its output.
- ``context_trim``: the call ran and its answer is seen whole, but the policy's next context is trimmed as if its
  window were tiny: every earlier action/observation pair is dropped (summarised under ``summarize``), the task and
  the newest observation stay (``Policy.forget_context``). Recorded only when the policy had earlier turns to lose
  (a scripted policy has no context: the fault is not recorded); "failed because it forgot" is then what
  ``trajlake eval``'s ``forgetting_rate`` measures.
- environment kinds (``Env.fault_kinds``, made by ``Env.step_with_fault``): ``stale_element_ids`` (Mini Web:
  the page was re-rendered after the agent read it; the action does not run), ``flaky_test_run`` (Mini SWE:
  a test run reports a failure of the test infrastructure) and ``directory_busy`` (tool-lookup: a lookup does
  not run).

A held-out kind (``held_out``) is never injected: training rollouts leave it out and a held-out evaluation run
injects only it (``kinds=(K,)``), for the seed's H3 (recovery on faults never seen in training). The curriculum
raises the rate with training iterations: :func:`fault_rate_at` (the trainer's ``fault_rate_schedule``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from trajlake.errors import TrajlakeError
from trajlake.schemas.vocab import FaultKind

FAULT_KINDS: tuple[str, ...] = tuple(FaultKind)
#: Kinds the runner makes for any environment.
GENERIC_FAULT_KINDS: tuple[str, ...] = (FaultKind.TRANSIENT, FaultKind.TIMEOUT, FaultKind.HTTP_5XX,
                                        FaultKind.SLOW_RESPONSE, FaultKind.TRUNCATED_RESULT, FaultKind.CONTEXT_TRIM)
#: Kinds whose call never reaches the environment (the runner answers instead).
REPLACING_FAULT_KINDS: frozenset[str] = frozenset({FaultKind.TRANSIENT, FaultKind.TIMEOUT, FaultKind.HTTP_5XX})
#: Kinds after which the environment's state is unchanged because the call did not run (replay skips them).
NOT_EXECUTED_FAULT_KINDS: frozenset[str] = REPLACING_FAULT_KINDS | {FaultKind.STALE_ELEMENT_IDS,
                                                                    FaultKind.DIRECTORY_BUSY}
#: What ``--fault-rate`` injects without ``--fault-kinds`` (the first kinds; runs recorded before the others
#: existed resume with the same faults).
DEFAULT_FAULT_KINDS: tuple[str, ...] = (FaultKind.TRANSIENT, FaultKind.TIMEOUT)

_OBSERVATIONS: dict[str, str] = {
    FaultKind.TRANSIENT: "error: the tool is temporarily unavailable (ENV_TRANSIENT); the call had no effect, retry it",
    FaultKind.TIMEOUT: "error: the tool timed out (ENV_TRANSIENT); the call had no effect, retry it",
    FaultKind.HTTP_5XX: "error: the tool's server answered HTTP 503 Service Unavailable (ENV_TRANSIENT); the call "
                        "had no effect, retry it",
    FaultKind.SLOW_RESPONSE: "error: the tool did not answer within the time limit (ENV_TRANSIENT); the call may "
                             "have taken effect: check the state before you retry",
}
TRUNCATION_NOTE = "\n[... the tool's output was cut off here]"


def parse_fault_kinds(text: str | Sequence[str]) -> tuple[str, ...]:
    """``'transient,http_5xx'`` (or a list) as fault kinds, in order, without repeats; raises naming an
    unknown kind."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    out = tuple(dict.fromkeys(n for n in names if n))
    unknown = [n for n in out if n not in FAULT_KINDS]
    if unknown:
        raise TrajlakeError(f"unknown fault kind(s) {', '.join(unknown)}; kinds: {', '.join(FAULT_KINDS)}")
    if not out:
        raise TrajlakeError("no fault kinds given")
    return out


def check_fault_kinds(kinds: Sequence[str], env_name: str, env_kinds: Sequence[str]) -> None:
    """Raise naming the kinds that neither the runner nor the environment ``env_name`` can make."""
    missing = [k for k in kinds if k not in GENERIC_FAULT_KINDS and k not in env_kinds]
    if missing:
        raise TrajlakeError(f"environment {env_name!r} cannot inject fault kind(s) {', '.join(missing)}; it can: "
                            f"{', '.join([*GENERIC_FAULT_KINDS, *env_kinds])}")


def fault_rate_at(step: int, schedule: Sequence[float]) -> float:
    """The fault rate of training iteration ``step`` (0-based) under a curriculum of per-iteration rates:
    ``schedule[min(step, len(schedule) - 1)]`` (the last rate holds after the schedule ends); 0 when empty."""
    if step < 0:
        raise ValueError("step must be non-negative")
    if not schedule:
        return 0.0
    rate = float(schedule[min(step, len(schedule) - 1)])
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"fault rate {rate} is not in [0, 1]")
    return rate


@dataclass(frozen=True)
class FaultInjector:
    """Injects a fault on a step with probability ``rate``, of one of ``kinds`` (minus ``held_out``, which is
    never injected); the decision is a pure function of the seed, the episode id and the step index."""

    rate: float = 0.0
    seed: int = 0
    kinds: tuple[str, ...] = DEFAULT_FAULT_KINDS
    held_out: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", parse_fault_kinds(self.kinds))
        if self.held_out is not None and self.held_out not in FAULT_KINDS:
            raise TrajlakeError(f"unknown held-out fault kind {self.held_out!r}; kinds: {', '.join(FAULT_KINDS)}")
        if self.rate > 0 and not self.active_kinds:
            raise TrajlakeError(f"no fault kind left to inject: {', '.join(self.kinds)} minus the held-out "
                                f"{self.held_out}")

    @property
    def active_kinds(self) -> tuple[str, ...]:
        """The kinds this injector may inject (the held-out kind removed)."""
        return tuple(k for k in self.kinds if k != self.held_out)

    def decide(self, episode_id: str, step: int) -> str | None:
        if self.rate <= 0:
            return None
        h = hashlib.sha256(f"{self.seed}:{episode_id}:{step}".encode()).digest()
        u = int.from_bytes(h[:8], "big") / 2**64
        if u >= self.rate:
            return None
        kinds = self.active_kinds
        return kinds[h[8] % len(kinds)]

    @staticmethod
    def observation(kind: str) -> str:
        """What the agent sees instead of the tool's answer (replacing kinds and ``slow_response``)."""
        return _OBSERVATIONS.get(kind, _OBSERVATIONS[FaultKind.TRANSIENT])

    @staticmethod
    def truncate(text: str) -> str:
        """The first third of a tool's output (at least one character), marked as cut."""
        return text[: max(1, len(text) // 3)] + TRUNCATION_NOTE
