"""``trajlake experiment``'s configuration: the §8 matrix (arms B0-R3), training seeds, evaluation, and the
hypotheses with their decision rules, all stated before anything runs (docs/experiment.md).

A config file is TOML: top-level keys (:class:`ExperimentConfig`), the ``[model]`` table of the trainer
(:class:`trajlake.train.config.ModelConfig`), one table per arm family (``[b0]``, ``[b1]``, ``[b2]``, ``[rl]``,
``[r2]``, ``[r3]``) and an array of ``[[hypotheses]]``. An unknown key or a bad value is one clear error naming the
file and the key."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trajlake.errors import ConfigError
from trajlake.train.config import (
    ModelConfig,
    PlateauCheck,
    TrainConfig,
    build_table,
    config_problems,
    raise_problems,
)

Arm = Literal["B0", "B1", "B2", "R1", "R2", "R3"]
ARMS: tuple[str, ...] = typing.get_args(Arm)
#: Arms the experiment adds itself when a hypothesis needs them: B1M is B1 trained on for as many policy tokens
#: as R1's updates used (H1 at matched training compute).
DERIVED_ARMS = ("B1M",)
#: Controls an experiment may add to ``arms`` (docs/experiment.md, "Controls"): AA, B1's checkpoint evaluated again
#: with another sampling seed (its difference from B1 must include 0); PLACEBO, R1 with the returns shuffled within
#: each group (the update's shape and noise without the reward's information: its difference from B1 must include
#: 0); MASK, R1 with its loss on the observation tokens too (the mask ablation of 19.6, reported against R1).
CONTROL_ARMS = ("AA", "PLACEBO", "MASK")
Metric = Literal["success", "steps", "cost_usd", "success_at_steps", "success_at_cost", "recovery_held_out"]
METRICS: tuple[str, ...] = typing.get_args(Metric)
Direction = Literal["greater", "less"]
Matching = Literal["none", "training_compute", "total_cost", "steps", "cost"]


@dataclass(frozen=True)
class RlTasksCheck:
    """``rl_tasks_check = { min_success = S }`` of ``[b1]``: after B1 has trained (and passed its plateau check, if
    any), it plays the RL arms' own train tasks (``[rl] tasks`` of them, ``attempts`` each, at the experiment's
    temperature and sampling seed); a B1 whose success there is below S is trained again from a new
    initialisation, like one stopped on its plateau. RL learns only from groups whose attempts differ: a B1 that
    solves none of R1's tasks leaves R1 no reward (docs/training.md, "Eleventh design", seed 0). Decided on train
    tasks only, never on an evaluation split."""

    min_success: float
    """The bar: B1's success rate on the RL arms' train tasks, in [0, 1]."""
    attempts: int = 1
    """Episodes per task."""


@dataclass(frozen=True)
class SftSettings:
    """``[b1]``: the supervised stage (B1) on a scripted demonstrator's episodes of train tasks."""

    tasks: int = 200
    """The demonstrator plays the first this many train tasks (families taken in turn) for B1's data."""
    data_policy: str = "oracle"
    """The scripted policy whose episodes B1 learns from (one of the environment's policies, e.g. tool-lookup's
    ``oracle-shortcut``: the positive control's fourth design); recorded in B1's stage config."""
    steps: int = 100
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 5
    lr_schedule: Literal["constant", "linear", "cosine"] = "cosine"
    min_lr_ratio: float = 0.1
    plateau_check: PlateauCheck | None = None
    """``{ step = S, window = W, max_loss = L }``: B1's training-loss check (the trainer's sft ``plateau_check``):
    a B1 whose mean loss over steps S-W .. S-1 is above L is stopped there and trained again from a new
    initialisation, up to ``restarts`` times. Decided on B1's own training loss only, never on an evaluation."""
    rl_tasks_check: RlTasksCheck | None = None
    """``{ min_success = S, attempts = A }``: B1's success on the RL arms' own train tasks after training
    (:class:`RlTasksCheck`); below S, B1 is trained again from a new initialisation, up to ``restarts`` times."""
    restarts: int = 0
    """With ``plateau_check`` or ``rl_tasks_check``: how many times B1 may start again from a new initialisation
    (the tiny model's seed ``seed + 1000 * k`` for restart k, its runs prefixed ``s<seed>r<k>-``). The last restart
    runs without the checks, so every seed ends with a B1; the stopped attempts are listed in the state and the
    bundle."""


