"""The trainer's configuration: one documented dataclass per table of the config file (TOML, or YAML when PyYAML
is installed). ``trajlake train --config FILE`` reads it with :func:`load_config`; an unknown key or a bad value
is one clear error naming the file and the key. See docs/training.md for a full example.

A config has a few top-level keys, a ``[model]`` table and an array of ``[[stages]]``; each stage plays its
rollouts through the rollout runner (``[stages.rollout]``, ``[stages.data]``, ``[stages.eval]``)."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trajlake.errors import ConfigError
from trajlake.policies.tiny import CORPUS_TASKS, HEADS, KV_HEADS, VOCAB_SIZE
from trajlake.train.data.selection import EnvAge

StageKind = Literal["sft", "rl"]
Algorithm = Literal["rloo", "grpo", "ppo"]
STAGE_KINDS = typing.get_args(StageKind)
ALGORITHMS = typing.get_args(Algorithm)
LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
LOSS_AGGREGATIONS = typing.get_args(LossAggregation)
TASK_REWARDS = ("success", "reward_total")
LrSchedule = Literal["constant", "linear", "cosine"]
SafetyViolations = Literal["denials", "executed", "both"]
ProcessShaping = Literal["per_turn", "potential"]
PROCESS_SHAPINGS = typing.get_args(ProcessShaping)
#: ``device`` values: auto, cpu, cuda, cuda:N, mps.
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: the policy the first stage starts from."""

    path: str | None = None
    """A local Hugging Face model folder (weights, tokenizer with a chat template). Relative to the config file."""
    build_tiny: bool = False
    """Build a tiny randomly initialised Llama and tokenizer (``trajlake.policies.tiny``) into
    ``<out_dir>/base`` instead (tests, smoke runs). Exactly one of ``path`` and ``build_tiny``."""
    hidden_size: int = 64
    layers: int = 2
    heads: int = HEADS
    """Attention heads of the tiny model (``hidden_size`` must be a multiple)."""
    kv_heads: int = KV_HEADS
    """Its key/value heads (``heads`` must be a multiple)."""
    max_positions: int = 16384
    """The tiny model's window: Mini SWE's oracle episodes are ~7k tokens in its byte-level vocabulary."""
    seed: int = 0
    tokenizer_env: str | None = None
    """Train the tiny tokenizer on this registered environment's rendered oracle episodes (``python -m
    trajlake.policies.tiny --env``), so its tool calls are a few tokens each; unset: the default tokenizer."""
    vocab_size: int = VOCAB_SIZE
    """The tiny tokenizer's vocabulary size."""
    corpus_tasks: int = CORPUS_TASKS
    """With ``tokenizer_env``: the oracle episodes of this many train tasks make the tokenizer's corpus."""


@dataclass(frozen=True)
class RolloutSpec:
    """Where and how a stage plays episodes into the lake (the rollout runner's settings)."""

    split: str = "train"
    seeds: str = "0"
    """Environment seeds, as ``trajlake rollout --seeds`` reads them (``0-3,7``)."""
    attempts: int = 1
    """Attempts per (task, seed): one GRPO/RLOO group each."""
    tasks: tuple[str, ...] = ()
    """Only these task ids of the split (empty: every task of the split)."""
    workers: int = 1
    policy_args: dict[str, str] = field(default_factory=dict)
    """Settings of the ``hf:`` policy playing the checkpoint (``temperature``, ``max_new_tokens``, ...)."""
    fault_rate: float = 0.0
    """Injected fault rate (the runner's ``--fault-rate``)."""
    fault_kinds: tuple[str, ...] = ()
    """Fault kinds injected (the runner's ``--fault-kinds``; empty: the runner's default kinds)."""
    held_out_fault_kind: str | None = None
    """A fault kind never injected here (``--held-out-fault-kind``): training rollouts leave it out so an
    evaluation run with ``fault_kinds = [K]`` measures recovery on faults never seen in training (H3)."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Environment settings (the runner's ``--env-arg KEY=VALUE``), e.g. ``budget = { max_steps = 10 }``;
    recorded in the run's config."""


