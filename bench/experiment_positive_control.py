"""The positive control (issue 24, section 3): does trajlake's trainer make an agent better, under controls?

    python bench/experiment_positive_control.py --seeds 3 --out bench/out/positive_control [--arms LIST] [--setup FILE]
    python bench/experiment_positive_control.py --judge EXPERIMENT_DIR --out DIR    # judge a folder already run
    python bench/experiment_positive_control.py --config EXPERIMENT.toml --seeds 1 --arms b1,r1,aa --out DIR

A thin wrapper over ``trajlake experiment run`` (docs/experiment.md), so that the experiment has one schema and
one report: it writes the experiment config of this design (``DIR/experiment.toml``: the Setup below, overridden
by ``--setup FILE.toml``, and the arms asked for), runs it into ``DIR/experiment`` (that folder's lake,
checkpoints, state and bundle: report.md, summary.json with the matrix and the pooled controls, model card,
trajectories), and then judges the positive control's own criterion, which is per seed where the experiment's
controls are pooled. On the ``tool-lookup`` environment (docs/tool_lookup.md: the agent must look values up
through a tool and read the observation to succeed), every arm is evaluated on the hidden split with common
sampling seeds and compared with the paired, task-clustered ``trajlake eval``:

- ``b1``: B1, supervised on ``data_policy``'s episodes of train tasks for a fixed number of steps (all train
  phrasings of every kind but the last ``rl_phrasings``);
- ``r1``: R1, RLOO on terminal reward from B1 (fresh sampling streams per iteration), playing tasks of the train
  phrasings B1 never saw;
- ``aa``: A/A, B1's checkpoint evaluated again with another sampling seed (the interval must include 0);
- ``placebo``: R1 with the returns shuffled within each group (the interval against B1 must include 0);
- ``matched``: matched compute (the experiment's B1M), B1 trained on for as many policy tokens as R1's updates used;
- ``mask``: the mask ablation, R1 with its loss on the tool-observation tokens too (pitfall of 19.6).

The criterion, written before any run: on each seed, R1 - B1 > 0 with its 95% interval above 0, and the A/A and
placebo intervals include 0. ``DIR/summary.json`` holds per seed the hidden success of every arm, each paired
difference with its interval and whether B1 is in the design's band (``b1_in_band``); ``DIR/report.md`` the table,
the criterion's verdict and the learning curves (``DIR/curves-seed<S>.svg``: the success of each RL arm's training
rollouts per iteration). Run again, the command resumes the experiment where it stopped and does nothing twice;
the experiment refuses to resume with other settings (``--seeds``, ``--arms``, ``--setup``) in the same DIR.
``--config EXPERIMENT.toml`` runs a ``trajlake experiment`` config of the design instead of the Setup (its name,
and so its run prefixes and B1's data order, and every setting the Setup has no field for, such as
``rl.ref_kl_coef``), with its ``seeds`` and ``arms`` replaced by ``--seeds`` and ``--arms`` when those are given,
then judges it as ``--judge`` does: ``--config configs/experiment-positive-control-constant.toml --seeds 1 --arms
b1,r1,aa`` is the eighth design's seed 0 (docs/training.md). ``--judge EXPERIMENT_DIR`` trains nothing: it judges the same criterion on a folder of ``trajlake experiment run``
(for example of ``configs/experiment-positive-control.toml``, which adds B0, B2, R2 and R3 to these arms), with the
arms, seeds and settings of that folder's experiment.toml, and writes ``DIR/summary.json`` and ``DIR/report.md``.

Results of the four designs in docs/training.md before 2026-12-03 came from this script's earlier, standalone
form (one lake per seed; ``git show c7e56b9:bench/experiment_positive_control.py``); the same design through the
experiment trains the same stages under other run and version names, so its figures are not bit-identical.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajlake.experiment.config import ExperimentConfig

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("b1", "r1", "aa", "placebo", "matched", "mask")
#: Each comparison of the criterion and the report: summary key -> (baseline arm, candidate arm).
COMPARISONS = {"r1_minus_b1": ("b1", "r1"), "aa": ("b1", "aa"), "placebo_minus_b1": ("b1", "placebo"),
               "matched_minus_b1": ("b1", "matched"), "mask_ablation_minus_r1": ("r1", "mask")}
#: The experiment's arm of each (its evaluation runs are ``s<seed>-<ARM>-<split>``).
ARM_RUNS = {"b1": "B1", "r1": "R1", "aa": "AA", "placebo": "PLACEBO", "matched": "B1M", "mask": "MASK"}
ARM_LABELS = {"b1": "B1", "r1": "R1", "aa": "A/A", "placebo": "placebo", "matched": "matched", "mask": "mask"}


@dataclasses.dataclass(frozen=True)
class Setup:
    """The experiment's settings (``--setup FILE.toml`` overrides any of them; recorded in summary.json)."""

    env: str = "tool-lookup"
    hidden_size: int = 64
    layers: int = 2
    heads: int = 8
    kv_heads: int = 8
    """Eight heads of size 8, each with its own keys and values: with the tiny module's default (4 heads sharing 2
    key/value heads, size 16) when the copying transition came was a property of the seed (~550 to beyond 3,000
    steps); with eight it came within ~1,000 steps on every seed probed (docs/tool_lookup.md, "Fourth probe")."""
    max_positions: int = 1024
    vocab_size: int = 1024
    corpus_tasks: int = 1000
    """The tiny tokenizer is trained on the oracle's episodes of this many train tasks: enough for every name and
    code of tool-lookup's pools to become one token (docs/tool_lookup.md)."""
    sft_tasks: int = 1000
    """B1's data: the oracle on the first this many tasks of B1's train families (seed 0)."""
    data_policy: str = "oracle"
    """The scripted policy whose episodes B1 is supervised on: ``oracle``, or ``oracle-shortcut`` (the fourth
    design: a privileged demonstrator that submits at once, unread, in 40% of its episodes;
    configs/positive-control-shortcut.toml)."""
    sft_steps: int = 2000
    """With eight heads the copying transition came within ~1,000 steps at lr 1e-2 on every seed probed (with the
    default four heads, ~550 to beyond 3,000 steps depending on the seed; docs/tool_lookup.md, "Fourth probe"):
    2,000 steps put every probed seed past it, the cosine decay then settling what was learnt."""
    sft_batch: int = 16
    sft_lr: float = 1e-2
    sft_lr_schedule: str = "cosine"
    sft_min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    sft_plateau_check: dict[str, Any] | None = None
    """``{step, window, max_loss}``: B1 is stopped and restarted from a new initialisation while its training loss
    stays above the bar (``[b1] plateau_check``, the tenth design); None: no check."""
    sft_rl_tasks_check: dict[str, Any] | None = None
    """``{min_success, attempts}``: B1 is restarted from a new initialisation when its success on R1's own train
    tasks is below the bar (``[b1] rl_tasks_check``, the twelfth design); None: no check."""
    sft_restarts: int = 0
    """``[b1] restarts``: how many new initialisations B1 may take (with ``sft_plateau_check`` or
    ``sft_rl_tasks_check``)."""

    rl_phrasings: int = 4
    """The last this many train phrasings of every kind are kept out of B1's data; R1 plays only their tasks.
    Phrasings B1 never saw leave R1 something to learn (success below 1, reward that varies within a group) once
    B1 fits its own, and learning them through the reward is the generalisation the hidden phrasings test. The
    placebo plays the same tasks, so seeing the phrasings without the reward is controlled for. Four (B1 on six):
    with two, R1's rewarded tasks did not exercise what the hidden phrasings need (reading a statement's kind from
    an unseen phrasing), and R1's gain on its own tasks did not reach hidden at a step where the placebo was
    neutral (docs/training.md, "The positive control: results")."""
    rl_tasks: int = 64
    """R1 plays this many tasks of the ``rl_phrasings`` families each iteration (``attempts`` each: one RLOO
    group)."""
    attempts: int = 4
    rl_iterations: int = 10
    rl_steps: int = 4
    rl_batch: int = 64
    rl_lr: float = 3e-4
    """At 1e-3 the placebo's reward-free updates took B1 to 0% (it must be neutral); at 3e-4 it stayed within
    3 points of B1 on its rollouts and identical on hidden (second design, seed 0), so R1 gets more iterations at
    this step instead of larger steps."""
    rl_warmup_steps: int = 2
    max_staleness: int = 0
    temperature: float = 1.0
    max_new_tokens: int = 48
    b1_band: tuple[float, float] = (0.2, 0.6)
    """The issue's band for B1's hidden success: outside it the design, not the trainer, decides the comparison (a
    B1 at 0 gives R1 no reward to learn from; one near 1 leaves nothing to gain). Reported per seed, apart from the
    criterion."""
    eval_split: str = "hidden"
    eval_seeds: str = "0"
    eval_sampling_seed: int = 0
    aa_sampling_seed: int = 1
    workers: int = 2
    policy_args: dict[str, str] = dataclasses.field(default_factory=dict)
    """More ``--policy-arg`` settings of every rollout (e.g. ``batch_episodes = "8"``)."""


