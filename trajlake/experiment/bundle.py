"""``trajlake experiment report DIR``: the experiment's bundle from its lake and state (docs/experiment.md).

Writes ``summary.json`` (the matrix per seed and pooled, ``hypotheses`` entries and verdicts, the lake versions
read, the reproducing commands), ``report.md`` and ``report.html`` (the same, with the success-cost Pareto and the
RL arms' learning curves), ``model_card.md``, ``contamination.json``, ``unrun.md``, ``browser.html`` (the failing
episodes of every evaluation run) and ``trajectories/`` (training episodes exported with ``export hf``, every one
replayed against the environment)."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import platform
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trajlake.errors import TrajlakeError
from trajlake.experiment.config import DecisionRule, ExperimentConfig, config_dict, load_experiment
from trajlake.experiment.hypotheses import entry_statistics, metric_values, rule_text, summarise, with_holm
from trajlake.experiment.run import CONFIG_COPY, State

Log = Callable[[str], None]
#: The metrics of the matrix (``trajlake eval``'s names).
MATRIX_METRICS = ("success", "steps", "tokens_out", "cost_usd", "recovery_rate")


def _f(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _clean(obj: Any) -> Any:
    """JSON without NaN (null instead): summary.json must be read by strict parsers."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.floating | np.integer):
        return _clean(obj.item())
    return obj


@dataclasses.dataclass
class Runs:
    """The experiment's runs, from its state: evaluation runs per (seed, arm, split), fault runs per (seed, arm),
    training runs per (seed, arm), and what was planned but has not finished."""

    eval: dict[tuple[int, str, str], str]
    fault: dict[tuple[int, str], str]
    train: dict[tuple[int, str], dict[str, Any]]
    unfinished: list[str]

    @classmethod
    def of(cls, cfg: ExperimentConfig, state: State) -> Runs:
        from trajlake.experiment.run import Experiment

        ev: dict[tuple[int, str, str], str] = {}
        fault: dict[tuple[int, str], str] = {}
        train: dict[tuple[int, str], dict[str, Any]] = {}
        unfinished: list[str] = []
        for what, seed, arm, split in Experiment.plan_of(cfg):
            key = {"train": f"s{seed}/{arm}/train", "eval": f"s{seed}/{arm}/eval:{split}",
                   "pool": f"s{seed}/{arm}/pool:{split}", "fault": f"s{seed}/{arm}/eval:fault"}[what]
            done = state.done(key)
            if done is None:
                unfinished.append(key)
            elif what == "train":
                train[(seed, arm)] = done
            elif what == "eval":
                ev[(seed, arm, split)] = str(done["run"])
            elif what == "fault":
                fault[(seed, arm)] = str(done["run"])
        return cls(ev, fault, train, unfinished)


# -- the numbers ------------------------------------------------------------------------------------------------
def matrix(data: Any, runs: Runs, cfg: ExperimentConfig) -> dict[str, Any]:
    """Per seed and arm and split the metric vector's estimates; pooled over seeds per arm and split: success,
    steps and cost with task-clustered intervals."""
    from trajlake.evaluators.report import evaluate
    from trajlake.evaluators.stats import clustered_mean

    report = evaluate(data, breakdown=False, taxonomy=False)
    per_seed: list[dict[str, Any]] = []
    for (seed, arm, split), run in sorted(runs.eval.items()):
        m = report["runs"].get(run, {}).get("metrics", {})
        per_seed.append({"seed": seed, "arm": arm, "split": split, "run": run,
                         "n_episodes": report["runs"].get(run, {}).get("n_episodes", 0),
                         **{k: _f(m.get(k, {}).get("estimate")) for k in MATRIX_METRICS}})
    pooled: list[dict[str, Any]] = []
    ep = data.ep
    arms_splits = sorted({(arm, split) for (_, arm, split) in runs.eval})
    for arm, split in arms_splits:
        idx = np.concatenate([data.run_index(r) for (s, a, sp), r in runs.eval.items() if a == arm and sp == split])
        row: dict[str, Any] = {"arm": arm, "split": split, "n_episodes": int(idx.shape[0]),
                               "seeds": sorted(s for (s, a, sp) in runs.eval if a == arm and sp == split)}
        for metric in ("success", "steps", "cost_usd"):
            v = ep[metric][idx]
            keep = ~np.isnan(v)
            est = clustered_mean(v[keep], ep["task_code"][idx][keep]) if keep.any() else None
            row[metric] = {"estimate": est.estimate if est else math.nan, "ci_low": est.ci_low if est else math.nan,
                           "ci_high": est.ci_high if est else math.nan, "n": int(keep.sum())}
        pooled.append(row)
    return {"per_seed": per_seed, "pooled": pooled}


