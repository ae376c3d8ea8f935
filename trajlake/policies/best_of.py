"""Baseline B2: best-of-N at a matched budget, chosen only by what the agent can see.

A group rollout (``trajlake rollout --attempts N``) plays N attempts per task and seed. ``select_best`` picks one
attempt per group and writes it to a new run, so ``trajlake eval`` reports B2 like any other run. The rule uses
only agent-visible signals, never the hidden tests:

1. the pass rate of the *visible* tests in the attempt's last ``run_tests`` observation (an attempt that never ran
   them ranks below every one that did);
2. then the attempt's own mean behaviour log-probability per generated token (the model's confidence);
3. then the lower attempt index.

The budget is matched: attempts are considered in attempt order while their cumulative tokens (tokens_in +
tokens_out) stay within the budget per group; attempt 0 is always considered. The budget is given in tokens, or
matched to another run (its mean tokens per episode over the same tasks). The report, printed and stored in the
new run's config, says the budget, what was spent and how many attempts were considered.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from trajlake.errors import TrajlakeError

RULE = "visible_tests_then_logprob"
_PASSED = re.compile(r"^(\d+) passed, (\d+) failed")


@dataclass
class Candidate:
    episode_id: str
    group_id: str
    task_id: str
    attempt: int
    tokens: int
    cost_usd: float
    visible_pass_rate: float | None
    mean_logprob: float | None

    def key(self) -> tuple[float, float, int]:
        return (self.visible_pass_rate if self.visible_pass_rate is not None else -1.0,
                self.mean_logprob if self.mean_logprob is not None else float("-inf"), -self.attempt)


@dataclass
class SelectionReport:
    pool_run: str
    out_run: str
    rule: str
    budget_tokens_per_group: float | None
    budget_cost_per_group: float | None
    matched_against: str | None
    groups: int
    mean_attempts_considered: float
    mean_tokens_spent_per_group: float
    mean_cost_spent_per_group: float
    chosen: dict[str, int] = field(default_factory=dict)
    """group_id -> chosen attempt."""

    def summary(self) -> str:
        parts = []
        if self.budget_tokens_per_group is not None:
            parts.append(f"{self.budget_tokens_per_group:.0f} tokens per task and seed" +
                         (f" (matched to run {self.matched_against})" if self.matched_against else ""))
        if self.budget_cost_per_group is not None:
            parts.append(f"${self.budget_cost_per_group:g} per task and seed")
        budget = " and ".join(parts) or "unlimited"
        return (f"B2 best-of-N {self.out_run} from {self.pool_run}: {self.groups} group(s), rule {self.rule} "
                f"(visible tests, own log-probs; never hidden tests); budget {budget}; spent "
                f"{self.mean_tokens_spent_per_group:.0f} tokens and ${self.mean_cost_spent_per_group:.4f} per group "
                f"on average over {self.mean_attempts_considered:.2f} attempt(s)")


def visible_pass_rate(observation: str) -> float | None:
    """Pass rate of a ``run_tests`` observation ("3 passed, 1 failed ..."), None when it has no count."""
    m = _PASSED.match(observation or "")
    if m is None:
        return None
    passed, failed = int(m.group(1)), int(m.group(2))
    return passed / (passed + failed) if passed + failed else None


def candidates(con: Any, run: str) -> list[Candidate]:
    """Every episode of ``run`` with its agent-visible signals."""
    rows = con.execute("""
        with tests as (
            select episode_id, arg_max(raw_content, turn_idx) as last_tests
            from turns where run_id = ? and actor = 'env' and action_schema = 'run_tests' group by episode_id),
        lp as (
            select episode_id, sum(list_sum(behavior_logprobs)) as s, sum(len(behavior_logprobs)) as n
            from turns where run_id = ? and actor = 'policy' and behavior_logprobs is not null group by episode_id)
        select e.episode_id, e.group_id, e.task_id, e.attempt, coalesce(e.tokens_in, 0) + coalesce(e.tokens_out, 0),
               coalesce(e.cost_usd, 0), t.last_tests, lp.s, lp.n
        from episodes e left join tests t using (episode_id) left join lp using (episode_id)
        where e.run_id = ? order by e.group_id, e.attempt""", [run, run, run]).fetchall()
    return [Candidate(r[0], r[1], r[2], int(r[3]), int(r[4]), float(r[5]),
                      visible_pass_rate(r[6]) if r[6] is not None else None,
                      float(r[7]) / int(r[8]) if r[8] else None) for r in rows]


def matched_budget(con: Any, run: str, task_ids: set[str]) -> float:
    """Mean tokens per episode of ``run`` over ``task_ids``."""
    rows = con.execute("select task_id, coalesce(tokens_in, 0) + coalesce(tokens_out, 0) from episodes "
                       "where run_id = ?", [run]).fetchall()
    spent = [t for task, t in rows if task in task_ids]
    if not spent:
        raise TrajlakeError(f"--match {run}: the run has no episodes on the pool's tasks")
    return sum(spent) / len(spent)


def choose(cands: list[Candidate], budget_tokens: float | None, budget_cost: float | None = None
           ) -> tuple[dict[str, Candidate], dict[str, list[Candidate]]]:
    """The chosen candidate of each group and the candidates considered within the budget (tokens, cost or
    both)."""
    groups: dict[str, list[Candidate]] = defaultdict(list)
    for c in sorted(cands, key=lambda c: (c.group_id, c.attempt)):
        groups[c.group_id].append(c)
    chosen: dict[str, Candidate] = {}
    considered: dict[str, list[Candidate]] = {}
    for g, cs in groups.items():
        used: list[Candidate] = []
        total, spent = 0, 0.0
        for c in cs:
            if used and ((budget_tokens is not None and total + c.tokens > budget_tokens) or
                         (budget_cost is not None and spent + c.cost_usd > budget_cost)):
                break
            used.append(c)
            total += c.tokens
            spent += c.cost_usd
        considered[g] = used
        chosen[g] = max(used, key=Candidate.key)
    return chosen, considered


def _copy_id(episode_id: str, pool_run: str, out_run: str) -> str:
    """The chosen episode's id in the new run: the pool's id under ``out_run``, as attempt 0 (``.../a0``)."""
    rest = episode_id[len(pool_run):]
    head, sep, tail = rest.rpartition("/a")
    return out_run + (f"{head}/a0" if sep and tail.isdigit() else rest)


def select_best(lake_path: str, pool_run: str, out_run: str, *, budget_tokens: float | None = None,
                match_run: str | None = None, budget_cost: float | None = None, label: str | None = None,
                tags: dict[str, str] | None = None) -> SelectionReport:
    """Write the best attempt of each group of ``pool_run`` to the new run ``out_run`` (``runs.label``: ``label``,
    default the run id; ``tags`` recorded in its config as a rollout's are)."""
    from trajlake.lake.store import Lake
    from trajlake.query import connect
    from trajlake.record.writer import LakeWriter
    from trajlake.schema import table_def

    lake = Lake.open(lake_path)
    con = connect(lake)
    if con.execute("select run_id from runs where run_id = ?", [out_run]).fetchall():
        raise TrajlakeError(f"run {out_run!r} already exists; choose another --out-run")
    run_rows = con.execute("select policy_name, policy_version, code_version, config from runs where run_id = ?",
                           [pool_run]).fetchall()
    cands = candidates(con, pool_run)
    if not run_rows or not cands:
        raise TrajlakeError(f"run {pool_run!r} has no episodes")
    if budget_tokens is not None and match_run is not None:
        raise TrajlakeError("give --budget-tokens or --match, not both")
    if match_run is not None:
        budget_tokens = matched_budget(con, match_run, {c.task_id for c in cands})
    chosen, considered = choose(cands, budget_tokens, budget_cost)
    ids = [c.episode_id for c in chosen.values()]
    tables = {}
    for name in ("episodes", "turns", "gateway_events"):
        cols = ", ".join(f'"{c}"' for c in table_def(name).column_names)
        t = con.execute(f"select {cols} from {name} where episode_id in (select unnest(?::varchar[]))",
                        [ids]).arrow()
        t = t.read_all() if hasattr(t, "read_all") else t
        new_ids = pa.array([_copy_id(e, pool_run, out_run) for e in t["episode_id"].to_pylist()], pa.string())
        t = t.set_column(t.schema.get_field_index("episode_id"), "episode_id", new_ids)
        if "attempt" in t.column_names:
            # the chosen episode is the new run's one attempt per (task, seed): attempt 0, so it pairs with any
            # one-attempt run in `trajlake eval` (which pairs by task, seed and attempt); the pool's attempt it
            # came from stays in the run's config (``chosen``)
            t = t.set_column(t.schema.get_field_index("attempt"), "attempt",
                             pa.array([0] * t.num_rows, t.schema.field("attempt").type))
        t = t.set_column(t.schema.get_field_index("run_id"), "run_id",
                         pa.array([out_run] * t.num_rows, pa.string()))
        for col in ("content_hash", "written_at"):
            if col in t.column_names:  # the writer computes them for the copies
                t = t.set_column(t.schema.get_field_index(col), col, pa.nulls(t.num_rows, t.schema.field(col).type))
        tables[name] = t
    assert pc.all(pc.starts_with(tables["episodes"]["episode_id"], out_run + "/")).as_py()
    report = SelectionReport(
        pool_run, out_run, RULE, budget_tokens, budget_cost, match_run, len(chosen),
        sum(len(v) for v in considered.values()) / len(considered),
        sum(sum(c.tokens for c in v) for v in considered.values()) / len(considered),
        sum(sum(c.cost_usd for c in v) for v in considered.values()) / len(considered),
        {g: c.attempt for g, c in sorted(chosen.items())})
    policy_name, policy_version, code_version, _ = run_rows[0]
    config = {"baseline": "B2", "selection": {k: v for k, v in asdict(report).items() if k != "chosen"},
              "chosen": report.chosen, **({"tags": dict(tags)} if tags else {})}
    import datetime as dt

    with LakeWriter(lake, handle_signals=False) as w:
        res = w.write_batch(tables["episodes"], tables["turns"], tables["gateway_events"], check_existing=False)
        res.raise_if_rejected()
        w.write_runs([{"run_id": out_run, "created_at": dt.datetime.now(dt.UTC), "label": label or out_run,
                       "config": json.dumps(config, sort_keys=True), "policy_name": f"best-of:{policy_name}",
                       "policy_version": policy_version, "code_version": code_version}])
    return report


__all__ = ["RULE", "Candidate", "SelectionReport", "candidates", "choose", "select_best", "visible_pass_rate"]
