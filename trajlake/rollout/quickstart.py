"""The main job on the embedded default (``trajlake quickstart``): roll out an environment's oracle, heuristic
and random policies on one split into the lake, build the paired report of heuristic vs random and write the
HTML report. The oracle must solve every task it played: otherwise the environment is broken on this machine
and the job fails, whatever the other numbers say."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajlake.errors import OracleFailedError, TrajlakeError
from trajlake.evaluators.metrics import Settings
from trajlake.evaluators.report import build_report
from trajlake.query import connect
from trajlake.rollout.runner import RolloutConfig, RolloutSummary, run_rollout

POLICIES = ("oracle", "heuristic", "random")


@dataclass
class QuickstartResult:
    """What the quickstart played and built."""

    runs: dict[str, str] = field(default_factory=dict)
    """policy -> run id."""
    summaries: dict[str, RolloutSummary] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    oracle_played: int = 0
    oracle_solved: int = 0
    oracle_failures: list[str] = field(default_factory=list)
    """Episode ids of oracle episodes that did not succeed."""


def oracle_outcome(lake: str | Path, run_id: str) -> tuple[int, int, list[str]]:
    """(episodes played, solved, unsolved episode ids) of an oracle run in the lake."""
    rows = connect(lake).execute("select episode_id, coalesce(success, false) from episodes where run_id = ? "
                                 "order by episode_id", [run_id]).fetchall()
    return len(rows), sum(1 for _, ok in rows if ok), [e for e, ok in rows if not ok]


def run_quickstart(lake: str | Path, *, env: str = "mini-swe", split: str = "dev", seeds: Sequence[int] = (0, 1),
                   workers: int = 2, resamples: int = 2000,
                   echo: Callable[[str], None] = lambda _: None) -> QuickstartResult:
    """Play the three policies, check the oracle, and build the report (rendering is the caller's)."""
    res = QuickstartResult()
    for policy in POLICIES:
        run_id = f"quickstart-{policy}" if env == "mini-swe" else f"quickstart-{env}-{policy}"
        cfg = RolloutConfig(lake=str(lake), run_id=run_id, env=env, policy=policy, split=split,
                            seeds=tuple(seeds), workers=max(1, workers))
        s = run_rollout(cfg)
        res.runs[policy], res.summaries[policy] = run_id, s
        echo(f"{run_id}: {s.written} new episode(s), {s.skipped_existing} already in the lake, "
             f"{s.successes} of the new ones successful")
        if s.failed_items:
            raise TrajlakeError(f"{run_id}: {len(s.failed_items)} episode(s) failed: {s.failed_items[0]}")
        if policy == "oracle":
            res.oracle_played, res.oracle_solved, res.oracle_failures = oracle_outcome(lake, run_id)
            if res.oracle_failures:
                raise OracleFailedError(
                    f"the oracle solved {res.oracle_solved} of the {res.oracle_played} tasks it played "
                    f"(first unsolved: {res.oracle_failures[0]}): grading is broken on this machine; run "
                    f"`trajlake doctor`")
    res.report = build_report(lake, runs=list(res.runs.values()), baseline=res.runs["random"],
                              candidate=res.runs["heuristic"], settings=Settings(resamples=resamples, seed=0))
    return res


__all__ = ["POLICIES", "OracleFailedError", "QuickstartResult", "oracle_outcome", "run_quickstart"]
