"""The B1 -> R1 experiment on Mini SWE, reproducible end to end (issue 12, "Evidence").

    python bench/experiment_b1_r1.py [--config configs/mini-swe-b1-r1.toml] [--out bench/out/experiment_b1_r1]

Trains B1 (supervised on the oracle's train-split trajectories) and R1 (RLOO on the model's own rollouts) with
``trajlake train`` into a fresh lake, then writes ``trajlake eval --baseline B1 --candidate R1`` over their
hidden-split evaluation runs (several environment seeds) as Markdown and JSON, and prints the headline numbers
and the training log's summary. Everything is seeded; a rerun on the same machine plays the same episodes.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--config", default=str(ROOT / "configs" / "mini-swe-b1-r1.toml"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "experiment_b1_r1"))
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
    report = json.loads((out / "report.json").read_text())
    print(f"\ntrained B1 and R1 in {trained / 60:.1f} min; report: {out / 'report.md'}")
    for run in ("B1", "R1"):
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
