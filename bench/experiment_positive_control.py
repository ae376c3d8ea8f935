"""The positive control (issue 24, section 3): does trajlake's trainer make an agent better, under controls?

    python bench/experiment_positive_control.py --seeds 3 --out bench/out/positive_control [--arms LIST]

On the ``tool-lookup`` environment (docs/tool_lookup.md: the agent must look values up through a tool and read
the observation to succeed), per training seed, every arm trained and evaluated with ``trajlake train`` into one
lake and compared with the paired, task-clustered ``trajlake eval`` on the hidden split, common sampling seeds:

- ``b1``: B1, supervised on the oracle's episodes of train tasks for a fixed number of steps (all train phrasings
  of every kind but the last ``rl_phrasings``);
- ``r1``: R1, RLOO on terminal reward from B1 (fresh sampling streams per iteration), playing tasks of the train
  phrasings B1 never saw;
- ``aa``: A/A, B1's checkpoint evaluated again with another sampling seed (the interval must include 0);
- ``placebo``: R1 with the returns shuffled within each group (the interval against B1 must include 0);
- ``matched``: matched compute, B1 trained on for as many policy tokens as R1's updates used;
- ``mask``: the mask ablation, R1 with its loss on the tool-observation tokens too (pitfall of 19.6).

The criterion, written before any run: on each seed, R1 - B1 > 0 with its 95% interval above 0, and the A/A and
placebo intervals include 0. ``DIR/summary.json`` (rewritten after every seed, so a stopped run keeps the seeds it
finished) holds per seed the hidden success of every arm, each paired difference with its interval and whether
B1 is in the design's band (``b1_in_band``); ``DIR/report.md`` the table, the criterion's verdict and the learning curves
(``DIR/curves-seed<S>.svg``: the success of each RL arm's training rollouts per iteration). A seed whose
evaluation runs are already in its lake is not trained again (a killed experiment resumes).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("b1", "r1", "aa", "placebo", "matched", "mask")
#: The arm's final evaluation run and what it is compared with: summary key -> (baseline run, candidate run).
COMPARISONS = {"r1_minus_b1": ("B1", "r1-R1"), "aa": ("B1", "B1-aa"), "placebo_minus_b1": ("B1", "placebo-R1"),
               "matched_minus_b1": ("B1", "matched-B1M"), "mask_ablation_minus_r1": ("r1-R1", "mask-R1")}
ARM_RUNS = {"b1": "B1", "r1": "r1-R1", "aa": "B1-aa", "placebo": "placebo-R1", "matched": "matched-B1M",
            "mask": "mask-R1"}
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

    @property
    def sft_final_lr(self) -> float:
        """The learning rate B1's schedule ends at (where the matched arm goes on)."""
        return self.sft_lr * (1.0 if self.sft_lr_schedule == "constant" else self.sft_min_lr_ratio)


def interleaved_train_tasks(env: str, families: Sequence[str] | None = None) -> list[str]:
    """The train split's task ids (of ``families`` only, when given), template families taken in turn (the first
    id of every family, then the second of every family, ...), so that every prefix -- B1's data, then held-out
    ones -- holds every family alike. (The split lists ids family by family.)"""
    from trajlake.envs import list_tasks

    by_family: dict[str, list[str]] = {}
    for t in list_tasks(env, "train"):
        family = t["task_id"].rsplit("/", 1)[0]
        if families is None or family.split("/", 1)[1] in families:
            by_family.setdefault(family, []).append(t["task_id"])
    rounds = max(len(ids) for ids in by_family.values())
    return [ids[i] for i in range(rounds) for _, ids in sorted(by_family.items()) if i < len(ids)]


