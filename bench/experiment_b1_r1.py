"""The B1 -> R1 experiment on Mini SWE, reproducible end to end (issue 12, "Evidence").

    python bench/experiment_b1_r1.py [--config configs/mini-swe-b1-r1.toml] [--out bench/out/experiment_b1_r1]

Trains B1 (supervised on the oracle's train-split trajectories) and R1 (RLOO on the model's own rollouts) with
``trajlake train`` into a fresh lake, then writes ``trajlake eval --baseline B1 --candidate R1`` over their
hidden-split evaluation runs (several environment seeds) as Markdown and JSON. It then plays both checkpoints
again, exactly as their evaluation runs did (policy, settings, sampling-seed rule), on the train tasks R1 was
rewarded on (``--train-seeds`` environment seeds): runs ``B1-train`` and ``R1-train``, compared in
``report-train.md``/``.json`` (R1's own tasks: where RL can show an effect that does not need transfer). Prints
the headline numbers and the training log's summary. Everything is seeded, but B1's sample order follows the
order in which the lake's files return the data rollout's episodes, which depends on when its commits fell: two
runs of the same config gave B1 losses 6.221 -> 1.131 and 6.229 -> 1.344 (docs/training.md, "Mini SWE, second
design").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADLINE = ("success", "model_failure_rate", "error_rate_model_invalid_action", "steps", "tokens_out",
            "policy_lag_mean")


def _run(args: list[str]) -> None:
    print("$ " + " ".join(args), flush=True)
    subprocess.run(args, check=True)


def _play_on_train_tasks(lake: Path, config: Path, seeds: str) -> None:
    """B1's and R1's checkpoints on the tasks of R1's rollouts (train split), as their hidden-split evaluation runs
    played: the same policy, settings, cost model, versions and common sampling seeds, into runs ``B1-train`` and
    ``R1-train``."""
    import tomllib

    from trajlake.query import connect
    from trajlake.record.episode import CostModel
    from trajlake.rollout.runner import RolloutConfig, parse_seeds, run_rollout

    stages = {s["name"]: s for s in tomllib.loads(config.read_text())["stages"]}
    tasks = tuple(stages["R1"]["rollout"]["tasks"])
    con = connect(str(lake))
    for stage in ("B1", "R1"):
        ((text, name),) = con.execute("select config, policy_name from runs where run_id = ?", [stage]).fetchall()
        run = json.loads(text)
        rc = RolloutConfig(lake=str(lake), run_id=f"{stage}-train", env=run["env"], policy=run["policy"],
                           split="train", seeds=parse_seeds(seeds), policy_version=run["policy_version"],
                           policy_args=dict(run.get("policy_args", {})), env_kwargs=dict(run["env_kwargs"]),
                           cost_model=CostModel(**run["cost_model"]), task_ids=tasks,
                           policy_name=name, sampling_seed_rule=run.get("sampling_seed_rule"))
        t0 = time.monotonic()
        summary = run_rollout(rc)
        if summary.failed_items:
            raise SystemExit(f"{stage}-train: {summary.failed_items[0]}")
        print(f"{stage}-train: {summary.written} episode(s), {summary.successes} solved, "
              f"{time.monotonic() - t0:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--config", default=str(ROOT / "configs" / "mini-swe-b1-r1.toml"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "experiment_b1_r1"))
    ap.add_argument("--train-seeds", default="0-3", help="environment seeds of the train-task runs (default 0-3)")
    ap.add_argument("--keep", action="store_true", help="reuse an existing lake (resumes nothing: the trainer "
                    "refuses stages already trained)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    lake, ckpt = out / "lake", out / "checkpoints"
    if not args.keep and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cli = [sys.executable, "-m", "trajlake"]
    _run([*cli, "train", "--config", args.config, "--lake", str(lake), "--out-dir", str(ckpt)])
    trained = time.monotonic() - t0
    for fmt, name in (("markdown", "report.md"), ("json", "report.json")):
        _run([*cli, "eval", "--lake", str(lake), "--baseline", "B1", "--candidate", "R1", "--format", fmt,
              "--out", str(out / name)])
    _play_on_train_tasks(lake, Path(args.config), args.train_seeds)
    for fmt, name in (("markdown", "report-train.md"), ("json", "report-train.json")):
        _run([*cli, "eval", "--lake", str(lake), "--baseline", "B1-train", "--candidate", "R1-train", "--format",
              fmt, "--out", str(out / name)])
    print(f"\ntrained B1 and R1 in {trained / 60:.1f} min, all in {(time.monotonic() - t0) / 60:.1f} min; reports: "
          f"{out / 'report.md'} (hidden), {out / 'report-train.md'} (R1's train tasks)")
    for report_name, runs in (("report.json", ("B1", "R1")), ("report-train.json", ("B1-train", "R1-train"))):
        report = json.loads((out / report_name).read_text())
        for run in runs:
            metrics = report["runs"][run]["metrics"]
            cells = []
            for m in HEADLINE:
                if m in metrics:
                    est = metrics[m]["estimate"]
                    cells.append(f"{m}={'n/a' if est is None else f'{est:.3g}'} (n={metrics[m]['n']})")
            print(f"{run}: " + ", ".join(cells))
    import pyarrow.parquet as pq

    log = pq.read_table(ckpt / "train_log.parquet").to_pylist()
    b1 = [r["loss"] for r in log if r["stage"] == "B1"]
    print(f"B1 loss: first {b1[0]:.3f}, last {b1[-1]:.3f} over {len(b1)} steps")
    for r in (r for r in log if r["stage"] == "R1"):
        print(f"R1 it {r['iteration']} step {r['step']}: loss {r['loss']:.4f} kl {r['kl']:.4g} ratio mean "
              f"{r['ratio_mean']:.4g} staleness max {r['staleness_max']} reward mean {r['reward_mean']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