@dataclass(frozen=True)
class RlSettings:
    """``[rl]``: what R1, R2 and R3 share (each starts from B1's checkpoint)."""

    algo: Literal["rloo", "grpo", "ppo"] = "rloo"
    tasks: int = 32
    """Train tasks played per iteration (the train tasks after B1's data, families taken in turn)."""
    holdout_phrasings: int = 0
    """With template families ``<env>/<kind>/p<N>`` (tool-lookup): the last this many train phrasings of every kind
    are kept out of B1's data and the RL arms play only their tasks (phrasings B1 never saw leave RL something to
    learn; docs/training.md, "The positive control"). 0: B1's data and the RL tasks are disjoint prefixes of the
    interleaved train split."""
    attempts: int = 4
    """Attempts per task: one RLOO/GRPO group each."""
    iterations: int = 2
    steps: int = 2
    batch_size: int = 16
    lr: float = 3e-4
    warmup_steps: int = 0
    max_staleness: int = 0
    ref_kl_coef: float = 0.0
    """Weight of every RL arm's KL penalty to B1 (``ref_kl_coef`` of the stage, docs/training.md): the same for
    R1, R2, R3, the placebo and the mask ablation. 0: none."""


@dataclass(frozen=True)
class R2Settings:
    """``[r2]``: R1 plus a turn-level process reward (``trajlake.evaluators.process_rewards``)."""

    process_reward: str = "lookup_progress"
    process_weight: float = 0.5
    process_shaping: Literal["per_turn", "potential"] = "per_turn"
    """How the process reward enters the return (the trainer's ``process_shaping``, docs/training.md "R2: credit
    per turn"): at the turn that earned it, or as potential-based shaping with the terminal correction."""


@dataclass(frozen=True)
class R3Settings:
    """``[r3]``: R1 plus the fault curriculum; its evaluation injects only ``held_out_fault_kind``, never trained
    on (H3)."""

    fault_rate_schedule: tuple[float, ...] = (0.1, 0.2, 0.3)
    fault_kinds: tuple[str, ...] = ()
    """Kinds injected in training (empty: the runner's defaults, less the held-out kind)."""
    held_out_fault_kind: str = "timeout"
    eval_fault_rate: float = 0.3
    """Fault rate of the held-out-fault evaluation runs (of R1, R3 and B1)."""


@dataclass(frozen=True)
class B0Settings:
    """``[b0]``: one answer from the statement alone, no tools (``single-turn:`` policy)."""

    model: Literal["b1", "base"] = "b1"
    """The checkpoint asked: B1's (the same weights as the agent, so B0 - B1 isolates the tools) or the base."""
    policy_args: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class B2Settings:
    """``[b2]``: best-of-N of B1's checkpoint at a budget matched to R1's total cost (docs/experiment.md)."""

    attempts: int = 4
    """N: attempts per (task, seed) in the pool the choice is made from."""


@dataclass(frozen=True)
class HypothesisSpec:
    """``[[hypotheses]]``: one preregistered comparison and its decision rule."""

    id: str
    """``H1a``, ``H1b``, ... when a hypothesis makes several comparisons; ``H3`` when it makes one."""
    hypothesis: Literal["H1", "H2", "H3", "H4"]
    claim: str
    """The claim in words, as it stands in the report."""
    metric: Metric
    """``success``, ``steps`` (policy turns), ``cost_usd``; ``success_at_steps`` / ``success_at_cost``: success
    that counts only within the baseline run's mean steps / cost per episode (the step- and cost-matched
    comparisons of H4); ``recovery_held_out``: success in the held-out-fault evaluation over the episodes that met
    the fault on both sides (H3)."""
    baseline: str
    """An arm (B0, B1, B1M, B2, R1, R2, R3)."""
    candidate: str
    direction: Direction = "greater"
    """The hypothesised sign of candidate - baseline."""
    matching: Matching = "none"
    """How the arms are matched, as built by the experiment: ``training_compute`` (B1M), ``total_cost`` (B2's
    budget), ``steps`` / ``cost`` (the capped success metrics), ``none``."""
    split: str | None = None
    """The evaluation split compared (default: the experiment's first ``eval_splits``)."""