@dataclass(frozen=True)
class PlateauCheck:
    """``plateau_check = { step = S, window = W, max_loss = L }`` of an sft stage: after its S-th optimizer step,
    the mean training loss of the last W steps must be at most L, or the stage stops with a
    :class:`~trajlake.errors.PlateauError` and no checkpoint. For a model whose learning comes in a late, seed-dependent
    transition (a tiny model starting to copy codes from a tool's observation: docs/training.md, "Ninth design"),
    it tells a run still on the loss plateau from one past it on the training data alone."""

    step: int
    """Check after this many optimizer steps (at least ``window``, fewer than the stage's ``steps``)."""
    max_loss: float
    """The bar: the mean loss of the window, in the stage's loss units (nats per policy token with token-mean)."""
    window: int = 500
    """Optimizer steps the mean is taken over (the last ones before the check)."""


@dataclass(frozen=True)
class StageConfig:
    """``[[stages]]``: one stage of the experiment (B1, R1, R2, R3). Every run it writes carries ``name`` as
    ``runs.label``; its checkpoint is policy version ``<experiment>-<name>``."""

    name: str
    kind: StageKind
    """``sft``: supervised on successful trajectories from the lake (B1). ``rl``: iterations of rollout with the
    current policy, then policy-gradient updates on the episodes within ``max_staleness`` (R1-R3)."""
    # -- sft ---------------------------------------------------------------------------------------------------
    data_policy: str | None = "oracle"
    """sft: a scripted policy of the environment played into the lake for the stage's data (run
    ``<prefix><name>-data``); None: train on ``data_runs`` only."""
    data_runs: tuple[str, ...] = ()
    """sft: further runs already in the lake to train on."""
    success_only: bool = True
    """sft: train only on successful episodes."""
    data: RolloutSpec = field(default_factory=RolloutSpec)
    """sft: where the data policy plays."""
    plateau_check: PlateauCheck | None = None
    """sft: stop the stage (no checkpoint) if its training loss has not fallen below a bar by a given step
    (:class:`PlateauCheck`). None: no check."""
    # -- rl ----------------------------------------------------------------------------------------------------
    algo: Algorithm = "rloo"
    """rl: advantage estimator: ``rloo`` (19.7), ``grpo`` (group-normalised) or ``ppo`` (a value head and GAE
    over environment turns, 19.4)."""
    iterations: int = 1
    """rl: rollout-then-update iterations; each publishes a new policy version."""
    rollout: RolloutSpec = field(default_factory=lambda: RolloutSpec(attempts=4))
    max_staleness: int = 0
    """rl: train on episodes played by the learner's version or up to this many versions before it (their
    staleness: versions behind the learner now); older ones are left out. Episodes from older versions are
    corrected with the truncated trajectory ratio. Formerly ``max_policy_lag``, still read as a deprecated alias
    (docs/names.md)."""
    max_env_age: EnvAge | None = None
    """rl: the trajectory TTL, ``{ seconds = S, versions = N }`` (either may be left out): an episode enters a batch
    only if it ended at most S seconds before the iteration's selection and its environment version is at most N
    versions behind the environment now running (the order: the lake's first sight of each version). None: no
    TTL."""
    async_rollouts: bool = False
    """rl: the asynchronous trainer. An actor thread plays the iterations' rollouts while the learner updates:
    rollout k starts as soon as rollout k-1 is written and the learner has published the version k-1-max_staleness,
    and plays the newest published version then; the learner trains iteration k as soon as rollout k is written.
    So actors play version v while the learner makes v+1 (real lag: the runner records ``policy_lag`` > 0 for
    episodes that start after the learner published a newer version). Not reproducible run to run (timing decides
    which version a rollout plays); ``fixed_staleness`` is the reproducible mode. One process only (not under
    ``torchrun``). False: the synchronous loop."""
    turn_upgrades: bool = False
    """rl, with ``async_rollouts``: an episode of the actor's rollouts may switch to a newer version at a turn
    boundary (the runner's ``turn_upgrades``): when the learner publishes a version during an episode, the next
    policy turn is played by it. Each policy turn records its version (``turns.policy_version``); the episode's
    staleness is counted by its first (oldest) version, and each token's ratio against its own segment's
    behaviour log-prob (docs/training.md, "Asynchrony")."""
    partial_rollouts: bool = False
    """rl, with ``turn_upgrades``: an episode whose version switched at a turn boundary is a partial rollout: the
    turns before its last switch are the old prefix, treated as off-policy state (their tokens get loss mask 0:
    context, not trained on, outside the ratios and the trajectory weight), and its staleness is counted by the
    version that played the continuation (``policy_version_end``). False: every segment is trained, each token
    against its own segment's behaviour log-prob."""
    fixed_staleness: int | None = None
    """rl: the deterministic staleness mode: iteration k plays its rollout with the version the learner had
    ``fixed_staleness`` updates before (the stage's first version while fewer exist) and trains only on that
    rollout, so from iteration ``fixed_staleness`` + 1 on every trained episode is exactly that many versions old
    (iteration k <= fixed_staleness: k-1). Reproducible on any machine; ``max_staleness`` must be at least it.
    None: off. Not with ``async_rollouts``."""
    process_reward: str | None = None
    """rl (R2): a process reward from ``trajlake.evaluators.process_rewards`` (``grounded_progress``,
    ``lookup_progress``), credited turn by turn: each lake turn's value goes to the policy turn whose action earned
    it and enters the return there (19.3), weighted by ``process_weight``; the advantages become per turn
    (docs/training.md, "R2: credit per turn")."""
    process_weight: float = 1.0
    """rl (R2): the weight of ``process_reward`` in the return."""
    process_shaping: ProcessShaping = "per_turn"
    """rl (R2): how the process reward enters the return. ``per_turn``: p_k, the weighted process reward earned at
    policy turn k, is added to turn k's reward. ``potential``: potential-based shaping with Phi = the weighted
    process reward earned before turn k, F_k = gamma * Phi(h_{k+1}) - Phi(h_k), and the terminal correction (Phi at
    the episode's end taken as 0), so every episode's shaped return G_0 equals its unshaped one (Phi(h_0) = 0): the
    process reward moves credit between turns but does not change the objective."""
    fault_rate_schedule: tuple[float, ...] = ()
    """rl (R3): the fault curriculum: iteration i plays with fault rate ``fault_rate_schedule[min(i, n-1)]``
    (rising rates); empty: ``rollout.fault_rate`` throughout."""
    ref_kl_coef: float = 0.0
    """rl: weight beta of a KL penalty to the stage's starting policy pi_ref (B1 for R1): beta times the token mean
    over the policy tokens of k2 = (log pi - log pi_ref)^2 / 2, whose gradient on the policy's own samples is that
    of KL(pi || pi_ref) (docs/training.md, "The loss"). It holds the policy near where the stage began unless the
    reward pays for moving; logged as ``kl_ref``. 0: none (no reference copy is kept)."""
    # -- controls of an experiment (never for a real run) -------------------------------------------------------
    placebo_shuffle_rewards: bool = False
    """rl, placebo control: shuffle the returns among the members of each group before the advantages (seeded by
    the experiment's seed and the iteration), so the update has R1's shape and noise but no information about
    which attempt did better. A gain that survives it is not the reward's."""
    loss_on_observations: bool = False
    """rl, mask ablation (pitfall 19.6): also put the policy-gradient loss on the tokens after the first policy
    turn that the policy did not produce (tool observations and chat-template glue), as a trainer with a wrong
    loss mask would; their ratio is taken as 1 (they have no behaviour log-probs)."""
    # -- both --------------------------------------------------------------------------------------------------
    steps: int = 10
    """Optimizer steps (sft: in total; rl: per iteration)."""
    batch_size: int = 4
    """Sequences per optimizer step (across data-parallel ranks: each rank takes its share)."""
    lr: float = 1e-3
    """Peak learning rate of the stage's AdamW. Every stage starts a fresh AdamW (its moment estimates are not
    carried over from the previous stage), so its first step moves each weight by about ``lr`` whatever the
    gradient's scale: ``warmup_steps`` keeps those first steps small."""
    warmup_steps: int = 0
    """Linear warm-up from ``lr / (warmup_steps + 1)`` to ``lr`` over the stage's first optimizer steps (rl: counted
    over all its iterations)."""
    lr_schedule: LrSchedule = "constant"
    """After warm-up: ``constant``, or ``linear`` / ``cosine`` decay to ``lr * min_lr_ratio`` at the stage's last
    step."""
    min_lr_ratio: float = 0.0
    """Where ``linear`` and ``cosine`` decay end, as a fraction of ``lr``."""
    eval: RolloutSpec | None = None
    """Play the stage's final checkpoint here as run ``<prefix><name>`` (e.g. the hidden split), for
    ``trajlake eval --baseline B1 --candidate R1``. None: no evaluation run."""