def pooled_pairs(data: Any, run_pairs: Sequence[tuple[str, str]], metric: str, decision: DecisionRule
                 ) -> dict[str, Any]:
    """The paired difference of ``metric`` over every (baseline run, candidate run) pair (one per training seed):
    matched episodes pooled, clustered by task (:func:`entry_statistics`)."""
    from trajlake.evaluators.report import pairs

    bs, cs, ks = [], [], []
    for b_run, c_run in run_pairs:
        b_idx, c_idx, _ = pairs(data, b_run, c_run)
        b, c, keep = metric_values(data.ep, b_idx, c_idx, metric, data.run_index(b_run))
        bs.append(b[keep])
        cs.append(c[keep])
        ks.append(data.ep["task_code"][b_idx][keep])
    b_all, c_all, k_all = (np.concatenate(x) if x else np.zeros(0) for x in (bs, cs, ks))
    return entry_statistics(b_all, c_all, k_all, decision)


def hypotheses(data: Any, runs: Runs, cfg: ExperimentConfig, reward_check: dict[str, Any] | None
               ) -> list[dict[str, Any]]:
    """Every configured entry: the pooled paired difference, Holm across entries, the verdict."""
    entries: list[dict[str, Any]] = []
    for spec in cfg.hypotheses:
        split = spec.split or cfg.primary_split
        run_pairs, notes = [], []
        for seed in range(cfg.seeds):
            if spec.metric == "recovery_held_out":
                b_run, c_run = runs.fault.get((seed, spec.baseline)), runs.fault.get((seed, spec.candidate))
            else:
                b_run, c_run = runs.eval.get((seed, spec.baseline, split)), runs.eval.get((seed, spec.candidate, split))
            if b_run is None or c_run is None:
                notes.append(f"seed {seed}: {spec.baseline if b_run is None else spec.candidate} not run")
            else:
                run_pairs.append((b_run, c_run))
        stats = pooled_pairs(data, run_pairs, spec.metric, cfg.decision)
        entry: dict[str, Any] = {"id": spec.id, "hypothesis": spec.hypothesis, "claim": spec.claim,
                                 "rule": rule_text(spec, cfg.decision, split), "metric": spec.metric,
                                 "baseline": spec.baseline, "candidate": spec.candidate,
                                 "direction": spec.direction, "matching": spec.matching, "split": split, **stats,
                                 "notes": notes}
        if stats["n_pairs"] == 0:
            notes.append("no matched pairs with a known value")
        if spec.hypothesis == "H2" and reward_check is not None and reward_check.get("verdict") == "hackable":
            entry["refuted_by"] = "reward-check found R2's process reward hackable"
        entries.append(entry)
    return with_holm(entries, cfg.decision)


#: The controls and what each must show: (name, baseline, candidate, expectation).
CONTROLS = (("aa", "B1", "AA", "includes 0"), ("placebo", "B1", "PLACEBO", "includes 0"),
            ("mask_ablation", "R1", "MASK", "reported"))