def experiment_config(setup: Setup, arms: Sequence[str], seeds: int) -> dict[str, Any]:
    """The ``trajlake experiment`` config of this design (TOML data): Setup's settings, the arms asked for, and
    H1a when the matched arm runs (the experiment derives B1M from a hypothesis that names it). The experiment
    checks it as it checks any config."""
    s = setup
    run = [ARM_RUNS[a] for a in arms if a != "matched"]
    hypotheses = [{"id": "H1a", "hypothesis": "H1", "metric": "success", "baseline": "B1M", "candidate": "R1",
                   "matching": "training_compute",
                   "claim": "at matched training compute, R1's hidden success exceeds B1's (B1M: B1 trained on for "
                            "R1's policy tokens)"}] if "matched" in arms else []
    return {
        "name": "positive-control", "env": s.env, "seeds": seeds, "arms": run, "eval_splits": [s.eval_split],
        "eval_tasks": 0, "eval_seeds": s.eval_seeds, "sampling_seed": s.eval_sampling_seed,
        "aa_sampling_seed": s.aa_sampling_seed, "workers": s.workers, "device": "cpu", "temperature": s.temperature,
        "max_length": s.max_positions, "trajectories": 100,
        "policy_args": {"max_new_tokens": str(s.max_new_tokens), **s.policy_args},
        "model": {"build_tiny": True, "hidden_size": s.hidden_size, "layers": s.layers, "heads": s.heads,
                  "kv_heads": s.kv_heads, "max_positions": s.max_positions, "vocab_size": s.vocab_size,
                  "corpus_tasks": s.corpus_tasks, "tokenizer_env": s.env},
        "b1": {"data_policy": s.data_policy, "tasks": s.sft_tasks, "steps": s.sft_steps, "batch_size": s.sft_batch,
               "lr": s.sft_lr, "warmup_steps": s.warmup_steps, "lr_schedule": s.sft_lr_schedule,
               "min_lr_ratio": s.sft_min_lr_ratio,
               **({"plateau_check": s.sft_plateau_check} if s.sft_restarts and s.sft_plateau_check else {}),
               **({"rl_tasks_check": s.sft_rl_tasks_check} if s.sft_restarts and s.sft_rl_tasks_check else {}),
               **({"restarts": s.sft_restarts} if s.sft_restarts else {})},
        "rl": {"algo": "rloo", "holdout_phrasings": s.rl_phrasings, "tasks": s.rl_tasks, "attempts": s.attempts,
               "iterations": s.rl_iterations, "steps": s.rl_steps, "batch_size": s.rl_batch, "lr": s.rl_lr,
               "warmup_steps": s.rl_warmup_steps, "max_staleness": s.max_staleness},
        **({"hypotheses": hypotheses} if hypotheses else {}),
    }


