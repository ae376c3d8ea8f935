"""The lag sensitivity experiment (issue 29): how the trainer's off-policy diagnostics and returns change when the
learner trains on data k policy versions old, k in 0, 1, 2, 4, on ``tool-lookup``.

    OMP_NUM_THREADS=1 nice python bench/experiment_lag.py --out bench/out/lag [--lags 0,1,2,4] [--seed 0]

One B1 (supervised on the oracle's episodes, from the tiny model) is shared; then per lag k an R1 from B1's
checkpoint with the deterministic staleness mode (``fixed_staleness = k``, ``max_staleness = k``): iteration i plays
its rollout with the version of k updates before (the stage's first while fewer exist) and trains on it only, so
from iteration k + 1 on every trained episode is exactly k versions old, the same on any machine. Every arm's
first rollout is the same one (same version label, run id and sampling seeds: common random numbers); from there
the arms differ only by the lag. The return is the task's success plus tool-lookup's process reward
``lookup_progress`` credited per turn (B1 this short rarely solves a task; the process reward gives RLOO a signal
to move on).

Writes ``DIR/summary.json`` (settings, per lag the steady-state ratio diagnostics from the train log and the
training rollouts' returns with a 95% interval over groups) and prints the table docs/training.md reports. Each
arm trains into its own lake under ``DIR``; an arm whose lake already holds its R1 is read, not trained again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from experiment_positive_control import interleaved_train_tasks, split_train_families  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Setup:
    """The experiment's settings (recorded in summary.json). Sized for 2 shared CPU cores."""

    env: str = "tool-lookup"
    hidden_size: int = 64
    layers: int = 2
    heads: int = 8
    kv_heads: int = 8
    max_positions: int = 1024
    vocab_size: int = 1024
    corpus_tasks: int = 300
    sft_tasks: int = 300
    sft_steps: int = 300
    sft_batch: int = 16
    sft_lr: float = 1e-2
    rl_tasks: int = 8
    """R1 plays this many tasks of the train phrasings B1 never saw (``rl_phrasings``) each iteration."""
    rl_phrasings: int = 4
    attempts: int = 4
    iterations: int = 8
    """Eight: the lag-4 arm has four iterations at exactly lag 4 (iterations 5-8)."""
    steps: int = 4
    batch: int = 32
    """A batch holds the whole rollout (8 tasks x 4 attempts): every step sees every episode."""
    rl_lr: float = 1e-3
    max_new_tokens: int = 24
    process_weight: float = 1.0
    temperature: float = 1.0


def _config(setup: Setup, seed: int, out: Path, model: Path, stages: list[dict[str, Any]]) -> dict[str, Any]:
    # one experiment name for every arm (each in its own lake): iteration 1 plays the same version label and run
    # id, hence the same sampling seeds, in every arm
    return {"name": "lag", "env": setup.env, "seed": seed, "device": "cpu", "temperature": setup.temperature,
            "max_length": setup.max_positions, "out_dir": str(out), "model": {"path": str(model)},
            "task_reward": "success", "stages": stages}


def _policy_args(setup: Setup, seed: int) -> dict[str, str]:
    # the training seed is also the base sampling seed (0 is the policy's default: seed 0's runs are unchanged)
    return {"max_new_tokens": str(setup.max_new_tokens), "threads": "1", "seed": str(seed)}


def _train(config: dict[str, Any], lake: Path, source: str, log: Any) -> float:
    from trajlake.train.config import parse_config
    from trajlake.train.loop import train

    t0 = time.monotonic()
    train(parse_config(config, source), lake, log=log)
    return time.monotonic() - t0


def _has_run(lake: Path, run_id: str) -> bool:
    from trajlake.errors import LakeNotFoundError
    from trajlake.query import connect

    try:
        return connect(lake).execute("select count(*) from runs where run_id = ?", [run_id]).fetchone()[0] > 0
    except LakeNotFoundError:
        return False