def split_train_families(env: str, rl_phrasings: int) -> tuple[list[str], list[str]]:
    """The train template families (``kind/pN``) of B1's data and of R1's tasks: per kind, the last
    ``rl_phrasings`` train phrasings (highest N) go to R1, the others to B1."""
    from trajlake.envs import list_tasks

    by_kind: dict[str, set[int]] = {}
    for t in list_tasks(env, "train"):
        kind, phrasing = t["task_id"].rsplit("/", 1)[0].split("/", 1)[1].split("/p")
        by_kind.setdefault(kind, set()).add(int(phrasing))
    b1, rl = [], []
    for kind, phrasings in sorted(by_kind.items()):
        order = sorted(phrasings)
        if not 0 <= rl_phrasings < len(order):
            raise ValueError(f"rl_phrasings = {rl_phrasings}: kind {kind} has {len(order)} train phrasings")
        cut = len(order) - rl_phrasings
        b1 += [f"{kind}/p{i}" for i in order[:cut]]
        rl += [f"{kind}/p{i}" for i in order[cut:]]
    return b1, rl


def task_pools(setup: Setup) -> tuple[list[str], list[str]]:
    """B1's and R1's train tasks, each pool's families interleaved: B1's data is the first ``sft_tasks`` of the
    first, R1 plays the first ``rl_tasks`` of the second (the train phrasings B1 never saw)."""
    b1_families, rl_families = split_train_families(setup.env, setup.rl_phrasings)
    return interleaved_train_tasks(setup.env, b1_families), interleaved_train_tasks(setup.env, rl_families)


def _train_config(setup: Setup, seed: int, name: str, out: Path, model: Path, stages: list[dict[str, Any]],
                  run_prefix: str = "") -> dict[str, Any]:
    return {"name": name, "env": setup.env, "seed": seed, "device": "cpu", "temperature": setup.temperature,
            "max_length": setup.max_positions, "out_dir": str(out), "run_prefix": run_prefix,
            "model": {"path": str(model)}, "stages": stages}


def _policy_args(setup: Setup, seed: int | None = None) -> dict[str, str]:
    # one torch thread per rollout worker: the workers share the machine's cores
    args = {"max_new_tokens": str(setup.max_new_tokens), "threads": "1"}
    return {**args, "seed": str(setup.eval_sampling_seed if seed is None else seed)}


def _eval_spec(setup: Setup) -> dict[str, Any]:
    return {"split": setup.eval_split, "seeds": setup.eval_seeds, "workers": setup.workers,
            "policy_args": _policy_args(setup)}


def _rl_stage(setup: Setup, rl_tasks: Sequence[str], **control: bool) -> dict[str, Any]:
    if setup.rl_tasks > len(rl_tasks):
        raise ValueError(f"rl_tasks = {setup.rl_tasks}: R1's train families have only {len(rl_tasks)} tasks")
    return {"name": "R1", "kind": "rl", "algo": "rloo", "iterations": setup.rl_iterations, "steps": setup.rl_steps,
            "batch_size": setup.rl_batch, "lr": setup.rl_lr, "warmup_steps": setup.rl_warmup_steps,
            "max_staleness": setup.max_staleness, **control,
            "rollout": {"split": "train", "seeds": "0", "attempts": setup.attempts, "workers": setup.workers,
                        "tasks": list(rl_tasks[:setup.rl_tasks]),
                        "policy_args": {k: v for k, v in _policy_args(setup).items() if k != "seed"}},
            "eval": _eval_spec(setup)}


def play_checkpoint(setup: Setup, lake: Path, run_id: str, checkpoint: Path, *, split: str, policy_version: str,
                    policy_name: str, label: str, task_ids: Sequence[str] = (),
                    sampling_seed: int | None = None) -> None:
    """Evaluate a saved checkpoint outside the trainer (run ``run_id`` in ``lake``): the experiment's sampling
    settings, and common sampling seeds (``setup.eval_sampling_seed`` unless ``sampling_seed``)."""
    from trajlake.rollout.runner import RolloutConfig, parse_seeds, run_rollout
    from trajlake.train.loop import COMMON_SEEDS

    rule = COMMON_SEEDS if sampling_seed is None else COMMON_SEEDS.replace(
        "policy_args.seed", f"policy_args.seed = {sampling_seed}")
    summary = run_rollout(RolloutConfig(
        lake=str(lake), run_id=run_id, env=setup.env, policy=f"hf:{checkpoint}", split=split,
        task_ids=tuple(task_ids), seeds=parse_seeds(setup.eval_seeds),
        workers=setup.workers, policy_version=policy_version, policy_name=policy_name, label=label,
        commit_every_s=0.0, policy_args={"temperature": str(setup.temperature), **_policy_args(setup, sampling_seed)},
        sampling_seed_rule=rule))
    if summary.failed_items:
        raise RuntimeError(f"{run_id}: {len(summary.failed_items)} episode(s) failed: {summary.failed_items[0]}")