@dataclass(frozen=True)
class DecisionRule:
    """``[decision]``: how an entry's verdict follows from its interval (the same rule for every entry)."""

    alpha: float = 0.05
    """Family-wise error rate (Holm across every entry) and 1 - the intervals' confidence."""
    power: float = 0.8
    """For the minimum detectable difference stated with an inconclusive verdict."""
    min_effect: float = 0.05
    """The smallest difference the hypothesis claims (in the metric's units, in its direction): an interval wholly
    below it refutes the entry."""


@dataclass(frozen=True)
class ExperimentConfig:
    """The whole experiment (top-level keys of the config file)."""

    name: str
    env: str = "tool-lookup"
    seeds: int = 1
    """Training seeds 0..N-1: each trains every arm from its own base model."""
    arms: tuple[str, ...] = ARMS
    eval_splits: tuple[str, ...] = ("hidden",)
    """Every arm is evaluated on each; the first is the hypotheses' split."""
    eval_tasks: int = 0
    """The first this many tasks of each evaluation split (0: all)."""
    eval_seeds: str = "0"
    sampling_seed: int = 0
    """The common sampling seed of every evaluation run (paired comparisons across arms)."""
    workers: int = 2
    device: str = "cpu"
    temperature: float = 1.0
    max_length: int = 1024
    micro_batch_size: int = 0
    """The trainer's ``micro_batch_size`` in every arm's stage (0: each batch in one forward pass)."""
    policy_args: dict[str, str] = field(default_factory=dict)
    """Settings of the ``hf:`` policy in every rollout (``max_new_tokens``, ...)."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Environment settings of every rollout (``budget = { max_steps = 10 }``, ...)."""
    lambda_cost: float = 0.0
    """The RL arms' lambda_c (19.3): weight of an episode's ``cost_usd`` in its return."""
    aa_sampling_seed: int = 1
    """The AA control's sampling seed (the other evaluation runs use ``sampling_seed``)."""
    trajectories: int = 100
    """Episodes exported to the bundle's ``trajectories/`` (and replayed)."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(build_tiny=True))
    b0: B0Settings = field(default_factory=B0Settings)
    b1: SftSettings = field(default_factory=SftSettings)
    b2: B2Settings = field(default_factory=B2Settings)
    rl: RlSettings = field(default_factory=RlSettings)
    r2: R2Settings = field(default_factory=R2Settings)
    r3: R3Settings = field(default_factory=R3Settings)
    decision: DecisionRule = field(default_factory=DecisionRule)
    hypotheses: tuple[HypothesisSpec, ...] = ()
    source: str | None = None
    """The file it was read from (set by :func:`load_experiment`)."""

    @property
    def primary_split(self) -> str:
        return self.eval_splits[0]

    def all_arms(self) -> list[str]:
        """The configured arms plus the derived ones a hypothesis names, in running order."""
        named = {h.baseline for h in self.hypotheses} | {h.candidate for h in self.hypotheses}
        order = ["B1", "B0", "R1", "B1M", "B2", "R2", "R3", *CONTROL_ARMS]
        return [a for a in order if a in self.arms or (a in DERIVED_ARMS and a in named)]


#: What each arm needs trained first.
NEEDS = {"B0": "B1", "B2": "R1", "R1": "B1", "R2": "B1", "R3": "B1", "B1M": "R1", "AA": "B1", "PLACEBO": "B1",
         "MASK": "R1"}


def experiment_problems(cfg: ExperimentConfig) -> list[str]:
    """What the types cannot check: arms, their prerequisites, hypotheses naming arms that will run."""
    out: list[str] = []
    unknown = [a for a in cfg.arms if a not in ARMS + CONTROL_ARMS]
    if unknown:
        out.append(f"arms: unknown arm(s) {', '.join(unknown)}; arms are {', '.join(ARMS + CONTROL_ARMS)}")
    if cfg.seeds < 1:
        out.append("seeds: at least 1")
    if not cfg.eval_splits:
        out.append("eval_splits: at least one split")
    runs = set(cfg.all_arms())
    for arm in sorted(runs):
        need = NEEDS.get(arm)
        if need and need not in runs:
            out.append(f"arms: {arm} needs {need} (add it to arms)")
    seen: set[str] = set()
    for i, h in enumerate(cfg.hypotheses):
        at = f"hypotheses[{i}] ({h.id})"
        if h.id in seen:
            out.append(f"{at}: id given twice")
        seen.add(h.id)
        for side in (h.baseline, h.candidate):
            if side not in ARMS + DERIVED_ARMS + CONTROL_ARMS:
                out.append(f"{at}: unknown arm {side!r}")
        if h.split is not None and h.split not in cfg.eval_splits:
            out.append(f"{at}: split {h.split!r} is not one of eval_splits")
        if h.metric == "recovery_held_out" and not {h.baseline, h.candidate} <= {"B1", "R1", "R3"}:
            out.append(f"{at}: recovery_held_out compares B1, R1 or R3 (the arms evaluated under the held-out fault)")
    if cfg.b1.restarts < 0:
        out.append(f"b1.restarts = {cfg.b1.restarts}: must be >= 0")
    elif (cfg.b1.restarts > 0) != (cfg.b1.plateau_check is not None or cfg.b1.rl_tasks_check is not None):
        out.append("b1: plateau_check or rl_tasks_check and restarts >= 1 go together (B1 restarts when a check "
                   "fails; the last restart runs without the checks)")
    elif cfg.b1.restarts and cfg.model.path is not None:
        out.append("b1.restarts: only a tiny model built by the experiment ([model] build_tiny) has a new "
                   "initialisation to restart from")
    check = cfg.b1.rl_tasks_check
    if check is not None:
        if not (isinstance(check.min_success, int | float) and 0.0 <= check.min_success <= 1.0):
            out.append(f"b1.rl_tasks_check.min_success = {check.min_success}: a success rate in [0, 1]")
        if check.attempts < 1:
            out.append(f"b1.rl_tasks_check.attempts = {check.attempts}: at least 1")
        if not any(arm in runs for arm in ("R1", "R2", "R3", "PLACEBO", "MASK")):
            out.append("b1.rl_tasks_check: no RL arm in arms, so no RL tasks to check B1 on")
    if not 0 < cfg.decision.alpha < 1 or not 0 < cfg.decision.power < 1:
        out.append("decision: alpha and power must lie in (0, 1)")
    if cfg.trajectories < 0:
        out.append("trajectories: not negative")
    if not out:  # the trainer's own checks of every stage the arms will train (their tables need sound arms)
        out += stage_problems(cfg)
    from trajlake.envs import policy_names
    from trajlake.errors import TrajlakeError
    from trajlake.policies.settings import LMSettings

    try:
        scripted = policy_names(cfg.env)
    except TrajlakeError as e:
        out.append(f"env = {cfg.env!r}: {e}")
    else:
        if "B1" in runs and cfg.b1.data_policy not in scripted:
            out.append(f"b1.data_policy = {cfg.b1.data_policy!r}: not a scripted policy of {cfg.env} "
                       f"({', '.join(scripted) or 'none'})")

    try:  # the hf: policy's settings, checked before hours of training (B0's single-turn keys are its own)
        LMSettings.from_args(cfg.policy_args)
    except TrajlakeError as e:
        out.append(f"policy_args: {e}")
    return out


# -- the trainer's tables of the arms ---------------------------------------------------------------------------
#: The arms that train a stage of their own (the others evaluate a checkpoint of these).
TRAINED_ARMS = ("B1", "R1", "R2", "R3", "B1M", "PLACEBO", "MASK")


#: The tiny model's seed of B1's k-th restart is ``seed + RESTART_SEED_STRIDE * k`` (clear of the training seeds).
RESTART_SEED_STRIDE = 1000


def b1_model(cfg: ExperimentConfig, seed: int, restart: int = 0) -> dict[str, Any]:
    """B1's ``[model]`` table: the config's, with the training seed (each seed its own initialisation and tokenizer
    corpus order); restart k of a B1 that stayed on its loss plateau starts from seed ``seed + 1000 k``."""
    return {**dataclasses.asdict(cfg.model), "seed": seed + RESTART_SEED_STRIDE * restart}


def b1_stage(cfg: ExperimentConfig, data_tasks: list[str], *, check: bool = True) -> dict[str, Any]:
    """B1's ``[[stages]]`` table: supervised on ``cfg.b1.data_policy``'s episodes of ``data_tasks``, with the
    plateau check when the config has one and ``check``."""
    stage = {"name": "B1", "kind": "sft", "data_policy": cfg.b1.data_policy, "steps": cfg.b1.steps,
             "batch_size": cfg.b1.batch_size, "lr": cfg.b1.lr, "warmup_steps": cfg.b1.warmup_steps,
             "lr_schedule": cfg.b1.lr_schedule, "min_lr_ratio": cfg.b1.min_lr_ratio,
             "data": {"split": "train", "seeds": "0", "tasks": data_tasks, "workers": cfg.workers,
                      "env_args": dict(cfg.env_args)}}
    if check and cfg.b1.plateau_check is not None:
        stage["plateau_check"] = dataclasses.asdict(cfg.b1.plateau_check)
    return stage


def rl_stage(cfg: ExperimentConfig, arm: str, rl_tasks: list[str], policy_args: dict[str, str]) -> dict[str, Any]:
    """The ``[[stages]]`` table of an RL arm (R1, R2, R3, PLACEBO, MASK) from ``[rl]`` and the arm's own table."""
    rl = cfg.rl
    rollout: dict[str, Any] = {"split": "train", "seeds": "0", "attempts": rl.attempts, "workers": cfg.workers,
                               "tasks": rl_tasks, "policy_args": policy_args, "env_args": dict(cfg.env_args)}
    stage: dict[str, Any] = {"name": arm, "kind": "rl", "algo": rl.algo, "iterations": rl.iterations,
                             "steps": rl.steps, "batch_size": rl.batch_size, "lr": rl.lr,
                             "warmup_steps": rl.warmup_steps, "max_staleness": rl.max_staleness,
                             "ref_kl_coef": rl.ref_kl_coef}
    if arm == "R2":
        stage.update(process_reward=cfg.r2.process_reward, process_weight=cfg.r2.process_weight,
                     process_shaping=cfg.r2.process_shaping)
    if arm == "PLACEBO":
        stage["placebo_shuffle_rewards"] = True
    if arm == "MASK":
        stage["loss_on_observations"] = True
    if arm == "R3":
        stage["fault_rate_schedule"] = list(cfg.r3.fault_rate_schedule)
        rollout["held_out_fault_kind"] = cfg.r3.held_out_fault_kind
        if cfg.r3.fault_kinds:
            rollout["fault_kinds"] = list(cfg.r3.fault_kinds)
    stage["rollout"] = rollout
    return stage