def b1(setup: Setup, seed: int, out: Path, log: Any) -> tuple[Path, float | None]:
    """The shared B1 checkpoint (trained once)."""
    from trajlake.policies.tiny import build_tiny_model

    lake, ckpt = out / "b1-lake", out / "ckpt" / "b1"
    if _has_run(lake, "B1.train"):
        return ckpt / "B1", None
    base = out / "base"
    if not (base / "config.json").is_file():
        build_tiny_model(base, vocab_size=setup.vocab_size, hidden_size=setup.hidden_size, layers=setup.layers,
                         heads=setup.heads, kv_heads=setup.kv_heads, max_positions=setup.max_positions, seed=seed,
                         env=setup.env, corpus_tasks=setup.corpus_tasks)
    b1_families, _ = split_train_families(setup.env, setup.rl_phrasings)
    tasks = interleaved_train_tasks(setup.env, b1_families)[:setup.sft_tasks]
    stage = {"name": "B1", "kind": "sft", "data_policy": "oracle", "steps": setup.sft_steps,
             "batch_size": setup.sft_batch, "lr": setup.sft_lr, "warmup_steps": 10, "lr_schedule": "cosine",
             "min_lr_ratio": 0.1, "data": {"split": "train", "seeds": "0", "tasks": tasks}}
    seconds = _train(_config(setup, seed, ckpt, base, [stage]), lake, "lag/b1", log)
    return ckpt / "B1", seconds


def r1(setup: Setup, seed: int, out: Path, model: Path, lag: int, log: Any) -> float | None:
    lake = out / f"lag{lag}-lake"
    if _has_run(lake, "R1.train"):
        return None
    _, rl_families = split_train_families(setup.env, setup.rl_phrasings)
    tasks = interleaved_train_tasks(setup.env, rl_families)[:setup.rl_tasks]
    stage = {"name": "R1", "kind": "rl", "algo": "rloo", "iterations": setup.iterations, "steps": setup.steps,
             "batch_size": setup.batch, "lr": setup.rl_lr, "max_staleness": lag, "fixed_staleness": lag,
             "process_reward": "lookup_progress", "process_weight": setup.process_weight,
             "rollout": {"split": "train", "seeds": "0", "attempts": setup.attempts, "tasks": tasks,
                         "policy_args": _policy_args(setup, seed)}}
    return _train(_config(setup, seed, out / "ckpt" / f"lag{lag}", model, [stage]), lake, f"lag/lag{lag}", log)


#: Ratio diagnostics of the train log summarised per arm (mean over the steady-state steps; ``ratio_max``: max).
DIAGNOSTICS = ("staleness_mean", "policy_lag_mean", "ratio_mean", "ratio_max", "log_ratio_var", "ess_frac",
               "frac_truncated", "clip_frac", "is_weight_mean", "kl")


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def diagnostics(log_path: Path, lag: int, first_iteration: int) -> dict[str, Any]:
    """Per arm: the steady-state rows (iteration >= ``first_iteration``, every one at staleness exactly ``lag``
    once past lag's warm-up), all steps and the first step of each iteration separately (step 0: the lag alone,
    before this iteration's own updates move the learner)."""
    import pyarrow.parquet as pq

    rows = [r for r in pq.read_table(log_path).to_pylist() if r["stage"] == "R1" and r["iteration"] >= first_iteration]
    out: dict[str, Any] = {"steps": len(rows)}
    for which, sel in (("all_steps", rows), ("step0", [r for r in rows if r["step"] == 0])):
        summary = {k: (max((r[k] for r in sel if r.get(k) is not None), default=None) if k == "ratio_max"
                       else _mean([r.get(k) for r in sel])) for k in DIAGNOSTICS}
        out[which] = summary
    out["staleness_values"] = sorted({r["staleness_max"] for r in rows})
    return out


def returns(lake: Path, setup: Setup, first_iteration: int) -> dict[str, Any]:
    """The training rollouts' returns (success + lookup_progress, as the trainer computed them) of iterations >=
    ``first_iteration``: mean, and a 95% interval over RLOO groups (group means; normal approximation)."""
    from trajlake.train.config import StageConfig, TrainConfig
    from trajlake.train.data import Selection, select_episodes
    from trajlake.train.loop import _episode_credit

    runs = [f"R1-it{i}" for i in range(first_iteration, setup.iterations + 1)]
    episodes = select_episodes(lake, Selection(runs=runs))
    cfg = TrainConfig(name="lag", env=setup.env, task_reward="success")
    stage = StageConfig(name="R1", kind="rl", process_reward="lookup_progress", process_weight=setup.process_weight)
    g = _episode_credit(cfg, stage, str(lake), episodes).returns()
    groups: dict[tuple[str, str], list[float]] = {}
    for e, run, group in zip(episodes["episode_id"].to_pylist(), episodes["run_id"].to_pylist(),
                             episodes["group_id"].to_pylist(), strict=True):
        groups.setdefault((run, group), []).append(g[e])
    means = [sum(v) / len(v) for v in groups.values()]
    m = statistics.fmean(means)
    half = 1.96 * statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else float("nan")
    success = episodes["success"].to_pylist()
    return {"episodes": episodes.num_rows, "groups": len(means), "return_mean": m, "return_ci95": [m - half, m + half],
            "success_rate": sum(bool(s) for s in success) / max(1, len(success))}


