"""A seeded fault injector: transient tool errors and timeouts, decided per (seed, episode, step)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

FAULT_KINDS = ("transient", "timeout")


@dataclass(frozen=True)
class FaultInjector:
    """Injects a fault on a step with probability ``rate``; the decision is a pure function of the seed, the
    episode id and the step index, so reruns and resumed runs inject the same faults."""

    rate: float = 0.0
    seed: int = 0

    def decide(self, episode_id: str, step: int) -> str | None:
        if self.rate <= 0:
            return None
        h = hashlib.sha256(f"{self.seed}:{episode_id}:{step}".encode()).digest()
        u = int.from_bytes(h[:8], "big") / 2**64
        if u >= self.rate:
            return None
        return FAULT_KINDS[h[8] % len(FAULT_KINDS)]

    @staticmethod
    def observation(kind: str) -> str:
        if kind == "timeout":
            return "error: the tool timed out (ENV_TRANSIENT); the call had no effect, retry it"
        return "error: the tool is temporarily unavailable (ENV_TRANSIENT); the call had no effect, retry it"
