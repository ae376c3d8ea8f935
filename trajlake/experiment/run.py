"""``trajlake experiment run``: train and evaluate every arm of the matrix for every training seed into one lake,
resumably (docs/experiment.md).

Layout of ``DIR``: ``experiment.toml`` (the config as given, copied before anything runs), ``state.json`` (what
finished; a killed experiment resumes from it), ``lake/`` (every run of every seed), ``seed<S>/<ARM>/``
(checkpoints and training logs), and the bundle the report writes (:mod:`trajlake.experiment.bundle`).

Run ids: the trainer's stages are ``s<S>-<ARM>.train``, ``s<S>-<ARM>-data``, ``s<S>-<ARM>-it<k>``; evaluation
runs are ``s<S>-<ARM>-<split>`` (and ``s<S>-<ARM>-fault`` under the held-out fault kind); B2's pool is
``s<S>-B2pool-<split>``. Every run is labelled with its arm and records ``tags`` = experiment, arm, seed.

Resuming: a stage marked done in ``state.json`` is never run again. An evaluation rollout resumes inside its run
(the runner skips the committed episodes). A training stage killed part-way is trained again under a new attempt
prefix (``s<S>t<N>-``): the runs of the killed attempt stay in the lake (nothing committed is lost), are listed in
``state.json`` as abandoned and are never read by the report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trajlake.errors import PlateauError, TrajlakeError
from trajlake.experiment.config import (
    NEEDS,
    RESTART_SEED_STRIDE,
    TRAINED_ARMS,
    ExperimentConfig,
    b1_model,
    b1_stage,
    b1m_stage,
    load_experiment,
    rl_stage,
    rollout_policy_args,
    train_table,
)

Log = Callable[[str], None]
STATE_FILE = "state.json"
CONFIG_COPY = "experiment.toml"


# -- tasks ------------------------------------------------------------------------------------------------------
def interleaved_tasks(env: str, split: str, families: set[str] | None = None,
                      env_args: Mapping[str, Any] | None = None) -> list[str]:
    """The split's task ids (of ``families`` only, when given) with template families taken in turn (the first id
    of every family, then the second of every family, ...), so that every prefix holds every family alike (splits
    list their ids family by family). ``env_args``: the environment's keyword arguments (the config's)."""
    from trajlake.envs import list_tasks

    by_family: dict[str, list[str]] = {}
    for t in list_tasks(env, split, **dict(env_args or {})):
        family = t["task_id"].rsplit("/", 1)[0]
        if families is None or family in families:
            by_family.setdefault(family, []).append(t["task_id"])
    if not by_family:
        raise TrajlakeError(f"environment {env}: split {split!r} has no tasks" + (" of those families" if families
                                                                                   else ""))
    rounds = max(len(ids) for ids in by_family.values())
    return [ids[i] for i in range(rounds) for _, ids in sorted(by_family.items()) if i < len(ids)]


def phrasing_families(env: str, holdout: int,
                      env_args: Mapping[str, Any] | None = None) -> tuple[set[str], set[str]]:
    """B1's and the RL arms' train families when the last ``holdout`` phrasings of every kind go to RL: families
    must be named ``<env>/<kind>/p<N>``."""
    from trajlake.envs import list_tasks

    by_kind: dict[str, dict[int, str]] = {}
    for t in list_tasks(env, "train", **dict(env_args or {})):
        family = t["task_id"].rsplit("/", 1)[0]
        head, _, phrasing = family.rpartition("/p")
        if not head or not phrasing.isdigit():
            raise TrajlakeError(f"rl.holdout_phrasings needs template families named <env>/<kind>/p<N>; {env} has "
                                f"{family!r}")
        by_kind.setdefault(head, {})[int(phrasing)] = family
    b1: set[str] = set()
    rl: set[str] = set()
    for kind, phrasings in sorted(by_kind.items()):
        order = sorted(phrasings)
        if not 0 < holdout < len(order):
            raise TrajlakeError(f"rl.holdout_phrasings = {holdout}: kind {kind} has {len(order)} train phrasings")
        b1 |= {phrasings[i] for i in order[:-holdout]}
        rl |= {phrasings[i] for i in order[-holdout:]}
    return b1, rl


def task_pools(cfg: ExperimentConfig) -> tuple[list[str], list[str]]:
    """B1's data tasks and the RL arms' tasks, disjoint: the first ``b1.tasks`` and the next ``rl.tasks`` of the
    interleaved train split, or with ``rl.holdout_phrasings`` the first of B1's families and of the held-out
    phrasings' families (RL plays tasks B1 never saw, so it has something left to learn)."""
    if cfg.rl.holdout_phrasings:
        b1_families, rl_families = phrasing_families(cfg.env, cfg.rl.holdout_phrasings, cfg.env_args)
        pools = [interleaved_tasks(cfg.env, "train", b1_families, cfg.env_args),
                 interleaved_tasks(cfg.env, "train", rl_families, cfg.env_args)]
    else:
        train = interleaved_tasks(cfg.env, "train", env_args=cfg.env_args)
        pools = [train, train[cfg.b1.tasks:]]
    for name, pool, n in (("b1.tasks", pools[0], cfg.b1.tasks), ("rl.tasks", pools[1], cfg.rl.tasks)):
        if n > len(pool):
            raise TrajlakeError(f"{name} = {n}, but {cfg.env} has only {len(pool)} train tasks for it")
    return pools[0][:cfg.b1.tasks], pools[1][:cfg.rl.tasks]


