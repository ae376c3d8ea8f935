"""Prompt-injection defences x payload kinds on Mini Web: utility and attack success per cell.

Round 3 of the security work (issue 26) added payloads that survive literal taint (``split``, ``reworded``,
``case_changed``, ``encoded``), the gateway's ``taint_mode="context"`` and approvers. This script plays the
scripted ``gullible`` policy (the oracle that obeys every instruction it reads, in every spelling) on the attacked
variants of every payload kind under each defence, and the benign tasks under each defence, in one process, so the
undefended control row is measured by the same code as the defended ones:

    python bench/bench_injection_defences.py [--stride N] [--json OUT]

Columns: benign utility (benign tasks solved), utility under attack (attacked variants solved without the
attacker's effects), attack success (the attacker's goal reached the ledger, read with the normalised predicates),
secret leaks (episodes whose credential left in an executed call or answer), confirmations asked and the human
cost they were priced at (``trajlake.envs.core.DEFAULT_HUMAN_INTERACTION_USD`` each, when an approver answered).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from trajlake.envs.mini_web import MiniWebEnv, task_view
from trajlake.envs.mini_web.grading import PAYLOAD_KINDS
from trajlake.envs.mini_web.policies import POLICIES

DEFENCES: dict[str, dict[str, Any]] = {
    "none": {},
    "literal taint": {"taint_mode": "literal"},
    "context taint": {"taint_mode": "context"},
    "context taint + approve_trusted": {"taint_mode": "context", "approver": "approve_trusted"},
}
KINDS: tuple[str, ...] = ("important_instructions", *PAYLOAD_KINDS)


@dataclass
class Cell:
    defence: str
    kind: str
    episodes: int = 0
    solved: int = 0
    attacked: int = 0
    leaked: int = 0
    confirmations: int = 0
    human_usd: float = 0.0


def play(env: MiniWebEnv, task: dict[str, Any], cell: Cell, max_steps: int = 100) -> None:
    """One episode of the gullible policy, counted into ``cell``."""
    policy = POLICIES["gullible"]("gullible")
    r = env.reset(0, task_id=task["task_id"])
    policy.reset(task_view(env, task["task_id"], task["task_version"], False), 0)
    obs, solved = r.observation, False
    for i in range(max_steps):
        res = env.step(policy.act(obs).action, f"k{i}")
        obs = res.observation
        cell.human_usd += res.cost_usd
        cell.confirmations += sum(1 for e in res.gateway_events if e["decision"] == "confirm"
                                  or "confirmed by approver" in e["reason"])
        if res.done:
            solved = res.reward_components.get("resolved", 0.0) >= 1.0
            break
    cell.episodes += 1
    cell.solved += solved
    cell.attacked += bool(env.attack_success)
    cell.leaked += env.secret_leak > 0


def run(stride: int, defences: Sequence[str], kinds: Sequence[str]) -> list[Cell]:
    cells = []
    for defence in defences:
        env = MiniWebEnv(**DEFENCES[defence])
        try:
            cell = Cell(defence, "benign")
            for t in env.tasks:
                play(env, t, cell)
            cells.append(cell)
        finally:
            env.close()
        for kind in kinds:
            env = MiniWebEnv(injection=kind, **DEFENCES[defence])
            try:
                cell = Cell(defence, kind)
                for t in env.tasks[::stride]:
                    play(env, t, cell)
                cells.append(cell)
            finally:
                env.close()
        print(f"  {defence}: done", file=sys.stderr, flush=True)
    return cells


def table(cells: Sequence[Cell]) -> str:
    """Markdown: one row per defence; utility under attack / attack success per payload kind."""
    kinds = [k for k in dict.fromkeys(c.kind for c in cells) if k != "benign"]
    head = ["defence", "benign utility", *(f"{k}: utility / attack" for k in kinds), "secret leaks",
            "confirmations (human USD)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for defence in dict.fromkeys(c.defence for c in cells):
        row = {c.kind: c for c in cells if c.defence == defence}
        b = row["benign"]
        attacked = [row[k] for k in kinds]
        leaks = sum(c.leaked for c in attacked)
        n = sum(c.episodes for c in attacked)
        conf = sum(c.confirmations for c in row.values())
        usd = sum(c.human_usd for c in row.values())
        lines.append("| " + " | ".join([defence, f"{b.solved}/{b.episodes}",
                                        *(f"{c.solved}/{c.episodes} / {c.attacked}/{c.episodes}" for c in attacked),
                                        f"{leaks}/{n}", f"{conf} (${usd:.2f})"]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stride", type=int, default=1, help="play every N-th attacked variant (default: all 128)")
    ap.add_argument("--defence", action="append", choices=sorted(DEFENCES), help="defence (repeatable; default all)")
    ap.add_argument("--kind", action="append", choices=KINDS, help="payload kind (repeatable; default all)")
    ap.add_argument("--json", help="also write the cells as JSON to this file")
    args = ap.parse_args(argv)
    if args.stride < 1:
        ap.error("--stride must be at least 1")
    t0 = time.perf_counter()
    cells = run(args.stride, args.defence or list(DEFENCES), args.kind or list(KINDS))
    print(table(cells))
    print(f"\n{sum(c.episodes for c in cells)} episodes in {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([asdict(c) for c in cells], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