def b1m_stage(cfg: ExperimentConfig, steps: int, data_run: str) -> dict[str, Any]:
    """B1M's table: B1's data run again, at B1's final learning rate, for ``steps`` (matched to R1's tokens)."""
    lr = cfg.b1.lr * (1.0 if cfg.b1.lr_schedule == "constant" else cfg.b1.min_lr_ratio)
    return {"name": "B1M", "kind": "sft", "data_policy": None, "data_runs": [data_run], "steps": steps,
            "batch_size": cfg.b1.batch_size, "lr": lr, "warmup_steps": cfg.b1.warmup_steps}


def rollout_policy_args(cfg: ExperimentConfig) -> dict[str, str]:
    """The hf: policy's settings of every rollout the arms play (one thread per worker unless the config says)."""
    return {"threads": "1", **cfg.policy_args}


def train_table(cfg: ExperimentConfig, *, name: str, seed: int, out_dir: str, run_prefix: str,
                tags: dict[str, str], model: dict[str, Any], stage: dict[str, Any]) -> dict[str, Any]:
    """The trainer's config (``trajlake train``'s TOML, as data) of one arm's stage."""
    return {"name": name, "env": cfg.env, "seed": seed, "device": cfg.device, "temperature": cfg.temperature,
            "lambda_cost": cfg.lambda_cost, "max_length": cfg.max_length,
            "micro_batch_size": cfg.micro_batch_size, "out_dir": out_dir,
            "run_prefix": run_prefix, "tags": tags, "model": model, "stages": [stage]}