def controls(data: Any, runs: Runs, cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """Each control that ran: its paired difference in success on the first evaluation split (pooled over seeds,
    clustered by task) and whether it shows what it must (A/A and placebo: an interval that includes 0)."""
    out: list[dict[str, Any]] = []
    split = cfg.primary_split
    for name, base, cand, expect in CONTROLS:
        run_pairs = [(runs.eval[(seed, base, split)], runs.eval[(seed, cand, split)]) for seed in range(cfg.seeds)
                     if (seed, base, split) in runs.eval and (seed, cand, split) in runs.eval]
        if not run_pairs:
            continue
        stats = pooled_pairs(data, run_pairs, "success", cfg.decision)
        passes = None
        if expect == "includes 0":
            passes = bool(stats["ci_low"] <= 0 <= stats["ci_high"]) if math.isfinite(stats["ci_low"]) else None
        out.append({"control": name, "baseline": base, "candidate": cand, "split": split, "expect": expect,
                    "passes": passes, **stats})
    return out


def check_process_reward(lake: Path, runs: Runs, cfg: ExperimentConfig) -> dict[str, Any] | None:
    """``reward-check`` of R2's process reward on R2's last training rollout (None without R2)."""
    from trajlake.evaluators.reward_check import check_reward

    r2 = [r for (_, arm), t in sorted(runs.train.items()) if arm == "R2" for r in t.get("runs", []) if "-it" in r]
    if not r2:
        return None
    report = check_reward(lake, r2[-1], f"trajlake.evaluators.process_rewards:{cfg.r2.process_reward}")
    return {"run": r2[-1], "reward": cfg.r2.process_reward, "verdict": report.get("verdict"),
            "hackable": report.get("verdict") == "hackable"}


def curves(con: Any, runs: Runs) -> dict[str, list[tuple[int, float]]]:
    """Success of each RL arm's training rollouts per iteration, per seed (``R1 s0``: [(1, 0.25), ...])."""
    out: dict[str, list[tuple[int, float]]] = {}
    for (seed, arm), t in sorted(runs.train.items()):
        its = [r for r in t.get("runs", []) if "-it" in r]
        if not its:
            continue
        rows = con.execute("select run_id, avg(coalesce(success, false)::double) from episodes where run_id in "
                           "(select unnest(?::varchar[])) group by 1", [its]).fetchall()
        out[f"{arm} s{seed}"] = sorted((int(r.rsplit("-it", 1)[1]), float(v)) for r, v in rows)
    return out


# -- the bundle -------------------------------------------------------------------------------------------------
def write_bundle(folder: Path, cfg: ExperimentConfig, state: State, *, command: str | None, log: Log) -> dict[str, Any]:
    """Write every file of the bundle into ``folder``; returns the summary."""
    from trajlake.evaluators.data import load
    from trajlake.query import connect

    lake = folder / "lake"
    runs = Runs.of(cfg, state)
    eval_runs = sorted(set(runs.eval.values()) | set(runs.fault.values()))
    if not eval_runs:
        raise TrajlakeError(f"{folder}: no evaluation run has finished yet; nothing to report")
    log("report: reading the lake")
    data = load(lake, eval_runs)
    try:
        table = matrix(data, runs, cfg)
        check = check_process_reward(lake, runs, cfg) if "R2" in cfg.all_arms() else None
        entries = hypotheses(data, runs, cfg, check)
        control_entries = controls(data, runs, cfg)
        lake_versions = dict(sorted(data.lake_versions.items()))
        as_of = data.as_of
    finally:
        data.close()
    con = connect(lake)
    learning = curves(con, runs)
    unrun = unrun_items(cfg, runs, entries)
    trajectories = export_trajectories(folder, lake, cfg, log) if cfg.trajectories else None
    if trajectories is None:
        unrun.append("trajectories: none exported (trajectories = 0 in the config)")
    elif trajectories["episodes"] < cfg.trajectories:
        unrun.append(f"trajectories: only {trajectories['episodes']} episode(s) off the hidden split, fewer than the "
                     f"{cfg.trajectories} asked for")
    contamination = contamination_scan(folder, lake, runs, cfg)
    browser = failure_browser(folder, lake, sorted(runs.eval.values()))
    config_path = folder / CONFIG_COPY
    summary: dict[str, Any] = {
        "experiment": cfg.name, "config": config_dict(cfg),
        "commands": {"run": command or f"trajlake experiment run --config {config_path} --out {folder}",
                     "report": f"trajlake experiment report {folder}",
                     "eval": f"trajlake eval --lake {lake} --as-of {as_of} " + " ".join(f"--run {r}" for r in eval_runs)},
        "lake": str(lake), "lake_versions": lake_versions, "as_of": as_of,
        "matrix": table, "hypotheses": entries, "verdicts": summarise(entries), "controls": control_entries,
        "controls_pass": (all(c["passes"] for c in control_entries if c["passes"] is not None)
                          if any(c["passes"] is not None for c in control_entries) else None),
        "reward_check": check, "learning_curves": {k: [list(p) for p in v] for k, v in learning.items()},
        "training": {f"s{s}/{a}": {k: t.get(k) for k in ("policy_version", "checkpoint", "tokens", "steps",
                                                         "train_run", "seconds", "matched_tokens", "budget",
                                                         "restarts", "model_seed",
                                                         "rl_tasks_check")}
                     for (s, a), t in sorted(runs.train.items())},
        "b2_budgets": {k: v.get("budget") for k, v in state.stages.items() if v.get("budget")},
        "abandoned_attempts": state.abandoned, "unrun": unrun,
        "trajectories": trajectories, "contamination": contamination.get("summary"),
        "browser": browser, "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    summary = _clean(summary)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    md = report_markdown(summary, cfg, learning, folder)
    (folder / "report.md").write_text(md, encoding="utf-8")
    (folder / "report.html").write_text(report_html(summary, folder), encoding="utf-8")
    (folder / "model_card.md").write_text(model_card(summary, cfg, lake), encoding="utf-8")
    (folder / "unrun.md").write_text("# Not run\n\n" + ("".join(f"- {u}\n" for u in unrun) or "Everything planned "
                                                         "ran.\n"), encoding="utf-8")
    log(f"report: {folder / 'report.md'} (verdicts: "
        + ", ".join(f"{h} {v}" for h, v in summary["verdicts"].items()) + ")")
    return summary


def unrun_items(cfg: ExperimentConfig, runs: Runs, entries: Sequence[dict[str, Any]]) -> list[str]:
    """Everything planned that did not run, and what this machine could not run."""
    import torch

    out = [f"stage {k}: planned, not finished" for k in runs.unfinished]
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        out.append(f"GPU stages not run: device {cfg.device} asked for, no CUDA device here")
    elif not torch.cuda.is_available():
        out.append("GPU runs (configs/experiment-mini-swe.toml, configs/experiment-mini-web.toml with a pretrained "
                   "model) not run here: no GPU on this machine")
    for e in entries:
        if e["n_pairs"] == 0:
            out.append(f"hypothesis {e['id']}: no matched pairs ({'; '.join(e['notes']) or 'arms not run'})")
    missing = [h for h in ("H1", "H2", "H3", "H4") if h not in {e["hypothesis"] for e in entries}]
    for h in missing:
        out.append(f"hypothesis {h}: not stated in the config")
    return out


def export_trajectories(folder: Path, lake: Path, cfg: ExperimentConfig, log: Log) -> dict[str, Any]:
    """Every episode of the lake off the hidden split (B1's data, the RL arms' rollouts, evaluation on other
    splits; ``export hf`` leaves the hidden split out) exported to ``trajectories/``, then every exported episode
    replayed against the environment. ``cfg.trajectories`` is the least the bundle must hold."""
    from trajlake.io.hf import export_hf
    from trajlake.rollout.replay import bundle_env_kwargs, bundle_episodes, replay_rows

    out = folder / "trajectories"
    if out.exists():
        shutil.rmtree(out)
    export_hf(lake, out, contamination=False)
    outcomes = list(replay_rows(bundle_episodes(out), bundle_env_kwargs(out)))
    matched = sum(1 for o in outcomes if o.ok)
    log(f"report: exported {len(outcomes)} episode(s); replayed: {matched} matched, {len(outcomes) - matched} "
        f"drifted")
    return {"episodes": len(outcomes), "replayed": len(outcomes), "matched": matched,
            "drifted": [o.episode_id for o in outcomes if not o.ok][:20], "least": cfg.trajectories,
            "command": f"trajlake replay --from {out}"}


def contamination_scan(folder: Path, lake: Path, runs: Runs, cfg: ExperimentConfig) -> dict[str, Any]:
    """``trajlake contamination`` of every training run against the evaluation splits, into contamination.json."""
    from trajlake.evaluators.contamination import scan, summary_lines

    train_runs = sorted({r for t in runs.train.values() for r in t.get("runs", [])
                         if r.endswith("-data") or "-it" in r})
    if not train_runs:
        report: dict[str, Any] = {"note": "no training runs"}
    else:
        report = scan(lake, eval_split=list(cfg.eval_splits), train_runs=train_runs)
        report["summary"] = summary_lines(report)
    (folder / "contamination.json").write_text(json.dumps(_clean(report), indent=1, default=str) + "\n",
                                               encoding="utf-8")
    return report


def failure_browser(folder: Path, lake: Path, eval_runs: list[str]) -> dict[str, Any]:
    from trajlake.evaluators.browse import build_browser

    out = folder / "browser.html"
    summary = build_browser(lake, out, runs=eval_runs)
    return {"file": out.name, "failing": summary.n_failing, "shown": summary.n_shown}


# -- documents --------------------------------------------------------------------------------------------------
def _fmt(x: Any, digits: int = 3) -> str:
    v = _f(x)
    return "n/a" if not math.isfinite(v) else f"{v:.{digits}f}"


def _ci(d: dict[str, Any]) -> str:
    return f"{_fmt(d.get('estimate'))} [{_fmt(d.get('ci_low'))}, {_fmt(d.get('ci_high'))}]"


def report_markdown(summary: dict[str, Any], cfg: ExperimentConfig, learning: dict[str, list[tuple[int, float]]],
                    folder: Path) -> str:
    from trajlake.evaluators.svg import PALETTE, Interval, lines, pareto

    md = [f"# Experiment {cfg.name}", "", f"Reproduce: `{summary['commands']['run']}`; this report: "
          f"`{summary['commands']['report']}`.", "",
          f"Lake versions read: `{summary['as_of']}`.", "", "## Hypotheses (preregistered in the config)", ""]
    for h, v in summary["verdicts"].items():
        md.append(f"- **{h}: {v}**")
    md += ["", "| id | claim | estimate (candidate - baseline) | interval | p (Holm) | MDD | pairs (tasks) | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for e in summary["hypotheses"]:
        md.append(f"| {e['id']} | {e['claim']} ({e['metric']}: {e['candidate']} vs {e['baseline']}) | "
                  f"{_fmt(e['estimate'])} | [{_fmt(e['ci_low'])}, {_fmt(e['ci_high'])}] | {_fmt(e['p_holm'])} | "
                  f"{_fmt(e['mdd'])} | {e['n_pairs']} ({e['n_tasks']}) | {e['verdict']}"
                  + (f" ({e['refuted_by']})" if e.get("refuted_by") else "") + " |")
    md += ["", "Rules:", ""] + [f"- {e['id']}: {e['rule']}" for e in summary["hypotheses"]]
    if summary.get("controls"):
        md += ["", "Controls (success on the first evaluation split; A/A and placebo must include 0):", "",
               "| control | candidate - baseline | estimate | interval | pairs (tasks) | shows what it must |",
               "|---|---|---|---|---|---|"]
        for c in summary["controls"]:
            shows = {True: "yes", False: "NO", None: "n/a"}[c["passes"]]
            md.append(f"| {c['control']} | {c['candidate']} - {c['baseline']} | {_fmt(c['estimate'])} | "
                      f"[{_fmt(c['ci_low'])}, {_fmt(c['ci_high'])}] | {c['n_pairs']} ({c['n_tasks']}) | "
                      f"{shows if c['expect'] != 'reported' else 'reported'} |")
    if summary.get("reward_check"):
        rc = summary["reward_check"]
        md += ["", f"reward-check of R2's process reward `{rc['reward']}` on {rc['run']}: {rc['verdict']}"]
    md += ["", "## The matrix, pooled over seeds (task-clustered 95% intervals)", "",
           "| arm | split | seeds | episodes | success | steps | cost USD |", "|---|---|---|---|---|---|---|"]
    for r in summary["matrix"]["pooled"]:
        md.append(f"| {r['arm']} | {r['split']} | {len(r['seeds'])} | {r['n_episodes']} | {_ci(r['success'])} | "
                  f"{_ci(r['steps'])} | {_ci(r['cost_usd'])} |")
    md += ["", "## Per seed", "", "| seed | arm | split | run | episodes | " + " | ".join(MATRIX_METRICS) + " |",
           "|---|---|---|---|---|" + "---|" * len(MATRIX_METRICS)]
    for r in summary["matrix"]["per_seed"]:
        md.append(f"| {r['seed']} | {r['arm']} | {r['split']} | {r['run']} | {r['n_episodes']} | "
                  + " | ".join(_fmt(r[m]) for m in MATRIX_METRICS) + " |")
    points = [(Interval(r["arm"], _f(r["cost_usd"]["estimate"]), _f(r["cost_usd"]["ci_low"]),
                        _f(r["cost_usd"]["ci_high"]), PALETTE[i % len(PALETTE)]),
               Interval(r["arm"], _f(r["success"]["estimate"]), _f(r["success"]["ci_low"]),
                        _f(r["success"]["ci_high"]), PALETTE[i % len(PALETTE)]))
              for i, r in enumerate(x for x in summary["matrix"]["pooled"] if x["split"] == cfg.primary_split)]
    points = [p for p in points if math.isfinite(p[0].estimate) and math.isfinite(p[1].estimate)]
    if points:
        (folder / "pareto.svg").write_text(pareto(points, x_label="cost per episode (USD)", y_label="success",
                                                  title=f"Success vs cost on {cfg.primary_split} (pooled)"),
                                           encoding="utf-8")
        md += ["", "## Success-cost Pareto", "", "![success vs cost](pareto.svg)"]
    else:
        md += ["", "## Success-cost Pareto", "", "No arm recorded costs: set price_in/price_out in policy_args."]
    if learning:
        series = [(label, [(float(x), y) for x, y in pts], PALETTE[i % len(PALETTE)])
                  for i, (label, pts) in enumerate(learning.items())]
        (folder / "curves.svg").write_text(lines(series, x_label="iteration", y_label="training-rollout success",
                                                 title="RL arms: success of their own rollouts per iteration",
                                                 y_range=(0.0, 1.0)), encoding="utf-8")
        md += ["", "## Learning curves", "", "![learning curves](curves.svg)"]
    tr = summary.get("trajectories")
    if tr:
        md += ["", "## Trajectories", "", f"{tr['episodes']} episode(s) (every one off the hidden split) in "
               f"`trajectories/`; replayed: {tr['matched']} matched of {tr['replayed']} (`{tr['command']}`)."]
    md += ["", "## Also in this folder", "", "summary.json, report.html, model_card.md, contamination.json, unrun.md, "
           "browser.html (failing episodes of every evaluation run).", ""]
    if summary["unrun"]:
        md += ["## Not run", ""] + [f"- {u}" for u in summary["unrun"]] + [""]
    return "\n".join(md)


def report_html(summary: dict[str, Any], folder: Path) -> str:
    """report.md's content as one HTML page (tables, the SVG charts inline)."""
    body: list[str] = []
    in_table = False
    for line in (folder / "report.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= {"-"}:
                continue
            if not in_table:
                body.append("<table>")
                in_table = True
            body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("!["):
            name = line[line.index("(") + 1:line.rindex(")")]
            svg_path = folder / name
            if svg_path.is_file():
                body.append(svg_path.read_text(encoding="utf-8"))
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            body.append(f"<li>{html.escape(line[2:])}</li>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        body.append("</table>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "td{border:1px solid #ccc;padding:2px 6px;font-size:13px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(summary['experiment'])}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def model_card(summary: dict[str, Any], cfg: ExperimentConfig, lake: Path) -> str:
    """What the policy is, its data and lake versions, evaluation with intervals, safety, and its boundary."""
    pooled = {(r["arm"], r["split"]): r for r in summary["matrix"]["pooled"]}
    best = [a for a in ("R3", "R2", "R1", "B1") if (a, cfg.primary_split) in pooled]
    lines = [f"# Model card: experiment {cfg.name}", "",
             "## What the policy is", "",
             f"Arms B0-R3 of a {'tiny randomly initialised' if cfg.model.build_tiny else 'pretrained'} "
             f"Llama-style model (trajlake.policies.tiny) on the `{cfg.env}` environment, one checkpoint per arm "
             f"and training seed (seeds 0..{cfg.seeds - 1}); policy versions in the lake's `policy_versions` table "
             f"and in summary.json's `training`. Not a general-purpose model: it was trained only on this "
             f"environment's train split.", "",
             "## Data and lake versions", "",
             f"Lake: `{lake}` read at `{summary['as_of']}`. B1's data: the environment's `{cfg.b1.data_policy}` policy on {cfg.b1.tasks} "
             f"train tasks; the RL arms play {cfg.rl.tasks} other train tasks ({cfg.rl.attempts} attempts each, "
             f"{cfg.rl.iterations} iterations). Contamination scan of the training runs against "
             f"{', '.join(cfg.eval_splits)}: contamination.json.", "",
             "## Evaluation (pooled over seeds, task-clustered 95% intervals)", ""]
    for (arm, split), r in sorted(pooled.items()):
        lines.append(f"- {arm} on {split}: success {_ci(r['success'])} over {r['n_episodes']} episodes")
    lines += ["", "## Safety", "",
              "Evaluated by `trajlake eval`'s safety metrics on the same runs (gateway denials, executed violations, "
              "attack success where an injection suite was played). This experiment played no injection suite: "
              "attack success and utility under attack were NOT measured for these checkpoints "
              "(`trajlake rollout --env-arg injection=...` does). Isolation: the environment's own sandbox "
              "(tool-lookup has no side effects outside its directory; Mini SWE grades under bubblewrap where "
              "present).", "",
              "## Boundary: what was not tested", ""]
    lines += [f"- {u}" for u in summary["unrun"]]
    lines += ["- prompt injection, privilege escalation and repeated side effects on these checkpoints",
              "- any environment but " + cfg.env, "- any language but the environment's English statements",
              f"- the best arm here ({best[0] if best else 'none'}) is compared only with the other arms of this "
              "matrix; no claim is made beyond it", ""]
    return "\n".join(lines)


def report_experiment(folder: str | Path, *, log: Log) -> dict[str, Any]:
    """``trajlake experiment report DIR``: the bundle again from the folder's config copy, state and lake."""
    path = Path(folder).resolve()
    config = path / CONFIG_COPY
    if not config.is_file():
        raise TrajlakeError(f"{path}: not an experiment folder (no {CONFIG_COPY}); run `trajlake experiment run` "
                            f"first")
    cfg = load_experiment(config)
    return write_bundle(path, cfg, State.load(path), command=None, log=log)


__all__ = ["Runs", "report_experiment", "write_bundle"]
