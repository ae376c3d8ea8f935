"""Summarisers of the context strategy ``summarize``: named, versioned components that write the text standing in
a policy's context for the turns trimming dropped.

A summariser is deterministic and writes no policy tokens: the runner records its summary as an actor
``summarizer`` turn with loss mask 0 and no log-probs, ``summary_version`` naming it (``extractive-v1``), and
``context_dropped_hash`` naming the turns it replaces. A summary the policy model wrote itself would be policy
tokens with log-probs (the spec: a policy-written summary left out of the action probabilities is a hidden
policy); none of the summarisers here is one.

``extractive-v1`` keeps the dropped turns' key facts, newest first under a token cap: each dropped call's tool and
arguments and the head of the observation that answered it (whitespace collapsed, at most ``head_chars``
characters). Calls that do not fit under the cap are counted as omitted, oldest first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trajlake.errors import TrajlakeError


@dataclass(frozen=True)
class DroppedTurn:
    """One turn the summary stands for."""

    turn_idx: int
    kind: str
    """``policy`` (a reply: its raw_content is the parsed call), ``observation`` or ``summary`` (an older summary,
    itself replaced: its facts are those of turns also being summarised)."""
    raw: str


class ExtractiveSummarizer:
    """``extractive-v1``: calls and observation heads of the dropped turns, newest first, under a token cap."""

    name = "extractive"
    version = "extractive-v1"

    def __init__(self, head_chars: int = 120):
        self.head_chars = head_chars

    def _call(self, raw: str) -> str:
        try:
            action = json.loads(raw)
        except ValueError:
            action = None
        if isinstance(action, dict) and isinstance(action.get("tool"), str):
            args = json.dumps(action.get("args", {}), sort_keys=True, ensure_ascii=False)
            return f"called {action['tool']} {args}"
        return f"wrote no valid tool call ({len(raw)} characters)"

    def _head(self, raw: str) -> str:
        flat = " ".join(raw.split())
        return flat if len(flat) <= self.head_chars else flat[:self.head_chars] + " ..."

    def lines(self, turns: Sequence[DroppedTurn]) -> list[str]:
        """One line per dropped reply (with the observation that answered it), oldest first."""
        out: list[str] = []
        for i, t in enumerate(turns):
            if t.kind != "policy":
                continue
            line = f"- turn {t.turn_idx} {self._call(t.raw)}"
            answer = next((u for u in turns[i + 1:] if u.kind != "summary"), None)
            if answer is not None and answer.kind == "observation":
                line += f"; turn {answer.turn_idx} answered: {self._head(answer.raw)}"
            out.append(line)
        return out

    def summarize(self, turns: Sequence[DroppedTurn], count_tokens: Callable[[str], int], max_tokens: int) -> str:
        """The summary of ``turns``: the header, a count of the calls left out, and the newest calls that fit with
        them in ``max_tokens`` tokens as ``count_tokens`` counts them (the header and count are always there)."""
        header = f"[Summary of turns {turns[0].turn_idx}-{turns[-1].turn_idx}, dropped from the context " \
                 f"({self.version})]"
        lines = self.lines(turns)

        def text(k: int) -> str:  # the newest k calls
            omitted = len(lines) - k
            note = [f"({omitted} older call(s) omitted)"] if omitted else []
            return "\n".join([header, *note, *lines[len(lines) - k:]])

        k = 0
        while k < len(lines) and count_tokens(text(k + 1)) <= max_tokens:
            k += 1
        return text(k)


SUMMARIZERS: dict[str, Callable[[], ExtractiveSummarizer]] = {"extractive": ExtractiveSummarizer}
"""Summariser name (``--policy-arg summarizer``) -> its class; the version it records is the class's ``version``."""


def make_summarizer(name: str) -> ExtractiveSummarizer:
    """The summariser ``name``; an unknown name is one clear error."""
    if name not in SUMMARIZERS:
        raise TrajlakeError(f"--policy-arg summarizer must be one of {', '.join(SUMMARIZERS)}, not {name!r}")
    return SUMMARIZERS[name]()


__all__ = ["SUMMARIZERS", "DroppedTurn", "ExtractiveSummarizer", "make_summarizer"]