def eval_tasks(cfg: ExperimentConfig, split: str) -> list[str]:
    tasks = interleaved_tasks(cfg.env, split, env_args=cfg.env_args)
    return tasks[:cfg.eval_tasks] if cfg.eval_tasks else tasks


# -- state ------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class State:
    """``DIR/state.json``: per stage key (``s0/R1/train``, ``s0/R1/eval:hidden``, ...) its status (``started``,
    ``done``), attempt, seconds and outputs; ``abandoned``: run prefixes of killed training attempts."""

    path: Path
    stages: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    abandoned: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @classmethod
    def load(cls, folder: Path) -> State:
        path = folder / STATE_FILE
        if not path.is_file():
            return cls(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TrajlakeError(f"{path}: unreadable experiment state ({e}); move it away to start over") from e
        return cls(path, dict(data.get("stages", {})), list(data.get("abandoned", [])))

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"stages": self.stages, "abandoned": self.abandoned}, indent=1, sort_keys=True)
                       + "\n", encoding="utf-8")
        os.replace(tmp, self.path)  # a kill leaves the old state or the new one, never half of one

    def done(self, key: str) -> dict[str, Any] | None:
        s = self.stages.get(key)
        return s if s is not None and s.get("status") == "done" else None


# -- the experiment ---------------------------------------------------------------------------------------------
class Experiment:
    """One experiment folder: its config, state and lake."""

    def __init__(self, cfg: ExperimentConfig, folder: Path, log: Log):
        self.cfg, self.folder, self.log = cfg, folder, log
        self.lake = folder / "lake"
        self.state = State.load(folder)
        self._t0 = time.monotonic()
        self._planned = 0
        self._finished = 0
        self._skipped = 0

    # .. bookkeeping .............................................................................................
    def _stage(self, key: str, arm: str, seed: int, play: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
        """Run ``play(attempt)`` once for ``key`` unless it is done; record it in the state."""
        done = self.state.done(key)
        self._finished += 1
        if done is not None:
            self._skipped += 1  # done before a resume: not in the ETA's pace
            return done
        old = self.state.stages.get(key)
        attempt = int(old.get("attempt", 1)) + 1 if old else 1
        if old and old.get("prefix"):
            self.state.abandoned.append({"stage": key, "attempt": old.get("attempt", 1), "prefix": old["prefix"]})
        self.log(f"[{self._progress()}] seed {seed} arm {arm}: {key.split('/', 2)[2]}"
                 + (f" (attempt {attempt}: the previous one was killed)" if attempt > 1 else ""))
        entry: dict[str, Any] = {"status": "started", "attempt": attempt, "started_at": time.time()}
        if key.endswith("/train"):
            entry["prefix"] = self.prefix(seed, attempt)
        self.state.stages[key] = entry
        self.state.save()
        t0 = time.monotonic()
        out = play(attempt)
        entry.update(out, status="done", seconds=round(time.monotonic() - t0, 1))
        self.state.save()
        return entry

    def _progress(self) -> str:
        elapsed = time.monotonic() - self._t0
        ran = self._finished - 1 - self._skipped  # stages this process ran to the end
        left = self._planned - self._finished + 1
        eta = ""
        if ran > 0 and left > 0:
            eta = f", ETA {elapsed / ran * left / 60:.0f} min"
        return f"{self._finished}/{self._planned}{eta}"

    def prefix(self, seed: int, attempt: int = 1, restart: int = 0) -> str:
        """Run-id prefix of a stage: ``s<seed>-``; ``t<attempt>`` after a killed attempt, ``r<k>`` for B1's k-th
        restart after a failed plateau check."""
        return f"s{seed}{f't{attempt}' if attempt > 1 else ''}{f'r{restart}' if restart else ''}-"

    def tags(self, arm: str, seed: int) -> dict[str, str]:
        return {"experiment": self.cfg.name, "arm": arm, "seed": str(seed)}

    def base_model(self, seed: int = 0) -> Path:
        """The model B1 starts from: ``[model] path`` (relative to the config file) or the tiny model B1's stage
        built for ``seed``."""
        if self.cfg.model.path is not None:
            path = Path(self.cfg.model.path)
            return path if path.is_absolute() else Path(self.cfg.source or ".").parent / path
        return self.checkpoint(seed, "B1").parent / "base"  # beside B1's checkpoint, in its attempt's folder

    def checkpoint(self, seed: int, arm: str) -> Path:
        entry = self.state.done(f"s{seed}/{arm}/train")
        if entry is None:
            raise TrajlakeError(f"seed {seed}: arm {arm} has no trained checkpoint yet")
        return Path(entry["checkpoint"])

    # .. training ................................................................................................
    def _train(self, seed: int, arm: str, attempt: int, model: dict[str, Any], stage: dict[str, Any],
               restart: int = 0) -> dict[str, Any]:
        from trajlake.train.config import parse_config
        from trajlake.train.loop import train

        cfg = self.cfg
        again = (f".t{attempt}" if attempt > 1 else "") + (f".r{restart}" if restart else "")
        out_dir = self.folder / f"seed{seed}" / f"{arm}{again}"
        name = f"{cfg.name}-s{seed}-{arm}{again.replace('.', '-')}"
        prefix = self.prefix(seed, attempt, restart)
        data = train_table(cfg, name=name, seed=seed, out_dir=str(out_dir), run_prefix=prefix,
                           tags=self.tags(arm, seed), model=model, stage=stage)
        result = train(parse_config(data, f"{cfg.name} seed {seed} arm {arm}"), self.lake, log=self._quiet)
        s = result.stages[0]
        return {"checkpoint": s.checkpoint, "policy_version": s.policy_version, "runs": s.runs,
                "train_run": f"{prefix}{arm}.train", "tokens": s.tokens, "steps": s.steps}

    def _quiet(self, line: str) -> None:
        # the trainer's per-step lines go to the stage's training log; stderr keeps the stage lines
        if not line.startswith("  ") or "rollout" in line:
            self.log(f"    {line.strip()}")

    def _rollout_args(self) -> dict[str, str]:
        return rollout_policy_args(self.cfg)

    def b1(self, seed: int) -> None:
        cfg = self.cfg
        data_tasks, _ = task_pools(cfg)
        key = f"s{seed}/B1/train"

        def play(attempt: int) -> dict[str, Any]:
            stopped: list[dict[str, Any]] = []
            for restart in range(cfg.b1.restarts + 1):
                model = b1_model(cfg, seed, restart)
                if cfg.model.path is not None:
                    model["path"] = str(self.base_model())
                last = restart == cfg.b1.restarts
                stage = b1_stage(cfg, data_tasks, check=not last)
                try:
                    out = self._train(seed, "B1", attempt, model, stage, restart)
                except PlateauError as e:
                    # B1's own training loss says it never left the plateau: a new initialisation, same data
                    stopped.append({"restart": restart, "model_seed": model["seed"], "step": e.step,
                                    "mean_loss": round(e.mean_loss, 6),
                                    "prefix": self.prefix(seed, attempt, restart)})
                    self.state.stages[key]["restarts"] = list(stopped)  # visible while the next one trains
                    self.state.save()
                    self.log(f"    B1 (model seed {model['seed']}) stopped at step {e.step}: mean loss "
                             f"{e.mean_loss:.4f} above the plateau check's bar; restart {restart + 1} of "
                             f"{cfg.b1.restarts} from model seed {seed + RESTART_SEED_STRIDE * (restart + 1)}")
                    continue
                if cfg.b1.rl_tasks_check is not None and not last:
                    rate, run = self._rl_tasks_check(seed, attempt, restart, out)
                    if rate < cfg.b1.rl_tasks_check.min_success:
                        # B1 learnt its data but solves too few of R1's own tasks to leave R1 a reward
                        stopped.append({"restart": restart, "model_seed": model["seed"], "check": "rl_tasks",
                                        "rl_tasks_success": rate, "run": run,
                                        "prefix": self.prefix(seed, attempt, restart)})
                        self.state.stages[key]["restarts"] = list(stopped)
                        self.state.save()
                        self.log(f"    B1 (model seed {model['seed']}) solved {rate:.3f} of the RL arms' train tasks, "
                                 f"below rl_tasks_check.min_success = {cfg.b1.rl_tasks_check.min_success}; restart "
                                 f"{restart + 1} of {cfg.b1.restarts} from model seed "
                                 f"{seed + RESTART_SEED_STRIDE * (restart + 1)}")
                        continue
                    out["rl_tasks_check"] = {"success": rate, "run": run}
                if cfg.b1.restarts:
                    out.update(restarts=stopped, model_seed=model["seed"])
                return out
            raise AssertionError("unreachable: the last restart runs without the plateau check")

        self._stage(key, "B1", seed, play)

    def _rl_tasks_check(self, seed: int, attempt: int, restart: int, b1: dict[str, Any]) -> tuple[float, str]:
        """B1's success rate on the RL arms' own train tasks (``[b1] rl_tasks_check``), and the run it played."""
        check = self.cfg.b1.rl_tasks_check
        assert check is not None
        _, rl_tasks = task_pools(self.cfg)
        run = f"{self.prefix(seed, attempt, restart)}B1-rl-tasks-check"
        played = self._play(run, "B1", seed, f"hf:{b1['checkpoint']}", b1["policy_version"], "train",
                            attempts=check.attempts, task_ids=rl_tasks)
        if played["written"] != played["episodes"]:  # a fresh run id per attempt and restart: nothing to resume
            raise TrajlakeError(f"{run}: {played['episodes'] - played['written']} episode(s) were already in the "
                                f"lake; B1's RL-tasks check counts only a run it plays whole")
        return round(played["successes"] / max(1, played["written"]), 6), run

    def rl(self, seed: int, arm: str) -> None:
        _, rl_tasks = task_pools(self.cfg)
        stage = rl_stage(self.cfg, arm, rl_tasks, self._rollout_args())
        model = {"path": str(self.checkpoint(seed, "B1"))}
        self._stage(f"s{seed}/{arm}/train", arm, seed, lambda attempt: self._train(seed, arm, attempt, model, stage))

    def b1m(self, seed: int) -> None:
        """B1 trained on (its data, its final learning rate) for as many policy tokens as R1's updates used: the
        compute-matched SFT arm of H1."""
        cfg = self.cfg
        b1 = self.state.done(f"s{seed}/B1/train")
        r1 = self.state.done(f"s{seed}/R1/train")
        assert b1 is not None and r1 is not None
        per_step = max(1.0, float(b1["tokens"]) / max(1, int(b1["steps"])))
        steps = max(1, round(float(r1["tokens"]) / per_step))
        data_run = next(r for r in b1["runs"] if r.endswith("-data"))
        stage = b1m_stage(cfg, steps, data_run)
        model = {"path": str(self.checkpoint(seed, "B1"))}

        def play(attempt: int) -> dict[str, Any]:
            self.log(f"    B1M: R1 trained on {r1['tokens']} policy tokens = {steps} B1 steps of ~{per_step:.0f}")
            out = self._train(seed, "B1M", attempt, model, stage)
            out["matched_tokens"] = {"r1_policy_tokens": r1["tokens"], "b1_tokens_per_step": per_step,
                                     "steps": steps, "b1m_policy_tokens": out["tokens"]}
            return out

        self._stage(f"s{seed}/B1M/train", "B1M", seed, play)

    # .. evaluation ..............................................................................................
    def _play(self, run_id: str, arm: str, seed: int, policy: str, version: str | None, split: str, *,
              attempts: int = 1, fault_rate: float = 0.0, fault_kinds: tuple[str, ...] = (),
              extra_args: dict[str, str] | None = None, task_ids: list[str] | None = None) -> dict[str, Any]:
        from trajlake.record.episode import CostModel
        from trajlake.rollout.faults import DEFAULT_FAULT_KINDS
        from trajlake.rollout.runner import RolloutConfig, parse_seeds, run_rollout
        from trajlake.train.loop import COMMON_SEEDS

        cfg = self.cfg
        args = {"temperature": str(cfg.temperature), **self._rollout_args(), "seed": str(cfg.sampling_seed),
                **(extra_args or {})}
        if policy.startswith("single-turn:") and "batch_episodes" not in (extra_args or {}):
            # the experiment's batch_episodes batches the hf: arms' multi-turn engine; B0's single answer per
            # episode plays unbatched (single-turn refuses the key)
            args.pop("batch_episodes", None)
        summary = run_rollout(RolloutConfig(
            lake=str(self.lake), run_id=run_id, env=cfg.env, policy=policy, split=split,
            task_ids=tuple(eval_tasks(cfg, split) if task_ids is None else task_ids), seeds=parse_seeds(cfg.eval_seeds), workers=cfg.workers,
            policy_version=version, policy_name=f"{cfg.name}-s{seed}-{arm}", label=arm, attempts=attempts,
            commit_every_s=10.0, policy_args=args, env_kwargs=dict(cfg.env_args), sampling_seed_rule=COMMON_SEEDS,
            fault_rate=fault_rate, fault_seed=seed, fault_kinds=fault_kinds or DEFAULT_FAULT_KINDS, tags=self.tags(arm, seed),
            cost_model=CostModel.for_run(args)))
        if summary.failed_items:
            raise TrajlakeError(f"{run_id}: {len(summary.failed_items)} episode(s) failed: {summary.failed_items[0]}")
        self.log(f"    {run_id}: {summary.written} episode(s) ({summary.successes} successful)")
        return {"run": run_id, "episodes": summary.written + summary.skipped_existing,
                "written": summary.written, "successes": summary.successes}

    def evaluate(self, seed: int, arm: str, split: str) -> None:
        cfg = self.cfg
        key = f"s{seed}/{arm}/eval:{split}"
        run = f"s{seed}-{arm}-{split}"
        if arm == "B2":
            self._best_of(seed, split)
            return
        if arm == "B0":
            ckpt = self.checkpoint(seed, "B1")
            folder = ckpt if cfg.b0.model == "b1" else self.base_model(seed)
            policy, version = f"single-turn:hf:{folder}", None
            extra = dict(cfg.b0.policy_args)
        else:
            # AA: B1's checkpoint again under another sampling seed
            entry = self.state.done(f"s{seed}/{'B1' if arm == 'AA' else arm}/train")
            assert entry is not None
            policy, version = f"hf:{entry['checkpoint']}", entry["policy_version"]
            extra = {"seed": str(cfg.aa_sampling_seed)} if arm == "AA" else {}
        self._stage(key, arm, seed, lambda _a: self._play(run, arm, seed, policy, version, split, extra_args=extra))

    def evaluate_fault(self, seed: int, arm: str) -> None:
        """The arm on the first evaluation split with only the held-out fault kind injected (H3)."""
        cfg = self.cfg
        entry = self.state.done(f"s{seed}/{arm}/train")
        assert entry is not None
        run = f"s{seed}-{arm}-fault"
        self._stage(f"s{seed}/{arm}/eval:fault", arm, seed, lambda _a: self._play(
            run, arm, seed, f"hf:{entry['checkpoint']}", entry["policy_version"], cfg.primary_split,
            fault_rate=cfg.r3.eval_fault_rate, fault_kinds=(cfg.r3.held_out_fault_kind,)))

    def _best_of(self, seed: int, split: str) -> None:
        """B2: N attempts of B1's checkpoint, then one per group chosen within R1's total-cost budget."""
        cfg = self.cfg
        b1 = self.state.done(f"s{seed}/B1/train")
        assert b1 is not None
        pool = f"s{seed}-B2pool-{split}"
        self._stage(f"s{seed}/B2/pool:{split}", "B2", seed, lambda _a: self._play(
            pool, "B2", seed, f"hf:{b1['checkpoint']}", b1["policy_version"], split, attempts=cfg.b2.attempts))

        def select(_attempt: int) -> dict[str, Any]:
            from trajlake.policies.best_of import select_best
            from trajlake.query import connect

            budget = self.b2_budget(seed, split)
            out = f"s{seed}-B2-{split}"
            # select_best commits the whole run at once: a run already there was written by a killed attempt
            if not connect(self.lake).execute("select 1 from runs where run_id = ?", [out]).fetchall():
                report = select_best(str(self.lake), pool, out, budget_tokens=budget["budget_tokens"], label="B2",
                                     tags=self.tags("B2", seed))
                self.log(f"    {out}: {report.summary().splitlines()[0]}")
            return {"run": out, "budget": budget}

        self._stage(f"s{seed}/B2/eval:{split}", "B2", seed, select)

    def b2_budget(self, seed: int, split: str) -> dict[str, Any]:
        """B2's tokens per (task, seed), matched to R1's total cost: R1's mean tokens per episode on the split
        plus R1's training compute in inference-token equivalents per evaluated episode (training FLOPs /
        (2 x parameters) / episodes: a forward pass costs ~2 FLOPs per parameter and token)."""
        from trajlake.query import connect

        con = connect(self.lake)
        r1_eval = self.state.done(f"s{seed}/R1/eval:{split}")
        if r1_eval is None:
            raise TrajlakeError(f"B2's budget needs R1's evaluation on {split} (evaluate R1 first)")
        r1_run = r1_eval["run"]
        row = con.execute("select avg(coalesce(tokens_in, 0) + coalesce(tokens_out, 0)), count(*) from episodes "
                          "where run_id = ?", [r1_run]).fetchone()
        if row is None or not row[1]:
            raise TrajlakeError(f"B2's budget needs R1's evaluation run {r1_run} (evaluate R1 first)")
        deploy, n = float(row[0]), int(row[1])
        r1 = self.state.done(f"s{seed}/R1/train")
        assert r1 is not None
        cfg_row = con.execute("select config from runs where run_id = ?", [r1["train_run"]]).fetchone()
        compute = json.loads(cfg_row[0]).get("training_compute", {}) if cfg_row else {}
        flops, params = float(compute.get("flops_estimate") or 0.0), float(compute.get("parameters") or 0.0)
        training_tokens = flops / (2.0 * params) / n if params else 0.0
        return {"budget_tokens": deploy + training_tokens, "r1_deployment_tokens": deploy,
                "r1_training_tokens_equivalent": training_tokens, "r1_training_flops": flops,
                "episodes": n, "rule": "R1's mean tokens per episode + R1's training FLOPs / (2 x parameters) / "
                                       "R1's evaluated episodes"}

    # .. the whole matrix ........................................................................................
    def plan(self) -> list[tuple[str, int, str, str]]:
        return self.plan_of(self.cfg)

    @staticmethod
    def plan_of(cfg: ExperimentConfig) -> list[tuple[str, int, str, str]]:
        """Every stage in running order: (what, seed, arm, split), what in train, pool, eval, fault."""
        arms = cfg.all_arms()
        fault_arms = [a for a in ("B1", "R1", "R3") if a in arms] if "R3" in arms or any(
            h.metric == "recovery_held_out" for h in cfg.hypotheses) else []
        out: list[tuple[str, int, str, str]] = []
        for seed in range(cfg.seeds):
            for arm in arms:
                if arm in TRAINED_ARMS:
                    out.append(("train", seed, arm, ""))
                for split in cfg.eval_splits:
                    if arm == "B2":
                        out.append(("pool", seed, arm, split))
                    out.append(("eval", seed, arm, split))
                if arm in fault_arms:
                    out.append(("fault", seed, arm, cfg.primary_split))
        return out

    def run(self) -> None:
        steps = self.plan()
        self._planned = len(steps)
        for what, seed, arm, split in steps:
            if what == "train" and arm == "B1":
                self.b1(seed)
            elif what == "train" and arm == "B1M":
                self.b1m(seed)
            elif what == "train":
                self.rl(seed, arm)
            elif what == "eval":
                self.evaluate(seed, arm, split)
            elif what == "fault":
                self.evaluate_fault(seed, arm)
            # "pool" is played (and counted) by evaluate's B2 branch


def _copy_config(src: Path, folder: Path) -> None:
    """Keep the config beside the results; a resumed experiment must be given the same config."""
    dest = folder / CONFIG_COPY
    if dest.is_file():
        if dest.read_bytes() != src.read_bytes():
            raise TrajlakeError(f"{folder} holds an experiment with another config ({dest}); resume it with that "
                                f"config or choose another --out")
        return
    shutil.copyfile(src, dest)


def run_experiment(config: str | Path, out: str | Path, *, log: Log, command: str | None = None) -> Path:
    """Run (or resume) the experiment of ``config`` in ``out``, then write its bundle; returns ``out``."""
    from trajlake.experiment.bundle import write_bundle

    cfg = load_experiment(config)
    # rollout workers load a checkpoint per run: their progress bars would bury the stage lines on stderr
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    folder = Path(out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    _copy_config(Path(config), folder)
    exp = Experiment(cfg, folder, log)
    exp.run()
    write_bundle(folder, cfg, exp.state, command=command, log=log)
    return folder


__all__ = ["NEEDS", "Experiment", "State", "eval_tasks", "interleaved_tasks", "run_experiment", "task_pools"]