@dataclass(frozen=True)
class TrainConfig:
    """The whole experiment: top-level keys of the config file."""

    name: str
    """Experiment name: the policy name its versions are published under, and the prefix of its versions."""
    env: str = "mini-swe"
    out_dir: str = "train-out"
    """Checkpoints (``<out_dir>/<stage>``, Hugging Face format) and the training log. Relative to the config
    file's folder unless absolute."""
    tags: dict[str, str] = field(default_factory=dict)
    """Free labels recorded in the ``runs.config.tags`` of every rollout the trainer plays (``trajlake experiment``
    names its experiment, arm and training seed there); the stage runs record them with the whole config."""
    run_prefix: str = ""
    """Prefix of every run id the trainer writes (runs are ``<prefix><stage>``, ``<prefix><stage>-data``,
    ``<prefix><stage>-it<k>``, ``<prefix><stage>.train``)."""
    seed: int = 0
    device: str = "auto"
    """``auto`` (CUDA when present, else CPU), ``cpu`` or ``cuda``. CUDA trains under bf16 autocast."""
    max_length: int = 16384
    """Samples longer than this are skipped (and counted in the log), never cut."""
    micro_batch_size: int = 0
    """Samples per forward and backward pass (each rank's share of a stage's ``batch_size``). 0: the whole
    batch in one pass. N: the batch is padded and run N samples at a time, the gradients accumulate, and one
    optimizer step follows: the same update as one pass up to float rounding (every loss term is normalised by
    the whole batch's count), with the memory of N samples. A model with a large vocabulary on long episodes
    needs it: the float32 logits alone of 32 episodes of 5,000 tokens under a 49,152-token vocabulary are 31 GB."""
    shuffle: bool = True
    """Shuffle the samples of each stage (and RL iteration) every epoch, seeded by ``seed``: episodes come out of a
    lake in its order (one run, one task family after another). Each data-parallel rank shuffles its own shard,
    so N ranks make the same update as one process in distribution; ``false`` gives the lake's order and
    bit-for-bit the update of one process on the same global batch."""
    loss_aggregation: LossAggregation = "token-mean"
    """Masked-loss normalisation (19.6): ``token-mean`` over the global batch's policy tokens,
    ``seq-mean-token-mean`` or ``seq-mean-token-sum``."""
    temperature: float = 1.0
    """The temperature the rollouts sample with; the trainer's log-probs divide logits by it (so the ratio
    compares like with like)."""
    gamma: float = 1.0
    gae_lambda: float = 0.95
    task_reward: str = "success"
    """R_task of 19.3: ``success`` (1/0; ungraded counts 0) or ``reward_total``."""
    lambda_cost: float = 0.0
    """lambda_c of 19.3: weight of the episode's ``cost_usd``."""
    lambda_safety: float = 0.0
    """lambda_s of 19.3: weight of the episode's safety violations (counted as ``safety_violations`` says)."""
    safety_violations: SafetyViolations = "denials"
    """What V of 19.3 counts per episode: ``denials`` (gateway calls denied: attempted violations),
    ``executed`` (violations that took effect: the attacker's goal achieved, ``attack_success``, plus
    irreversible calls the gateway let run while untrusted text was in the context, ``executed`` with a taint), or
    ``both`` (their sum)."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    policy_loss: Literal["clip", "reinforce"] = "clip"
    """``clip``: the clipped surrogate against the behaviour log-probs (PPO/GRPO style). ``reinforce``: plain
    REINFORCE with the baseline already in the advantage (19.2), every episode weighted by its truncated
    trajectory ratio min(rho, c) (after the first update of an iteration every episode is slightly off-policy)."""
    ratio_level: Literal["token", "sequence"] = "token"
    is_max_weight: float = 2.0
    """Truncation c of the trajectory-level importance weight min(rho, c) for off-policy episodes (lag > 0)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the behaviour policy in the loss (0: logged only)."""
    value_coef: float = 0.5
    grad_clip: float = 1.0
    model: ModelConfig = field(default_factory=ModelConfig)
    stages: tuple[StageConfig, ...] = ()
    source: str | None = None
    """The config file this was read from (set by ``load_config``)."""

    def resolve(self, path: str) -> Path:
        """A path of the config, relative to the config file's folder."""
        p = Path(path)
        if p.is_absolute() or self.source is None:
            return p
        return Path(self.source).parent / p