def stage_problems(cfg: ExperimentConfig) -> list[str]:
    """The trainer's checks (:func:`trajlake.train.config.config_problems`) of every stage the arms will train,
    built as the experiment builds them (seed 0; task lists, checkpoints and B1M's step count stand in), so that a
    learning rate, clip or sampling setting the trainer refuses stops the experiment before B1 trains, not an
    hour later in R1. Each problem names the arm and the experiment table it came from."""
    out: list[str] = []
    source = {"B1": "[b1]", "B1M": "[b1]"}
    placeholder_tasks = [f"{cfg.env}/task"]
    for arm in cfg.all_arms():
        if arm not in TRAINED_ARMS:
            continue
        if arm == "B1":
            model: dict[str, Any] = b1_model(cfg, 0)
            stage = b1_stage(cfg, placeholder_tasks)
        elif arm == "B1M":
            model, stage = {"path": "B1-checkpoint"}, b1m_stage(cfg, 1, "B1-data")
        else:
            model, stage = {"path": "B1-checkpoint"}, rl_stage(cfg, arm, placeholder_tasks, rollout_policy_args(cfg))
        data = train_table(cfg, name=f"{cfg.name}-s0-{arm}", seed=0, out_dir="out", run_prefix="s0-",
                           tags={"arm": arm}, model=model, stage=stage)
        try:
            problems = config_problems(build_table(TrainConfig, data, where=""))
        except ConfigError as e:
            problems = [str(e)]
        for p in problems:  # "stages[0] (R1).lr = inf: ..." -> "arm R1 (from [rl]): lr = inf: ..."
            p = p.removeprefix(f"stages[0] ({arm})").removeprefix(".").removeprefix(": ")
            p = p.replace("rollout.policy_args.", "policy_args.").removeprefix("rollout.")
            out.append(f"arm {arm} (from {source.get(arm, '[rl]')}): {p}")
    return out


def parse_experiment(data: dict[str, Any], source: str | None = None) -> ExperimentConfig:
    """An ExperimentConfig from parsed TOML, checked (:func:`experiment_problems`)."""
    where = source or "config"
    try:
        cfg: ExperimentConfig = build_table(ExperimentConfig, data, where="")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from e
    cfg = dataclasses.replace(cfg, source=source)
    raise_problems(where, experiment_problems(cfg))
    return cfg


def load_experiment(path: str | Path) -> ExperimentConfig:
    """Read a ``configs/experiment-NAME.toml`` file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the config: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from e
    return parse_experiment(data, str(p))


def config_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as plain data (in summary.json, before anything ran)."""
    return dataclasses.asdict(cfg)


__all__ = ["ARMS", "CONTROL_ARMS", "DERIVED_ARMS", "METRICS", "NEEDS", "B0Settings", "B2Settings", "DecisionRule",
           "ExperimentConfig", "HypothesisSpec", "R2Settings", "R3Settings", "RlSettings", "RlTasksCheck", "SftSettings",
           "config_dict", "experiment_problems", "load_experiment", "parse_experiment"]