def table(results: dict[str, Any]) -> str:
    """The markdown table of docs/training.md, "Lag sensitivity"."""
    a, b = results["steady_iterations"]
    head = ("| lag k | staleness (steady) | recorded policy_lag | ratio_mean | ratio_max | log_ratio_var | ESS frac | "
            f"frac truncated | clip frac | w mean | KL | step-0 log_ratio_var | step-0 ESS | return it {a}-{b} "
            f"[95% CI] | success it {a}-{b} |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def f(x: Any, digits: int = 3) -> str:
        return "-" if x is None else (f"{x:.{digits}g}" if isinstance(x, float) else str(x))

    for lag, r in sorted(results["arms"].items(), key=lambda kv: int(kv[0])):
        a, s0, ret = r["diagnostics"]["all_steps"], r["diagnostics"]["step0"], r["returns"]
        lo, hi = ret["return_ci95"]
        lines.append(f"| {lag} | {r['diagnostics']['staleness_values']} | {f(a['policy_lag_mean'])} | "
                     f"{f(a['ratio_mean'])} | {f(a['ratio_max'])} | {f(a['log_ratio_var'])} | {f(a['ess_frac'])} | "
                     f"{f(a['frac_truncated'])} | {f(a['clip_frac'])} | {f(a['is_weight_mean'])} | {f(a['kl'])} | "
                     f"{f(s0['log_ratio_var'])} | {f(s0['ess_frac'])} | {ret['return_mean']:.3f} "
                     f"[{lo:.3f}, {hi:.3f}] | {ret['success_rate']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "lag")
    ap.add_argument("--lags", default="0,1,2,4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a Setup field (e.g. --set iterations=6)")
    args = ap.parse_args(argv)
    fields = {f.name: f.type for f in dataclasses.fields(Setup)}
    over: dict[str, Any] = {}
    for kv in args.set:
        key, _, value = kv.partition("=")
        if key not in fields:
            ap.error(f"--set {kv}: no Setup field {key!r}")
        over[key] = float(value) if fields[key] in (float, "float") else int(value) if fields[key] in (int, "int") \
            else value
    setup = dataclasses.replace(Setup(), **over)
    lags = [int(x) for x in args.lags.split(",")]
    if max(lags) >= setup.iterations:
        ap.error(f"lag {max(lags)} needs iterations > it ({setup.iterations})")
    out: Path = args.out.resolve()  # the trainer resolves relative paths against the config source
    out.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(line, flush=True)

    t0 = time.monotonic()
    model, b1_seconds = b1(setup, args.seed, out, log)
    timings: dict[str, float | None] = {"b1": b1_seconds}
    # the common steady-state window: every arm's iterations past the largest lag's warm-up
    first = max(lags) + 1
    results: dict[str, Any] = {"setup": dataclasses.asdict(setup), "seed": args.seed, "lags": lags,
                               "steady_iterations": [first, setup.iterations], "arms": {}}
    for lag in lags:
        timings[f"lag{lag}"] = r1(setup, args.seed, out, model, lag, log)
        lake = out / f"lag{lag}-lake"
        results["arms"][str(lag)] = {"diagnostics": diagnostics(out / "ckpt" / f"lag{lag}" / "train_log.parquet",
                                                                lag, first),
                                     "returns": returns(lake, setup, first)}
    results["timings_s"] = timings
    results["wall_s"] = time.monotonic() - t0
    results["command"] = " ".join(["python", "bench/experiment_lag.py", *(argv if argv is not None else sys.argv[1:])])
    (out / "summary.json").write_text(json.dumps(results, indent=1, default=str))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
