"""The positive control's arms on held-out instances of the train phrasings (issue 24, section 3).

    python bench/positive_control_heldout.py --out bench/out/positive_control [--seed 0] [--tasks 200] [--pool rl]

``bench/experiment_positive_control.py`` evaluates every arm on the hidden split, whose phrasings no arm saw. This
evaluates the final checkpoint of each arm it finds (B1, R1, placebo, mask, matched) on tasks of B1's train
families after B1's ``sft_tasks``: the phrasings B1 was trained on, values no arm saw (the RL arms play other
phrasings). ``--pool rl`` evaluates on R1's train families instead, on the tasks after the ``rl_tasks`` R1 and the
placebo played: the phrasings R1 was rewarded on (and B1 never saw), values no arm saw. Same sampling settings and
common sampling seeds as the experiment's evaluation, one run per arm (``heldout-<arm>``, ``heldout-rl-<arm>``)
in the seed's lake, and the paired, task-clustered comparison of each arm with B1 (and of R1 with the placebo)
printed as JSON and written to ``DIR/heldout-seed<S>.json`` (``heldout-rl-seed<S>.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiment_positive_control import (
    Setup,
    compare_success,
    has_run,
    play_checkpoint,
    task_pools,
)

#: arm -> its final checkpoint folder under ``seed<S>/ckpt`` (the RL arms' last version is ``R1``)
CHECKPOINTS = {"B1": "b1/B1", "R1": "r1/R1", "placebo": "placebo/R1", "mask": "mask/R1", "matched": "matched/B1M"}
COMPARE = (("B1", "R1"), ("B1", "placebo"), ("placebo", "R1"), ("B1", "mask"), ("B1", "matched"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", required=True, help="the experiment's --out folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", type=int, default=200, help="held-out train tasks to evaluate on")
    ap.add_argument("--pool", choices=("b1", "rl"), default="b1",
                    help="b1: B1's phrasings after its data; rl: R1's phrasings after the tasks R1 played")
    args = ap.parse_args(argv)

    from trajlake.evaluators.report import build_report

    setup = Setup()
    folder = Path(args.out).resolve() / f"seed{args.seed}"
    lake = folder / "lake"
    b1_pool, rl_pool = task_pools(setup)
    if args.pool == "b1":  # B1's phrasings with values no arm trained on: the tasks after B1's data in B1's order
        pool, start, name, prefix = b1_pool, setup.sft_tasks, "B1's", "heldout"
    else:  # R1's phrasings with values no arm trained on: the tasks after those R1 and the placebo played
        pool, start, name, prefix = rl_pool, setup.rl_tasks, "R1's", "heldout-rl"
    tasks = tuple(pool[start:start + args.tasks])
    if len(tasks) < args.tasks:
        raise SystemExit(f"--tasks {args.tasks}: only {len(tasks)} of {name} train tasks after the first {start}")
    arms = [a for a, rel in CHECKPOINTS.items() if (folder / "ckpt" / rel / "config.json").is_file()]
    for arm in arms:
        if not has_run(lake, f"{prefix}-{arm}"):
            play_checkpoint(setup, lake, f"{prefix}-{arm}", folder / "ckpt" / CHECKPOINTS[arm], split="train",
                            task_ids=tasks, policy_version=f"pc{args.seed}-{arm}-final", policy_name=f"pc{args.seed}",
                            label=f"{prefix}-{arm}")
    report = build_report(lake, runs=[f"{prefix}-{a}" for a in arms])
    out: dict[str, object] = {"tasks": f"{name} train families [{start}:{start + len(tasks)}]", "n_tasks": len(tasks),
                              "success": {a: report["runs"][f"{prefix}-{a}"]["metrics"]["success"]["estimate"]
                                          for a in arms}}
    for base, cand in COMPARE:
        if base in arms and cand in arms:
            out[f"{cand}_minus_{base}"] = compare_success(lake, f"{prefix}-{base}", f"{prefix}-{cand}")
    (folder.parent / f"{prefix}-seed{args.seed}.json").write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