#: Deprecated keys still read, per table: old name -> new name (docs/names.md).
RENAMED_KEYS: dict[type, dict[str, str]] = {StageConfig: {"max_policy_lag": "max_staleness"}}


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _renamed(cls: type[Any], data: Mapping[str, Any], where: str, notes: list[str]) -> Mapping[str, Any]:
    """``data`` with ``cls``'s deprecated keys under their new names (a note for each); the old and the new
    key both given with different values is a ConfigError."""
    for old, new in RENAMED_KEYS.get(cls, {}).items():
        if old not in data:
            continue
        if new in data and data[new] != data[old]:
            raise ConfigError(f"{_key(where, old)} = {data[old]!r} and {_key(where, new)} = {data[new]!r} differ: "
                              f"{old} is the deprecated name of {new}, give only {new}")
        notes.append(f"{_key(where, old)} is deprecated, read as {new} (rename it; docs/names.md)")
        data = {new: data[old], **{k: v for k, v in data.items() if k != old}}
    return data


def _build(cls: type[Any], data: Mapping[str, Any], where: str, notes: list[str]) -> Any:
    """``cls`` from a mapping: unknown keys and wrong types are a ConfigError naming the key path ``where``;
    deprecated keys are renamed with a line in ``notes``."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'the config'}: expected a table, got {type(data).__name__}")
    data = _renamed(cls, data, where, notes)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where or 'top level'}: unknown key(s) {', '.join(unknown)}; known: "
                          f"{', '.join(sorted(fields))}")
    kw: dict[str, Any] = {}
    for key, value in data.items():
        kw[key] = _coerce(hints[key], value, _key(where, key), notes)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in kw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where or 'top level'}: missing key(s) {', '.join(missing)}")
    return cls(**kw)


def _coerce(hint: Any, value: Any, where: str, notes: list[str]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where, notes)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list")
        return tuple(_coerce(args[0], v, f"{where}[{i}]", notes) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table")
        keep = args and args[1] is Any  # env_args keep their values; policy_args are KEY=VALUE strings
        return {str(k): v if keep else str(v) for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, where, notes)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and not (isinstance(value, hint) and not (hint is int and isinstance(value, bool))):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def build_table(cls: type[Any], data: Mapping[str, Any], *, where: str = "") -> Any:
    """A config dataclass ``cls`` from a parsed table, with this module's checks (unknown keys, types, nested
    tables, deprecated names noted on stderr); other configs (``trajlake experiment``) read theirs with it."""
    notes: list[str] = []
    out = _build(cls, data, where, notes)
    for note in notes:
        print(note, file=sys.stderr)
    return out


def parse_config(data: Mapping[str, Any], source: str | None = None) -> TrainConfig:
    """A TrainConfig from parsed TOML/YAML; checks the values that types cannot. A deprecated key is read under
    its new name with a one-line note on stderr."""
    where = source or "config"
    notes: list[str] = []
    try:
        cfg: TrainConfig = _build(TrainConfig, data, "", notes)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from e
    for note in notes:
        print(f"{where}: {note}", file=sys.stderr)
    cfg = dataclasses.replace(cfg, source=source)
    raise_problems(where, config_problems(cfg))
    return cfg


def raise_problems(where: str, problems: list[str]) -> None:
    """One ConfigError naming the config and its first problem (and how many more), when there are any."""
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise ConfigError(f"{where}: {problems[0]}{more}")


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _float_arg(args: Mapping[str, str], key: str) -> float | None:
    """A numeric policy setting of a rollout table (None when absent or not a number: LMSettings says why)."""
    try:
        return float(args[key]) if key in args else None
    except ValueError:
        return None


def config_problems(cfg: TrainConfig) -> list[str]:
    """What in ``cfg`` cannot work, each as ``key: why`` (the caller adds the file): checked before any file is
    written, since a bad value found later leaves a half-written output folder and lake behind."""
    out: list[str] = []
    m = cfg.model
    if m.build_tiny == (m.path is not None):
        out.append("[model]: needs exactly one of path = FOLDER and build_tiny = true")
    if m.build_tiny:
        for key in ("hidden_size", "layers", "heads", "kv_heads", "max_positions", "vocab_size", "corpus_tasks"):
            if getattr(m, key) <= 0:
                out.append(f"model.{key} = {getattr(m, key)}: must be > 0")
        if m.heads > 0 and m.hidden_size % m.heads:
            out.append(f"model.hidden_size = {m.hidden_size}: must be a multiple of model.heads = {m.heads}")
        if m.kv_heads > 0 and m.heads % m.kv_heads:
            out.append(f"model.heads = {m.heads}: must be a multiple of model.kv_heads = {m.kv_heads}")
    if cfg.task_reward not in TASK_REWARDS:
        out.append(f"task_reward: must be one of {', '.join(TASK_REWARDS)}")
    if not _DEVICE.fullmatch(cfg.device):
        out.append(f"device = {cfg.device!r}: not a device (auto, cpu, cuda, cuda:N or mps)")
    if not _finite(cfg.temperature) or cfg.temperature < 0:
        out.append(f"temperature = {cfg.temperature}: must be a finite number >= 0")
    elif cfg.temperature == 0 and any(s.kind == "rl" for s in cfg.stages):
        out.append("temperature = 0: training rollouts must sample (temperature > 0); greedy decoding has no "
                   "log-probabilities to learn from (set an evaluation's policy_args.temperature = 0 instead)")
    if not (_finite(cfg.clip_low) and _finite(cfg.clip_high) and 0 <= cfg.clip_low < 1 and cfg.clip_high >= 0):
        out.append(f"clip_low = {cfg.clip_low}, clip_high = {cfg.clip_high}: the clip range [1 - clip_low, "
                   f"1 + clip_high] needs 0 <= clip_low < 1 and clip_high >= 0")
    if math.isnan(cfg.grad_clip) or cfg.grad_clip < 0:
        out.append(f"grad_clip = {cfg.grad_clip}: must be >= 0 (0: no clipping)")
    if not _finite(cfg.is_max_weight) or cfg.is_max_weight <= 0:
        out.append(f"is_max_weight = {cfg.is_max_weight}: must be a finite number > 0")
    for key in ("gamma", "gae_lambda"):
        v = getattr(cfg, key)
        if not (_finite(v) and 0 <= v <= 1):
            out.append(f"{key} = {v}: must lie in [0, 1]")
    for key in ("lambda_cost", "lambda_safety", "kl_coef", "value_coef"):
        v = getattr(cfg, key)
        if not _finite(v) or v < 0:
            out.append(f"{key} = {v}: must be a finite number >= 0")
    if cfg.max_length <= 0:
        out.append(f"max_length = {cfg.max_length}: must be > 0")
    if cfg.micro_batch_size < 0:
        out.append(f"micro_batch_size = {cfg.micro_batch_size}: must be >= 0 (0: the whole batch in one pass)")
    if not cfg.stages:
        out.append("no [[stages]]")
    names = [s.name for s in cfg.stages]
    if len(set(names)) != len(names):
        out.append(f"stage names repeat: {', '.join(names)}")
    for i, s in enumerate(cfg.stages):
        at = f"stages[{i}] ({s.name})"
        if s.steps < 0 or s.batch_size < 1 or s.iterations < 1:
            out.append(f"{at}: steps >= 0, batch_size >= 1 and iterations >= 1")
        if not _finite(s.lr) or s.lr <= 0:
            out.append(f"{at}.lr = {s.lr}: must be a finite number > 0")
        if s.warmup_steps < 0:
            out.append(f"{at}.warmup_steps = {s.warmup_steps}: must be >= 0")
        if not _finite(s.ref_kl_coef) or s.ref_kl_coef < 0:
            out.append(f"{at}.ref_kl_coef = {s.ref_kl_coef}: must be a finite number >= 0")
        elif s.ref_kl_coef and s.kind != "rl":
            out.append(f"{at}.ref_kl_coef: only an rl stage has a KL penalty to its start (this one is {s.kind})")
        if not (_finite(s.min_lr_ratio) and 0 <= s.min_lr_ratio <= 1):
            out.append(f"{at}.min_lr_ratio = {s.min_lr_ratio}: must lie in [0, 1]")
        if s.plateau_check is not None:
            out.extend(f"{at}.plateau_check: {p}" for p in plateau_check_problems(s.plateau_check, s.kind, s.steps))
        if s.max_staleness < 0:
            out.append(f"{at}.max_staleness = {s.max_staleness}: must be >= 0")
        if s.fixed_staleness is not None:
            if s.fixed_staleness < 0:
                out.append(f"{at}.fixed_staleness = {s.fixed_staleness}: must be >= 0")
            elif s.fixed_staleness > s.max_staleness:
                out.append(f"{at}.fixed_staleness = {s.fixed_staleness}: max_staleness = {s.max_staleness} would "
                           f"leave its episodes out; set max_staleness >= {s.fixed_staleness}")
            if s.async_rollouts:
                out.append(f"{at}: fixed_staleness and async_rollouts are two modes; give one")
        if s.partial_rollouts and not s.turn_upgrades:
            out.append(f"{at}.partial_rollouts: only with turn_upgrades = true (no episode switches versions "
                       f"otherwise)")
        if s.turn_upgrades and not s.async_rollouts:
            out.append(f"{at}.turn_upgrades: only with async_rollouts = true (no version is published during a "
                       f"rollout otherwise)")
        age = s.max_env_age
        if age is not None:
            if age.seconds is not None and not (_finite(age.seconds) and age.seconds >= 0):
                out.append(f"{at}.max_env_age.seconds = {age.seconds}: must be a finite number >= 0")
            if age.versions is not None and age.versions < 0:
                out.append(f"{at}.max_env_age.versions = {age.versions}: must be >= 0")
        if s.kind == "sft" and s.data_policy is None and not s.data_runs:
            out.append(f"{at}: an sft stage needs data_policy or data_runs")
        if s.kind == "rl" and s.algo in ("rloo", "grpo") and s.rollout.attempts < 2:
            out.append(f"{at}.rollout.attempts = {s.rollout.attempts}: {s.algo} needs groups (attempts >= 2)")
        if s.process_reward is not None and s.process_reward not in PROCESS_REWARDS:
            out.append(f"{at}: process_reward must be one of {', '.join(PROCESS_REWARDS)}")
        if any(not 0 <= r <= 1 for r in s.fault_rate_schedule):
            out.append(f"{at}.fault_rate_schedule: values must lie in [0, 1]")
        specs = [("rollout", s.rollout)] if s.kind == "rl" else [("data", s.data)]
        out += [f"{at}.{name}.{p}" for name, spec in specs for p in _training_sampling_problems(cfg, spec)]
        if s.eval is not None:
            out += [f"{at}.eval.{p}" for p in _sampling_problems(s.eval)]
    return out


def plateau_check_problems(check: PlateauCheck, kind: str, steps: int) -> list[str]:
    """What is wrong with ``check`` on a stage of ``kind`` with ``steps`` optimizer steps (one phrase each)."""
    out = []
    if kind != "sft":
        out.append(f"only an sft stage has a plateau check (this one is {kind})")
    if check.window < 1:
        out.append(f"window = {check.window}: must be >= 1")
    if not check.window <= check.step < steps:
        out.append(f"step = {check.step}: must lie in [window, steps) = [{check.window}, {steps})")
    if not _finite(check.max_loss) or check.max_loss <= 0:
        out.append(f"max_loss = {check.max_loss}: must be a finite number > 0")
    return out


def _sampling_problems(spec: RolloutSpec) -> list[str]:
    """Sampling settings no rollout can use (any rollout, evaluations included)."""
    out = []
    for key in ("temperature", "top_p"):
        v = _float_arg(spec.policy_args, key)
        if v is not None and math.isnan(v):
            out.append(f"policy_args.{key} = nan: not a number")
    return out


def _training_sampling_problems(cfg: TrainConfig, spec: RolloutSpec) -> list[str]:
    """Sampling settings of a training rollout that the learner does not reproduce: its log-probs divide the
    logits by ``cfg.temperature`` and apply no top-p filter, so another temperature or a top-p < 1 would make
    every importance ratio compare two different distributions."""
    out = _sampling_problems(spec)
    temperature = _float_arg(spec.policy_args, "temperature")
    if temperature is not None and not math.isnan(temperature) and temperature != cfg.temperature:
        out.append(f"policy_args.temperature = {temperature}: training rollouts sample at the learner's temperature "
                   f"({cfg.temperature}, the top-level key temperature); drop it or set temperature = {temperature}")
    top_p = _float_arg(spec.policy_args, "top_p")
    if top_p is not None and not math.isnan(top_p) and top_p < 1:
        out.append(f"policy_args.top_p = {top_p}: the learner re-scores without a top-p filter, so training "
                   f"rollouts must sample with top_p = 1")
    return out


#: Process rewards a stage may name (functions of ``trajlake.evaluators.process_rewards``; only sound ones).
PROCESS_REWARDS = ("grounded_progress", "lookup_progress")


def load_config(path: str | Path) -> TrainConfig:
    """Read a ``.toml``, ``.yaml`` or ``.yml`` training config."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the config: {e.strerror or e}") from e
    if p.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as e:
            raise ConfigError(f"{p}: YAML configs need PyYAML (pip install pyyaml), or use TOML") from e
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from e
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from e
    return parse_config(data or {}, str(p))


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as plain data (recorded in each stage's ``runs.config``)."""
    return dataclasses.asdict(cfg)


__all__ = ["ALGORITHMS", "PROCESS_REWARDS", "PROCESS_SHAPINGS", "RENAMED_KEYS", "STAGE_KINDS", "ConfigError", "ModelConfig", "PlateauCheck", "RolloutSpec",
           "StageConfig", "TrainConfig", "build_table", "config_dict", "config_problems", "load_config", "parse_config",
           "raise_problems"]