def compare_success(lake: Path, baseline: str, candidate: str) -> dict[str, Any]:
    """The paired, task-clustered difference in success of two runs (``trajlake eval``'s comparison)."""
    from trajlake.evaluators.report import build_report

    cmp = build_report(lake, baseline=baseline, candidate=candidate)["comparison"]
    m = cmp["metrics"]["success"]
    return {"estimate": m["diff"], "ci_low": m["ci_low"], "ci_high": m["ci_high"], "p_value": m["p_value"],
            "n_pairs": cmp["n_pairs"], "n_tasks": cmp["n_tasks"], "baseline": baseline, "candidate": candidate}


def has_run(lake: Path, run_id: str) -> bool:
    """Whether ``lake`` holds episodes of ``run_id`` (False when there is no lake yet)."""
    from trajlake.errors import LakeNotFoundError
    from trajlake.query import connect

    try:
        con = connect(lake)
    except LakeNotFoundError:
        return False
    row = con.execute("select count(*) from episodes where run_id = ?", [run_id]).fetchone()
    return row is not None and bool(row[0])


class Seed:
    """One training seed's lake, checkpoints and arms."""

    def __init__(self, setup: Setup, seed: int, folder: Path, log: Callable[[str], None]):
        self.setup, self.seed, self.folder, self.log = setup, seed, folder, log
        self.lake = folder / "lake"
        self.base = folder / "base"
        self.timings: dict[str, float] = {}

    # -- what is in the lake -----------------------------------------------------------------------------------
    def has_run(self, run_id: str) -> bool:
        return has_run(self.lake, run_id)

    def b1_tasks(self) -> list[str]:
        """B1's train families' tasks, interleaved: B1's data is the first ``sft_tasks``."""
        return self._pools[0]

    def rl_tasks(self) -> list[str]:
        """R1's train families' tasks, interleaved (phrasings B1 never saw)."""
        return self._pools[1]

    @functools.cached_property
    def _pools(self) -> tuple[list[str], list[str]]:
        return task_pools(self.setup)

    # -- the arms ----------------------------------------------------------------------------------------------
    def _train(self, arm: str, config: dict[str, Any]) -> None:
        from trajlake.train.config import parse_config
        from trajlake.train.loop import train

        t0 = time.monotonic()
        train(parse_config(config, f"{self.folder.name}/{arm}"), self.lake, log=self.log)
        self.timings[arm] = time.monotonic() - t0

    def base_model(self) -> Path:
        from trajlake.policies.tiny import build_tiny_model

        if not (self.base / "config.json").is_file():
            s = self.setup
            build_tiny_model(self.base, vocab_size=s.vocab_size, hidden_size=s.hidden_size, layers=s.layers,
                             heads=s.heads, kv_heads=s.kv_heads,
                             max_positions=s.max_positions, seed=self.seed, env=s.env, corpus_tasks=s.corpus_tasks)
        return self.base

    def b1(self) -> None:
        s = self.setup
        tasks = self.b1_tasks()
        if s.sft_tasks > len(tasks):
            raise ValueError(f"sft_tasks = {s.sft_tasks}: B1's train families have only {len(tasks)} tasks")
        stage = {"name": "B1", "kind": "sft", "data_policy": s.data_policy, "steps": s.sft_steps, "batch_size": s.sft_batch,
                 "lr": s.sft_lr, "warmup_steps": s.warmup_steps, "lr_schedule": s.sft_lr_schedule,
                 "min_lr_ratio": s.sft_min_lr_ratio,
                 "data": {"split": "train", "seeds": "0", "tasks": tasks[:s.sft_tasks],
                          "workers": s.workers},
                 "eval": _eval_spec(s)}
        self._train("b1", _train_config(s, self.seed, f"pc{self.seed}", self.folder / "ckpt" / "b1",
                                        self.base_model(), [stage]))

    def rl(self, arm: str, **control: bool) -> None:
        s = self.setup
        self._train(arm, _train_config(s, self.seed, f"pc{self.seed}-{arm}", self.folder / "ckpt" / arm,
                                       self.folder / "ckpt" / "b1" / "B1", [_rl_stage(s, self.rl_tasks(), **control)],
                                       run_prefix=f"{arm}-"))

    def aa(self) -> None:
        """B1's checkpoint on the evaluation split again, with another sampling seed (run ``B1-aa``)."""
        s = self.setup
        t0 = time.monotonic()
        play_checkpoint(s, self.lake, "B1-aa", self.folder / "ckpt" / "b1" / "B1", split=s.eval_split,
                        policy_version=f"pc{self.seed}-B1", policy_name=f"pc{self.seed}", label="AA",
                        sampling_seed=s.aa_sampling_seed)
        self.timings["aa"] = time.monotonic() - t0

    def matched(self) -> None:
        """B1 trained on from its checkpoint, on B1's data, for as many policy tokens as R1's updates used."""
        s = self.setup
        r1_tokens = self.stage_record("r1-R1.train")["tokens"]
        b1 = self.stage_record("B1.train")
        per_step = b1["tokens"] / max(1, b1["steps"])
        steps = max(1, round(r1_tokens / per_step))
        self.log(f"matched compute: R1 used {r1_tokens} policy tokens = {steps} B1 steps of ~{per_step:.0f}")
        stage = {"name": "B1M", "kind": "sft", "data_policy": None, "data_runs": ["B1-data"], "steps": steps,
                 "batch_size": s.sft_batch, "lr": s.sft_final_lr, "warmup_steps": s.warmup_steps,
                 "eval": _eval_spec(s)}
        self._train("matched", _train_config(s, self.seed, f"pc{self.seed}-matched", self.folder / "ckpt" / "matched",
                                             self.folder / "ckpt" / "b1" / "B1", [stage], run_prefix="matched-"))

    def stage_record(self, run_id: str) -> dict[str, Any]:
        """The ``runs.config`` the trainer registered for a stage (its steps, tokens, losses)."""
        from trajlake.query import connect

        row = connect(self.lake).execute("select config from runs where run_id = ?", [run_id]).fetchone()
        if row is None:
            raise RuntimeError(f"{self.lake}: no run {run_id} (train its arm first)")
        return dict(json.loads(row[0]))

    def run(self, arms: Sequence[str]) -> None:
        steps: list[tuple[str, Callable[[], None]]] = [
            ("b1", self.b1), ("aa", self.aa), ("r1", lambda: self.rl("r1")),
            ("placebo", lambda: self.rl("placebo", placebo_shuffle_rewards=True)),
            ("mask", lambda: self.rl("mask", loss_on_observations=True)), ("matched", self.matched)]
        for arm, play in steps:
            if arm not in arms:
                continue
            if self.has_run(ARM_RUNS[arm]):
                self.log(f"seed {self.seed}: {arm} already in the lake, not trained again")
                continue
            self.log(f"seed {self.seed}: arm {arm}")
            play()

    # -- results -----------------------------------------------------------------------------------------------
    def results(self, arms: Sequence[str]) -> dict[str, Any]:
        from trajlake.evaluators.report import build_report

        runs = [ARM_RUNS[a] for a in arms]
        report = build_report(self.lake, runs=runs)
        out: dict[str, Any] = {"seed": self.seed, "success": {}, "lake_versions": report.get("lake_versions")}
        for arm in arms:
            metric = report["runs"][ARM_RUNS[arm]]["metrics"]["success"]
            out["success"][ARM_LABELS[arm]] = metric["estimate"]
        for key, (base, cand) in COMPARISONS.items():
            if base in runs and cand in runs:
                out[key] = compare_success(self.lake, base, cand)
        out["curves"] = self.curves(arms)
        out["seconds"] = {k: round(v, 1) for k, v in self.timings.items()}
        return out

    def curves(self, arms: Sequence[str]) -> dict[str, list[tuple[int, float]]]:
        """Success of each RL arm's training rollouts per iteration (iteration k plays version k - 1)."""
        from trajlake.query import connect

        con = connect(self.lake)
        out: dict[str, list[tuple[int, float]]] = {}
        for arm in (a for a in arms if a in ("r1", "placebo", "mask")):
            rows = con.execute("select run_id, avg(coalesce(success, false)::double) from episodes where run_id like ? "
                               "group by 1", [f"{arm}-R1-it%"]).fetchall()
            pts = sorted((int(r.rsplit("-it", 1)[1]), float(v)) for r, v in rows)
            out[ARM_LABELS[arm]] = pts
        return out


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
    md += ["", "| seed | comparison | difference | 95% interval | p | pairs (tasks) |", "|---|---|---|---|---|---|"]
    for s in seeds:
        for key in COMPARISONS:
            if key in s:
                d = s[key]
                md.append(f"| {s['seed']} | {key} ({d['candidate']} - {d['baseline']}) | {d['estimate']:+.3f} | "
                          f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | {d['p_value']:.3g} | {d['n_pairs']} "
                          f"({d['n_tasks']}) |")
    for s in seeds:
        if s.get("curves"):
            name = f"curves-seed{s['seed']}.svg"
            series = [(label, pts, PALETTE[i % len(PALETTE)]) for i, (label, pts) in enumerate(s["curves"].items())]
            (out / name).write_text(lines(series, x_label="iteration", y_label="training-rollout success",
                                          title=f"seed {s['seed']}: success of the RL arms' rollouts",
                                          y_range=(0.0, 1.0)), encoding="utf-8")
            md += ["", f"![learning curves, seed {s['seed']}]({name})"]
        md += ["", f"Seed {s['seed']}: wall seconds per arm {json.dumps(s.get('seconds', {}))}"]
    md += ["", "Settings:", "", "```json", json.dumps(dataclasses.asdict(setup), indent=2), "```", ""]
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1")
    ap.add_argument("--only-seed", type=int, action="append", default=None,
                    help="run only this training seed (repeatable; e.g. one process per seed, then a last run with "
                         "--seeds N finds every arm in the lakes and writes the summary of all)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "positive_control"))
    ap.add_argument("--arms", default=",".join(ARMS), help=f"a subset of {','.join(ARMS)}")
    ap.add_argument("--setup", help="a TOML file overriding the settings (Setup's fields)")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or not arms:
        ap.error(f"--arms: unknown arm(s) {', '.join(unknown) or '(none given)'}; arms: {', '.join(ARMS)}")
    needs = {"aa": "b1", "r1": "b1", "placebo": "b1", "mask": "b1", "matched": "r1"}
    for arm in arms:
        if needs.get(arm) and needs[arm] not in arms:
            ap.error(f"--arms: {arm} needs {needs[arm]}")
    arms = [a for a in ARMS if a in arms]
    setup = Setup()
    if args.setup:
        with open(args.setup, "rb") as f:
            setup = dataclasses.replace(setup, **tomllib.load(f))
    out = Path(args.out).resolve()  # the train configs' folders: relative ones would be read against the config
    out.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    command = " ".join(["python", "bench/experiment_positive_control.py", *(argv if argv is not None else sys.argv[1:])])
    results = []
    for seed in (args.only_seed if args.only_seed is not None else range(args.seeds)):
        t0 = time.monotonic()
        run = Seed(setup, seed, out / f"seed{seed}", log)
        run.run(arms)
        results.append(run.results(arms))
        log(f"seed {seed}: done in {(time.monotonic() - t0) / 60:.1f} min")
        # after every seed, so that a stopped experiment keeps the seeds it finished
        write_outputs(out, setup, arms, results, command,
                      seeds_planned=len(args.only_seed) if args.only_seed is not None else args.seeds)
    print(json.dumps({s["seed"]: {k: s[k] for k in ("success", *COMPARISONS) if k in s} for s in results}, indent=1))
    return 0


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