def to_toml(data: dict[str, Any]) -> str:
    """TOML of :func:`experiment_config`'s data: scalars, lists and string maps inline, dicts of settings as
    tables, lists of dicts as arrays of tables (strings as JSON strings, which TOML reads alike)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float, str)):
            return json.dumps(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(f"no TOML for {type(v).__name__}")

    tables = {k: v for k, v in data.items() if k in ("model", "b1", "rl", "decision")}
    arrays = {k: v for k, v in data.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)}
    lines = [f"{k} = {value(v)}" for k, v in data.items() if k not in tables and k not in arrays]
    for name, table in tables.items():
        lines += ["", f"[{name}]"] + [f"{k} = {value(v)}" for k, v in table.items()]
    for name, items in arrays.items():
        for item in items:
            lines += ["", f"[[{name}]]"] + [f"{k} = {value(v)}" for k, v in item.items()]
    return "\n".join(lines) + "\n"


def compare_success(lake: Path, baseline: str, candidate: str) -> dict[str, Any]:
    """The paired, task-clustered difference in success of two runs (``trajlake eval``'s comparison)."""
    from trajlake.evaluators.report import build_report

    cmp = build_report(lake, baseline=baseline, candidate=candidate)["comparison"]
    m = cmp["metrics"]["success"]
    return {"estimate": m["diff"], "ci_low": m["ci_low"], "ci_high": m["ci_high"], "p_value": m["p_value"],
            "n_pairs": cmp["n_pairs"], "n_tasks": cmp["n_tasks"], "baseline": baseline, "candidate": candidate,
            "gained": m["gained"], "lost": m["lost"]}


_PER_TASK_DIFFERENCES = """
with per_task as (select run_id, task_id, avg(case when success then 1.0 else 0.0 end) as s from episodes
                  where run_id in (?, ?) group by run_id, task_id),
     family as (select distinct task_id, family from tasks)
select b.task_id, family.family, c.s - b.s
from per_task b join per_task c on c.task_id = b.task_id and c.run_id = ?
     left join family on family.task_id = b.task_id
where b.run_id = ? order by b.task_id"""


def _has_tasks(con: Any) -> bool:
    """Whether the lake read by ``con`` has a ``tasks`` table (the template families live there)."""
    return "tasks" in {r[0] for r in con.execute("select table_name from information_schema.tables").fetchall()}


def family_clustered(con: Any, baseline: str, candidate: str) -> dict[str, Any] | None:
    """Sensitivity, not the criterion: the paired success difference of two runs with the tasks' template
    families (phrasings) as clusters instead of the tasks (CR1 standard error, t with families - 1 degrees of
    freedom). A change in how a model reads one phrasing moves all of that phrasing's tasks together, which the
    task-clustered interval counts as independent evidence; with few families this interval is wide. None when
    a task has no row (no family) in the lake's ``tasks`` table."""
    from trajlake.evaluators.stats import clustered_mean

    if not _has_tasks(con):
        return None
    rows = con.execute(_PER_TASK_DIFFERENCES, [baseline, candidate, candidate, baseline]).fetchall()
    if not rows or any(r[1] is None for r in rows):
        return None
    e = clustered_mean([r[2] for r in rows], [r[1] for r in rows])
    finite = e.n_clusters >= 2
    return {"estimate": e.estimate, "ci_low": e.ci_low if finite else None, "ci_high": e.ci_high if finite else None,
            "n_tasks": e.n, "n_families": e.n_clusters}


_FIRST_ACTIONS = """
with first as (select episode_id, arg_min(raw_content, turn_idx) as action from turns
               where run_id = ? and actor = 'policy' group by episode_id),
     family as (select distinct task_id, family from tasks)
select e.episode_id, family.family, e.success, first.action
from episodes e left join first using (episode_id) left join family using (task_id)
where e.run_id = ? order by e.episode_id"""


def behaviour(con: Any, run: str) -> dict[str, dict[str, Any]] | None:
    """What a run did, per task kind (the part of its template family before ``/``: tool-lookup's ``code``,
    ``two_hop``, ``pair``; the family itself when it has no ``/``): ``episodes``; ``success``; ``phrasings_read``
    (families with at least one success) of ``phrasings`` (families played), since a tiny model reads some
    phrasings of a kind and not others; ``first_action_submit``, the share of episodes whose first action calls
    ``submit`` (an answer given before any lookup: unread). None when a task has no row in the lake's ``tasks``."""
    from trajlake.render.toolcall import parse_tool_call

    if not _has_tasks(con):
        return None
    rows = con.execute(_FIRST_ACTIONS, [run, run]).fetchall()
    if not rows or any(family is None for _, family, _, _ in rows):
        return None
    kinds: dict[str, dict[str, Any]] = {}
    for _, family, success, action in rows:
        k = kinds.setdefault(family.split("/", 1)[0], {"episodes": 0, "successes": 0, "submits": 0, "read": set(),
                                                       "played": set()})
        k["episodes"] += 1
        k["successes"] += bool(success)
        k["submits"] += action is not None and parse_tool_call(action).tool == "submit"
        k["played"].add(family)
        if success:
            k["read"].add(family)
    return {kind: {"episodes": k["episodes"], "success": k["successes"] / k["episodes"],
                   "phrasings_read": len(k["read"]), "phrasings": len(k["played"]),
                   "first_action_submit": k["submits"] / k["episodes"]}
            for kind, k in sorted(kinds.items())}


def mixed_groups(con: Any, runs: Sequence[str]) -> list[tuple[int, float]]:
    """Per iteration of an RL arm (its training runs ``...-itN``): the share of its tasks whose attempts had mixed
    outcomes, some solved and some not. RLOO's advantage is zero on a task whose attempts all succeed or all fail,
    so this is the share of the iteration's tasks that carry any reward signal."""
    its = [r for r in runs if "-it" in r]
    if not its:
        return []
    rows = con.execute(
        "with g as (select run_id, task_id, avg(coalesce(success, false)::double) as s from episodes "
        "where run_id in (select unnest(?::varchar[])) group by 1, 2) "
        "select run_id, avg(case when s > 0 and s < 1 then 1.0 else 0.0 end) from g group by 1", [its]).fetchall()
    return sorted((int(r.rsplit("-it", 1)[1]), float(v)) for r, v in rows)


def seed_results(folder: Path, setup: Setup, arms: Sequence[str], seed: int) -> dict[str, Any]:
    """One training seed's figures from the experiment folder: the hidden success of every arm, each paired
    comparison of COMPARISONS, the RL arms' learning curves and the seconds each arm's stages took."""
    from trajlake.evaluators.report import build_report

    from trajlake.experiment.bundle import Runs, curves
    from trajlake.experiment.run import State
    from trajlake.query import connect

    lake, split = folder / "lake", setup.eval_split
    state = State.load(folder)

    def eval_run(arm: str) -> str:
        return f"s{seed}-{ARM_RUNS[arm]}-{split}"

    runs = [eval_run(a) for a in arms]
    report = build_report(lake, runs=runs)
    out: dict[str, Any] = {"seed": seed, "success": {}, "lake_versions": report.get("lake_versions")}
    con = connect(lake)  # one connection for every query below (each connect reads the lake's logs again)
    for arm in arms:
        out["success"][ARM_LABELS[arm]] = report["runs"][eval_run(arm)]["metrics"]["success"]["estimate"]
    for key, (base, cand) in COMPARISONS.items():
        if base in arms and cand in arms:
            out[key] = compare_success(lake, eval_run(base), eval_run(cand))
            if (by_family := family_clustered(con, eval_run(base), eval_run(cand))) is not None:
                out[key]["by_family"] = by_family
    by_kind = {ARM_LABELS[a]: got for a in arms if (got := behaviour(con, eval_run(a))) is not None}
    if by_kind:
        out["behaviour"] = by_kind
    rl_arms = [a for a in arms if a in ("r1", "placebo", "mask")]
    trained = {(seed, ARM_RUNS[a]): entry for a in rl_arms
               if (entry := state.done(f"s{seed}/{ARM_RUNS[a]}/train")) is not None}
    learning = curves(con, Runs(eval={}, fault={}, train=trained, unfinished=[]))
    out["curves"] = {ARM_LABELS[a]: learning.get(f"{ARM_RUNS[a]} s{seed}", []) for a in rl_arms}
    out["mixed_groups"] = {ARM_LABELS[a]: mixed_groups(con, entry.get("runs", [])) for a in rl_arms
                           if (entry := trained.get((seed, ARM_RUNS[a]))) is not None}
    seconds: dict[str, float] = {}
    for key, entry in state.stages.items():
        s, arm, _ = key.split("/", 2)
        label = next((a for a in arms if ARM_RUNS[a] == arm), None)
        if s == f"s{seed}" and label is not None and "seconds" in entry:
            seconds[label] = round(seconds.get(label, 0.0) + float(entry["seconds"]), 1)
    out["seconds"] = seconds
    b1 = state.done(f"s{seed}/B1/train") or {}
    if b1.get("restarts") is not None:  # the B1s stopped on the plateau, and the initialisation B1 came from
        out["b1_restarts"] = {"stopped": b1["restarts"], "model_seed": b1.get("model_seed")}
    if b1.get("rl_tasks_check") is not None:  # the B1 R1 started from, on R1's own train tasks
        out["b1_rl_tasks_success"] = b1["rl_tasks_check"]["success"]
    return out


def _stopped(r: dict[str, Any]) -> str:
    """One stopped B1 attempt, in words: on its loss plateau, or below the RL-tasks bar."""
    if r.get("check") == "rl_tasks":
        return f"model seed {r['model_seed']} stopped after training (success {r['rl_tasks_success']:.3f} on R1's tasks)"
    return f"model seed {r['model_seed']} stopped at step {r['step']} (mean loss {r['mean_loss']:.3f})"


def verdict(seeds: Sequence[dict[str, Any]]) -> tuple[bool | None, list[str]]:
    """The preregistered criterion: on each seed R1 - B1 > 0 with its interval above 0, and the A/A and placebo
    intervals include 0. None when an arm it needs was not run."""
    lines: list[str] = []
    ok: bool | None = True
    for s in seeds:
        parts = []
        for key, want in (("r1_minus_b1", "above 0"), ("aa", "includes 0"), ("placebo_minus_b1", "includes 0")):
            d = s.get(key)
            if d is None or d["ci_low"] is None:
                parts.append(f"{key} not run")
                ok = None if ok is not False else ok
                continue
            good = d["ci_low"] > 0 if want == "above 0" else d["ci_low"] <= 0 <= d["ci_high"]
            ok = ok and good if ok is not None else ok
            parts.append(f"{key} {d['estimate']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] {want}: "
                         f"{'yes' if good else 'NO'}")
        lines.append(f"seed {s['seed']}: " + "; ".join(parts))
    return ok, lines


def verdict_so_far(seeds: Sequence[dict[str, Any]], seeds_planned: int | None) -> tuple[bool | None, list[str]]:
    """:func:`verdict` of the finished seeds; None (incomplete) while they pass but seeds remain to be run."""
    ok, lines = verdict(seeds)
    if ok and seeds_planned is not None and len(seeds) < seeds_planned:
        ok = None
    return ok, lines


def b1_in_band(setup: Setup, seed: dict[str, Any]) -> bool | None:
    """Whether the seed's B1 hidden success lies in ``setup.b1_band`` (None without a B1 arm)."""
    b1 = seed["success"].get("B1")
    return None if b1 is None else setup.b1_band[0] <= b1 <= setup.b1_band[1]


def pooled_moves(seeds: Sequence[dict[str, Any]]) -> list[str]:
    """Report lines: per comparison, the matched episodes gained and lost summed over the seeds, with an exact
    two-sided sign test on them. Descriptive (episodes of one phrasing move together, which the test ignores): a
    control whose gains outnumber its losses seed after seed is not a null, whatever each seed's interval says."""
    from trajlake.evaluators.stats import sign_test

    lines = []
    for key in COMPARISONS:
        moves = [(s[key]["gained"], s[key]["lost"]) for s in seeds if key in s and "gained" in s[key]]
        if len(moves) < 2:
            continue
        gained, lost = sum(g for g, _ in moves), sum(x for _, x in moves)
        p = sign_test([0.0] * (gained + lost), [1.0] * gained + [-1.0] * lost)
        lines.append(f"- {key}: {gained} gained, {lost} lost over {len(moves)} seeds (sign test p {p:.3g})")
    if not lines:
        return []
    return ["", "Matched episodes gained and lost, summed over seeds (not the criterion; added after the fifteenth "
            "design's run, whose placebo lost no hidden task on any seed): a control should lose about as many as "
            "it gains.", "", *lines]


def write_report(out: Path, setup: Setup, arms: Sequence[str], seeds: Sequence[dict[str, Any]], command: str,
                 seeds_planned: int | None = None) -> None:
    from trajlake.evaluators.svg import PALETTE, lines

    ok, verdict_lines = verdict_so_far(seeds, seeds_planned)
    md = ["# Positive control: does the trainer make the agent better?", "",
          f"Command: `{command}`", "",
          "Criterion (written before the run): on each seed, R1 - B1 > 0 with the 95% interval above 0; the A/A "
          "and placebo intervals include 0.", "",
          f"**Verdict: {'criterion met' if ok else 'criterion NOT met' if ok is False else 'incomplete'}**"
          + (f" ({len(seeds)} of {seeds_planned} seeds done)" if seeds_planned and len(seeds) < seeds_planned else ""),
          ""]
    md += [f"- {line}" for line in verdict_lines] + [""]
    low, high = setup.b1_band
    for s in seeds:
        inside = b1_in_band(setup, s)
        if inside is not None:
            md.append(f"- seed {s['seed']}: B1's hidden success {s['success']['B1']:.3f} is "
                      f"{'inside' if inside else 'OUTSIDE'} the design's band [{low:.2f}, {high:.2f}]")
    md += [""]
    labels = [ARM_LABELS[a] for a in arms]
    md += ["| seed | " + " | ".join(f"{lab} success" for lab in labels) + " |",
           "|---|" + "---|" * len(labels)]
    for s in seeds:
        md.append(f"| {s['seed']} | " + " | ".join(f"{s['success'].get(lab, float('nan')):.3f}" for lab in labels)
                  + " |")
    md += ["", "| seed | comparison | difference | 95% interval | p | pairs (tasks) | gained / lost |",
           "|---|---|---|---|---|---|---|"]
    for s in seeds:
        for key in COMPARISONS:
            if key in s:
                d = s[key]
                moved = f"{d['gained']} / {d['lost']}" if "gained" in d else "-"
                md.append(f"| {s['seed']} | {key} ({d['candidate']} - {d['baseline']}) | {d['estimate']:+.3f} | "
                          f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | {d['p_value']:.3g} | {d['n_pairs']} "
                          f"({d['n_tasks']}) | {moved} |")
    md += pooled_moves(seeds)
    md += ["", "Sensitivity, not the criterion (added after the twelfth design's run): the same differences with "
           "the hidden tasks' template families (phrasings) as clusters, CR1 with t on families - 1 degrees of "
           "freedom. A change in how a model reads one phrasing moves all of its tasks together; the task-clustered "
           "interval above counts them as independent.", "",
           "| seed | comparison | difference | 95% interval, families as clusters | families |", "|---|---|---|---|---|"]
    for s in seeds:
        for key in COMPARISONS:
            if key in s and "by_family" in s[key]:
                f = s[key]["by_family"]
                interval = ("n/a" if f["ci_low"] is None else f"[{f['ci_low']:+.3f}, {f['ci_high']:+.3f}]")
                md.append(f"| {s['seed']} | {key} | {f['estimate']:+.3f} | {interval} | {f['n_families']} |")
    if any("behaviour" in s for s in seeds):
        md += ["", "Behaviour on the evaluation split, per task kind (not the criterion; added after the fourteenth "
               "design's run): success, the phrasings (template families) with at least one success of those "
               "played, and the share of episodes whose first action is `submit` (an answer given before any "
               "lookup).", "",
               "| seed | arm | kind | episodes | success | phrasings read | first action submit |",
               "|---|---|---|---|---|---|---|"]
        for s in seeds:
            for label, kinds in s.get("behaviour", {}).items():
                for kind, k in kinds.items():
                    md.append(f"| {s['seed']} | {label} | {kind} | {k['episodes']} | {k['success']:.3f} | "
                              f"{k['phrasings_read']} / {k['phrasings']} | {k['first_action_submit']:.3f} |")
    for s in seeds:
        if s.get("curves"):
            name = f"curves-seed{s['seed']}.svg"
            series = [(label, pts, PALETTE[i % len(PALETTE)]) for i, (label, pts) in enumerate(s["curves"].items())]
            (out / name).write_text(lines(series, x_label="iteration", y_label="training-rollout success",
                                          title=f"seed {s['seed']}: success of the RL arms' rollouts",
                                          y_range=(0.0, 1.0)), encoding="utf-8")
            md += ["", f"![learning curves, seed {s['seed']}]({name})"]
        for label, pts in s.get("mixed_groups", {}).items():
            if pts:
                md += ["", f"Seed {s['seed']}: {label}'s tasks with mixed outcomes over its attempts (the only ones "
                           "with a nonzero RLOO advantage), per iteration: "
                           + ", ".join(f"{share:.2f}" for _, share in pts)]
        md += ["", f"Seed {s['seed']}: wall seconds per arm {json.dumps(s.get('seconds', {}))}"]
        if "b1_restarts" in s:
            stopped = s["b1_restarts"]["stopped"]
            md += ["", f"Seed {s['seed']}: B1 from model seed {s['b1_restarts']['model_seed']}; "
                       + (", ".join(_stopped(r) for r in stopped) if stopped
                          else "its first initialisation passed the checks")
                       + (f"; it solved {s['b1_rl_tasks_success']:.3f} of R1's train tasks"
                          if "b1_rl_tasks_success" in s else "")]
    md += ["", "Settings:", "", "```json", json.dumps(dataclasses.asdict(setup), indent=2), "```", ""]
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")


def setup_from_config(cfg: ExperimentConfig) -> Setup:
    """The Setup an experiment config runs (the inverse of :func:`experiment_config` on the fields it writes), so
    that a folder run from ``configs/experiment-positive-control.toml`` is judged and reported with its own
    settings."""
    m, b1, rl = cfg.model, cfg.b1, cfg.rl
    return dataclasses.replace(
        Setup(), env=cfg.env, hidden_size=m.hidden_size, layers=m.layers, heads=m.heads, kv_heads=m.kv_heads,
        max_positions=m.max_positions, vocab_size=m.vocab_size, corpus_tasks=m.corpus_tasks, sft_tasks=b1.tasks,
        data_policy=b1.data_policy, sft_steps=b1.steps, sft_batch=b1.batch_size, sft_lr=b1.lr,
        sft_lr_schedule=b1.lr_schedule, sft_min_lr_ratio=b1.min_lr_ratio, warmup_steps=b1.warmup_steps,
        sft_plateau_check=dataclasses.asdict(b1.plateau_check) if b1.plateau_check is not None else None,
        sft_rl_tasks_check=dataclasses.asdict(b1.rl_tasks_check) if b1.rl_tasks_check is not None else None,
        sft_restarts=b1.restarts, rl_phrasings=rl.holdout_phrasings, rl_tasks=rl.tasks, attempts=rl.attempts,
        rl_iterations=rl.iterations, rl_steps=rl.steps, rl_batch=rl.batch_size, rl_lr=rl.lr, rl_warmup_steps=rl.warmup_steps,
        max_staleness=rl.max_staleness, temperature=cfg.temperature,
        max_new_tokens=int(cfg.policy_args.get("max_new_tokens", Setup.max_new_tokens)),
        eval_seeds=cfg.eval_seeds, eval_sampling_seed=cfg.sampling_seed, aa_sampling_seed=cfg.aa_sampling_seed,
        workers=cfg.workers, policy_args={k: v for k, v in cfg.policy_args.items() if k != "max_new_tokens"})


def judge(folder: Path, out: Path, command: str) -> int:
    """Judge the criterion on an experiment folder already run (by ``trajlake experiment run``, with any config
    that evaluates B1 and R1 on hidden): its arms, seeds and settings come from the folder's experiment.toml; the
    seeds whose every arm is evaluated are judged (the others are reported as not done)."""
    from trajlake.experiment.config import load_experiment
    from trajlake.experiment.run import State

    config = folder / "experiment.toml"
    if not config.is_file():
        print(f"{folder}: no experiment.toml (not a trajlake experiment folder)", file=sys.stderr)
        return 1
    cfg = load_experiment(config)
    setup = setup_from_config(cfg)
    ran = set(cfg.all_arms())
    arms = [a for a in ARMS if ARM_RUNS[a] in ran]
    if "b1" not in arms or "r1" not in arms or setup.eval_split not in cfg.eval_splits:
        print(f"{config}: the criterion needs arms B1 and R1 evaluated on {setup.eval_split} (arms "
              f"{', '.join(sorted(ran))}; eval_splits {', '.join(cfg.eval_splits)})", file=sys.stderr)
        return 1
    state = State.load(folder)
    done = [seed for seed in range(cfg.seeds)
            if all(state.done(f"s{seed}/{ARM_RUNS[a]}/eval:{setup.eval_split}") for a in arms)]
    out.mkdir(parents=True, exist_ok=True)
    results = [seed_results(folder, setup, arms, seed) for seed in done]
    write_outputs(out, setup, arms, results, command, seeds_planned=cfg.seeds)
    print(json.dumps({s["seed"]: {k: s[k] for k in ("success", *COMPARISONS) if k in s} for s in results}, indent=1))
    return 0


def config_with(text: str, source: str, *, seeds: int | None, arms: Sequence[str] | None) -> str:
    """``text`` (an experiment config's TOML) with its top-level ``seeds`` and ``arms`` lines replaced; the rest,
    comments included, kept as written."""
    import re

    wanted: dict[str, Any] = {}
    if seeds is not None:
        wanted["seeds"] = seeds
    if arms is not None:  # the matched arm is the experiment's B1M, which a hypothesis of the config asks for
        wanted["arms"] = [ARM_RUNS[a] for a in arms if a != "matched"]
    for key, value in wanted.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {json.dumps(value)}", text, count=1, flags=re.MULTILINE)
        if n != 1:
            raise SystemExit(f"{source}: no top-level `{key} = ...` line to replace (give the key in the config)")
    data = tomllib.loads(text)
    if any(data.get(key) != value for key, value in wanted.items()):
        raise SystemExit(f"{source}: `seeds` or `arms` is not a top-level key written on one line")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seeds", type=int, default=None, help="training seeds 0..N-1 (default 3; with --config, "
                                                                 "the config's)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "positive_control"))
    ap.add_argument("--arms", default=None, help=f"a subset of {','.join(ARMS)} (default all; with --config, the "
                                                 "config's)")
    ap.add_argument("--setup", help="a TOML file overriding the settings (Setup's fields)")
    ap.add_argument("--config", metavar="EXPERIMENT_TOML",
                    help="run this `trajlake experiment` config of the design (its name and settings; --seeds and "
                         "--arms replace its own when given) instead of the Setup, then judge it")
    ap.add_argument("--judge", metavar="EXPERIMENT_DIR",
                    help="run nothing: judge the criterion on a folder of `trajlake experiment run` (e.g. of "
                         "configs/experiment-positive-control.toml), its arms, seeds and settings from its "
                         "experiment.toml; writes --out's summary.json and report.md")
    args = ap.parse_args(argv)
    command = " ".join(["python", "bench/experiment_positive_control.py", *(argv if argv is not None else sys.argv[1:])])
    if args.judge:
        return judge(Path(args.judge).resolve(), Path(args.out).resolve(), command)
    if args.config and args.setup:
        ap.error("--config and --setup: give one (--setup sets the Setup's fields, --config a whole experiment)")
    arms = [a.strip() for a in (args.arms if args.arms is not None else ",".join(ARMS)).split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or not arms:
        ap.error(f"--arms: unknown arm(s) {', '.join(unknown) or '(none given)'}; arms: {', '.join(ARMS)}")
    needs = {"aa": "b1", "r1": "b1", "placebo": "b1", "mask": "r1", "matched": "r1"}
    for arm in arms:
        if needs.get(arm) and needs[arm] not in arms:
            ap.error(f"--arms: {arm} needs {needs[arm]}")
    arms = [a for a in ARMS if a in arms]
    if args.config:
        return run_config(Path(args.config), Path(args.out).resolve(), command, seeds=args.seeds,
                          arms=arms if args.arms is not None else None)
    seeds = 3 if args.seeds is None else args.seeds
    setup = Setup()
    if args.setup:
        with open(args.setup, "rb") as f:
            setup = dataclasses.replace(setup, **tomllib.load(f))
    out = Path(args.out).resolve()
    folder = run_in(out, to_toml(experiment_config(setup, arms, seeds)), command,
                    differs="other settings ({earlier}: --seeds, --arms or --setup differ); run it with those")
    if folder is None:
        return 1
    results = [seed_results(folder, setup, arms, seed) for seed in range(seeds)]
    write_outputs(out, setup, arms, results, command, seeds_planned=seeds)
    print(json.dumps({s["seed"]: {k: s[k] for k in ("success", *COMPARISONS) if k in s} for s in results}, indent=1))
    return 0


def run_in(out: Path, text: str, command: str, *, differs: str) -> Path | None:
    """Run (or resume) the experiment config ``text`` (written to ``out/experiment.toml``) in ``out/experiment``;
    returns that folder, or None after one line on stderr when the folder holds an experiment of another config
    (``differs`` says which, ``{earlier}`` standing for its config's path)."""
    from trajlake.experiment.run import run_experiment

    out.mkdir(parents=True, exist_ok=True)
    earlier = out / "experiment" / "experiment.toml"  # the experiment keeps a copy of the config it runs
    if earlier.is_file() and earlier.read_text(encoding="utf-8") != text:
        print(f"{out}: holds the experiment of {differs.format(earlier=earlier)} or choose another --out",
              file=sys.stderr)
        return None
    config = out / "experiment.toml"
    config.write_text(text, encoding="utf-8")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    folder = run_experiment(config, out / "experiment", log=log, command=command)
    log(f"experiment done in {(time.monotonic() - t0) / 60:.1f} min")
    return folder


def run_config(config: Path, out: Path, command: str, *, seeds: int | None, arms: Sequence[str] | None) -> int:
    """``--config``: run the experiment config (``seeds`` and ``arms`` replaced when given) into
    ``out/experiment``, then judge it into ``out``."""
    text = config_with(config.read_text(encoding="utf-8"), str(config), seeds=seeds, arms=arms)
    folder = run_in(out, text, command, differs="another config ({earlier}); run it with that one")
    return 1 if folder is None else judge(folder, out, command)


def write_outputs(out: Path, setup: Setup, arms: Sequence[str], results: Sequence[dict[str, Any]], command: str,
                  *, seeds_planned: int) -> None:
    """``summary.json`` and ``report.md`` for the seeds finished so far (``seeds_done`` of ``seeds_planned``)."""
    seeds = []
    for r in results:
        band = b1_in_band(setup, r)
        seeds.append({k: v for k, v in r.items() if k != "curves"}
                     | ({} if band is None else {"b1_in_band": band}) | {"curves": r["curves"]})
    summary = {"setup": dataclasses.asdict(setup), "arms": list(arms), "command": command,
               "seeds_planned": seeds_planned, "seeds_done": len(results), "seeds": seeds,
               "criterion_met": verdict_so_far(results, seeds_planned)[0]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    write_report(out, setup, arms, results, command, seeds_planned)


if __name__ == "__main__":
    sys.exit(main())
