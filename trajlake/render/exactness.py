"""Check stored LM turns against the model: reconstruct each policy turn's context, detect template drift.

``model_contexts`` gives, for every policy turn of a stored episode, the token ids of the context the model
received (the concatenation of the earlier turns' ids, minus the turns named by ``context_dropped_hash``; under
``summarize`` the ``summarizer`` turn carrying the same hash stands right after the turns before the dropped range,
and no other summarizer turn is in the context) and the sampled ids. ``check_drift`` re-renders the observation turns with the current tokenizer and chat template and
names the first difference: a changed tokenizer, a changed chat template, or a re-tokenization drift.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trajlake.render.chat import ChatRenderer, split_fingerprint, system_prompt


@dataclass(frozen=True)
class PolicyTurnContext:
    turn_idx: int
    context_ids: list[int]
    generated_ids: list[int]
    behavior_logprobs: list[float] | None
    dropped: tuple[int, int] | None
    """Turn range [start, stop) left out of the context, when the context was trimmed."""
    kept: tuple[int, ...] = ()
    """Positions (in turn order) of the turns whose ids make up the context, in context order."""
    summary: int | None = None
    """Position of the ``summarizer`` turn standing in the context for the dropped range (strategy
    ``summarize``), or None."""


def _ids(turn: Mapping[str, Any]) -> list[int]:
    ids = turn.get("token_ids")
    return [] if ids is None else [int(i) for i in ids]


def dropped_range(turns: Sequence[Mapping[str, Any]], t: int, h: str) -> tuple[int, int]:
    """The contiguous range of turns before turn ``t`` whose hash is ``h`` (trimming drops whole turns)."""
    # drop_oldest and summarize drop from turn 1, single_turn and rerendered from turn 0: try those starts first.
    # For one start the hashes of all its ranges are one running sha256 over the canonical JSON list of
    # ``dropped_hash`` (``[`` then the items joined by ``,``), closed with ``]`` on a copy: linear, not quadratic,
    # in the episode's length.
    for start in [1, 0, *range(2, t)][:t]:
        running = hashlib.sha256(b"[")
        for stop in range(start + 1, t):
            item = json.dumps([int(turns[stop - 1]["turn_idx"]), turns[stop - 1].get("raw_content") or ""],
                              ensure_ascii=False, separators=(",", ":"))
            running.update(("," * (stop > start + 1) + item).encode("utf-8"))
            closed = running.copy()
            closed.update(b"]")
            if "sha256:" + closed.hexdigest() == h:
                return start, stop
    raise ValueError(f"turn {t}: no range of earlier turns matches context_dropped_hash {h[:19]}...")


def model_contexts(turns: Sequence[Mapping[str, Any]]) -> list[PolicyTurnContext]:
    """Per policy turn with token ids: the context the model received and what it sampled."""
    ordered = sorted(turns, key=lambda r: int(r["turn_idx"]))
    out = []
    for t, turn in enumerate(ordered):
        if turn.get("actor") != "policy" or turn.get("token_ids") is None or turn.get("tokenizer_id") is None:
            continue
        h = turn.get("context_dropped_hash")
        rng = dropped_range(ordered, t, h) if h else None
        summary = None
        if h and turn.get("context_strategy") == "summarize":
            summary = next((i for i in range(t - 1, -1, -1) if ordered[i].get("actor") == "summarizer"
                            and ordered[i].get("context_dropped_hash") == h), None)
            if summary is None:
                raise ValueError(f"turn {turn['turn_idx']}: context strategy summarize, but no earlier summarizer "
                                 f"turn carries its context_dropped_hash {h[:19]}...")
        start, stop = rng if rng is not None else (t, t)
        # summarizer turns are in the context only as the replacement of the dropped range
        rest = [i for i in (*range(start), *range(stop, t)) if ordered[i].get("actor") != "summarizer"]
        n_before = sum(1 for i in rest if i < start)
        kept = (*rest[:n_before], *([summary] if summary is not None else []), *rest[n_before:])
        lp = turn.get("behavior_logprobs")
        out.append(PolicyTurnContext(int(turn["turn_idx"]), [x for i in kept for x in _ids(ordered[i])],
                                     _ids(turn), None if lp is None else [float(v) for v in lp], rng, kept,
                                     summary))
    return out


def check_drift(turns: Sequence[Mapping[str, Any]], renderer: ChatRenderer,
                tools: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Problems found re-rendering a stored episode with ``renderer`` (empty: no drift). Each names its kind:
    ``tokenizer drift``, ``chat template drift`` or ``re-tokenization drift``, with the turn and token."""
    ordered = sorted(turns, key=lambda r: int(r["turn_idx"]))
    problems: list[str] = []
    now = split_fingerprint(renderer.tokenizer_id)
    seen: set[str] = set()
    for turn in ordered:
        tid = turn.get("tokenizer_id")
        if not tid or "|tok:" not in tid or tid in seen:
            continue
        seen.add(tid)
        then = split_fingerprint(tid)
        if then.get("tok") != now.get("tok"):
            problems.append(f"tokenizer drift: turn {turn['turn_idx']} was recorded with tokenizer {then.get('tok')}, "
                            f"the tokenizer now is {now.get('tok')}")
        if then.get("tmpl") != now.get("tmpl"):
            problems.append(f"chat template drift: turn {turn['turn_idx']} was recorded with chat template "
                            f"{then.get('tmpl')}, the template now is {now.get('tmpl')}")
    system = system_prompt(tools)
    for t, turn in enumerate(ordered[:-1]):
        j = t + 1  # the turn that read this one: the next policy turn (a summary may stand between)
        while j < len(ordered) - 1 and ordered[j].get("actor") == "summarizer":
            j += 1
        nxt = ordered[j]
        if nxt.get("actor") != "policy" or nxt.get("context_strategy") in ("single_turn", "rerendered"):
            continue
        if turn.get("tokenizer_id") != nxt.get("tokenizer_id") or turn.get("token_ids") is None:
            continue
        raw = turn.get("raw_content") or ""
        if turn.get("actor") == "summarizer":
            expected = renderer.summary(raw)
        elif t == 0:
            expected = renderer.initial(system, raw)
        else:
            prev = _ids(ordered[t - 1])
            expected = renderer.observation(raw, bool(prev) and prev[-1] == renderer.eos_id)
        recorded = _ids(turn)
        if expected != recorded:
            i = next((k for k, (a, b) in enumerate(zip(recorded, expected, strict=False)) if a != b),
                     min(len(recorded), len(expected)))
            a = recorded[i] if i < len(recorded) else None
            b = expected[i] if i < len(expected) else None
            kind = "re-tokenization drift" if not problems else "consequence"
            problems.append(f"{kind}: turn {turn['turn_idx']}, token {i}: recorded "
                            f"{a} ({renderer.decode([a]) if a is not None else 'end'!r}), re-rendered "
                            f"{b} ({renderer.decode([b]) if b is not None else 'end'!r})")
            break
    return problems


__all__ = ["PolicyTurnContext", "check_drift", "dropped_range", "model_contexts"]
