"""The training loop, top to bottom: stages B1 (supervised), R1/R2/R3 (policy gradient), each ending in a
checkpoint that is registered in ``runs`` and played back into the lake through the rollout runner.

Read :func:`train` first. The math lives in ``trajlake.train.math`` (pure, unit-tested), reading the lake in
``trajlake.train.data``; this module only wires them: which episodes, which advantages, which loss, when to save.

Versions, lag and staleness. Every checkpoint is a policy version ``<experiment>-<stage>`` (an RL stage's
intermediate iterations are ``<experiment>-<stage>.<k>``), published in order with ``PolicyVersions`` under the
experiment's name. Rollouts pin the version they play (episode-sticky); the runner records each episode's
``policy_lag`` (versions behind the newest published one when the episode started). An RL iteration trains on
the episodes of this stage's rollouts whose staleness (versions behind the learner now) is at most
``max_staleness`` (and, with ``max_env_age``, young enough by time and environment version); the log records each
step's staleness, recorded lag and age, and episodes with staleness > 0 are corrected by decoupled PPO (19.5).
Three schedules (docs/training.md, "Asynchrony"): synchronous (each iteration plays the learner's version, then
trains), ``async_rollouts`` (an actor thread plays the next rollouts while the learner trains: real lag) and
``fixed_staleness = k`` (iteration i plays the version of k updates before: reproducible lag).

Data parallel. Under ``torchrun`` (``WORLD_SIZE`` > 1) every rank reads its own shard of the episodes, the
token-mean denominator is the global policy-token count (all-reduced), and gradients are summed across ranks
with ``torch.distributed.all_reduce`` before each step, so the update equals one big batch's. Rank 0 alone plays
rollouts, writes the lake and saves checkpoints; the others wait at a barrier.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as dt
import functools
import hashlib
import itertools
import json
import math
import os
import random
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import torch.distributed as tdist
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from trajlake.envs import list_tasks, policy_names, registry
from trajlake.errors import ConfigError, LakeNotFoundError, PlateauError, TrainError, TrajlakeError, one_line
from trajlake.evaluators import process_rewards
from trajlake.lake.store import Lake
from trajlake.policies import checkpoint_hash
from trajlake.policies.settings import LMSettings
from trajlake.policies.tiny import build_tiny_model
from trajlake.provenance import code_version
from trajlake.query import connect
from trajlake.record.episode import CostModel, utcnow
from trajlake.record.writer import LakeWriter
from trajlake.rollout.faults import DEFAULT_FAULT_KINDS, fault_rate_at
from trajlake.rollout.preflight import oracle_call_tokens
from trajlake.rollout.runner import RolloutConfig, parse_seeds, run_rollout
from trajlake.rollout.versions import PolicyVersions
from trajlake.schemas.vocab import Decision, ErrorClass, SideEffectClass
from trajlake.train import math as tm
from trajlake.train.config import PlateauCheck, RolloutSpec, StageConfig, TrainConfig, config_dict
from trajlake.train.data import (
    BatchGrammarMasks,
    LakeTrajectories,
    Selection,
    pad_collate,
    select_episodes,
    staleness_of,
)
from trajlake.train.data.selection import env_version_ages, env_versions_in_lake_order, pinned_versions

Log = Callable[[str], None]


# -- the process group ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dist:
    """Rank and world size of this process (1 process: rank 0 of 1)."""

    rank: int = 0
    world: int = 1
    owns_group: bool = False
    """This process joined the process group in :func:`init_distributed` (and leaves it in :func:`leave_distributed`)."""

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> Dist:
    """Join the ``torchrun`` process group when ``WORLD_SIZE`` > 1 (gloo on CPU, NCCL on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    owns = not tdist.is_initialized()
    if owns:
        tdist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return Dist(tdist.get_rank(), tdist.get_world_size(), owns)


def leave_distributed(dist: Dist) -> None:
    """After a last barrier, leave the process group this process joined. Left to interpreter exit, its threads
    may be torn down while another rank is still closing its connections ("terminate called without an active
    exception", SIGABRT of one rank after a successful run: seen once under load in the two-process test)."""
    if dist.owns_group and tdist.is_initialized():
        tdist.barrier()
        tdist.destroy_process_group()


def _barrier(dist: Dist) -> None:
    if dist.world > 1:
        tdist.barrier()


def _pin(dist: Dist, lake: str) -> dict[str, int]:
    """Every table's current version as rank 0 sees it, shared with every rank: all ranks read one snapshot."""
    pin = Lake.open(lake).versions() if dist.main else {}
    if dist.world == 1:
        return pin
    box: list[Any] = [pin]
    tdist.broadcast_object_list(box, src=0)
    return dict(box[0])


def _all_sum(dist: Dist, value: float) -> float:
    if dist.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    tdist.all_reduce(t)
    return float(t.item())


# -- the learner ---------------------------------------------------------------------------------------------
class Learner:
    """The model being trained, its optimizer and (for PPO) a value head on the last hidden state.

    Every stage makes a fresh Learner and a fresh AdamW: the moment estimates of the previous stage are not
    carried over. Adam's first step moves each weight by about the learning rate whatever the gradient's scale,
    which the stage's ``warmup_steps`` keep small. Non-finite numbers are fatal: a loss, gradient norm or weight
    that is not finite stops the stage (``TrainError``) before the step is taken or the checkpoint is saved."""

    def __init__(self, model_path: Path, device: str, dist: Dist, *, value_head: bool = False):
        self.device = device
        self.dist = dist
        loaded: Any = AutoModelForCausalLM.from_pretrained(str(model_path), local_files_only=True,
                                                           dtype=torch.float32)
        self.model: Any = loaded.to(device)
        self.model_path = model_path
        hidden = int(self.model.config.hidden_size)
        self.value_head: Any = torch.nn.Linear(hidden, 1).to(device) if value_head else None
        if self.value_head is not None and (model_path / "value_head.pt").is_file():
            self.value_head.load_state_dict(torch.load(model_path / "value_head.pt", map_location=device))
        self.optimizer: Any = None
        self._accumulating = False
        """Gradients have been added since the last optimizer step (micro-batches of one step)."""
        self.lr = 0.0
        self.where = ""
        """Stage, iteration and step being trained, for the errors."""
        self.proximal: Any = None
        """A frozen copy of the model at the start of the RL iteration (decoupled PPO's pi_prox), when stale
        episodes need its log-probs."""
        self.reference: Any = None
        """A frozen copy of the model at the start of the RL stage (pi_ref of ``ref_kl_coef``), when the stage
        has a KL penalty to it."""
        self.tokens_trained_through = 0
        """Tokens (attention mask 1) of this rank's training forward passes, each followed by a backward: the
        basis of the stage's FLOP estimate (``training_compute``)."""

    def parameters(self) -> list[Any]:
        params = list(self.model.parameters())
        return params + (list(self.value_head.parameters()) if self.value_head is not None else [])

    def new_optimizer(self, lr: float) -> None:
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.0)
        self.lr = lr

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next optimizer step (the stage's schedule)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.lr = lr

    def _frozen_copy(self) -> Any:
        frozen = copy.deepcopy(self.model).eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
        return frozen

    def freeze_proximal(self) -> None:
        """Keep a copy of the current weights as the proximal policy of this RL iteration."""
        self.proximal = self._frozen_copy()

    def freeze_reference(self) -> None:
        """Keep a copy of the current weights (the RL stage's start) as the reference policy of its KL penalty."""
        self.reference = self._frozen_copy()

    def proximal_logprobs(self, batch: dict[str, Any], temperature: float) -> Any:
        """Token log-probs of the batch under the proximal policy (no gradient)."""
        return self._frozen_logprobs(self.proximal, batch, temperature)

    def reference_logprobs(self, batch: dict[str, Any], temperature: float) -> Any:
        """Token log-probs of the batch under the reference policy (no gradient), under the same grammar masks."""
        return self._frozen_logprobs(self.reference, batch, temperature)

    def _frozen_logprobs(self, model: Any, batch: dict[str, Any], temperature: float) -> Any:
        ids = batch["input_ids"].to(self.device)
        attn = batch["attention_mask"].to(self.device)
        with torch.no_grad(), self._autocast():
            logits = model(input_ids=ids, attention_mask=attn).logits.float()
        return self._logprobs(logits, ids, temperature, batch.get("grammar_masks"))

    def _logprobs(self, logits: Any, ids: Any, temperature: float, masks: Any) -> Any:
        """Token log-probs as the sampler drew them: under the replayed grammar masks for the tokens of
        constrained turns (``BatchGrammarMasks``), so ratios compare like with like."""
        if masks is None:
            return tm.token_logprobs(logits, ids, temperature)
        return tm.masked_token_logprobs(logits, ids, temperature, masks.positions.to(self.device),
                                        masks.allowed.to(self.device))

    def _autocast(self) -> Any:
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.device.startswith("cuda") \
            else contextlib.nullcontext()

    def forward(self, batch: dict[str, Any], temperature: float) -> dict[str, Any]:
        """Token log-probs and entropies (aligned: position t scores token t), and the last hidden states when
        a value head exists."""
        ids = batch["input_ids"].to(self.device)
        attn = batch["attention_mask"].to(self.device)
        if torch.is_grad_enabled():
            self.tokens_trained_through += int(attn.sum())
        with self._autocast():
            out = self.model(input_ids=ids, attention_mask=attn, output_hidden_states=self.value_head is not None)
        logits = out.logits.float()
        result = {"logp": self._logprobs(logits, ids, temperature, batch.get("grammar_masks"))}
        # the entropy is a logged statistic only (read detached, its mean over the policy tokens): no autograd
        # graph, and no vocabulary-sized work at the positions the loss mask leaves out
        with torch.no_grad():
            result["entropy"] = tm.entropy_from_logits(logits, temperature, batch.get("loss_mask"))
        if self.value_head is not None:
            result["values"] = self.value_head(out.hidden_states[-1].float()).squeeze(-1)
        return result

    def zero_loss(self) -> Any:
        """A loss of 0 connected to every parameter: a rank with an empty shard still joins the gradient sum."""
        return sum(p.sum() * 0.0 for p in self.parameters())

    def backward(self, loss: Any) -> None:
        """Add a (micro-)batch's loss to the gradients of the next :meth:`apply`; the first call after a step
        starts from zero gradients. A non-finite loss raises before it is added."""
        if not bool(torch.isfinite(loss.detach()).all()):
            raise TrainError(f"{self.where}: the loss is not finite ({float(loss.detach())}); lower lr or check "
                             f"the rewards (nothing of this step was applied)")
        if not self._accumulating:
            self.optimizer.zero_grad(set_to_none=False)
            self._accumulating = True
        loss.backward()

    def apply(self, grad_clip: float) -> float:
        """Sum the accumulated gradients across ranks, clip, step. Returns the gradient norm. A non-finite
        gradient norm raises before the weights change; non-finite weights after the step raise too."""
        self._accumulating = False
        params = [p for p in self.parameters() if p.requires_grad]
        if self.dist.world > 1:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                tdist.all_reduce(p.grad)
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip) if grad_clip > 0 else \
            torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        if not math.isfinite(float(norm)):
            raise TrainError(f"{self.where}: the gradient norm is not finite ({float(norm)}); lower lr or check the "
                             f"rewards (nothing of this step was applied)")
        self.optimizer.step()
        bad = self.non_finite()
        if bad:
            raise TrainError(f"{self.where}: the weights are not finite after the step ({bad}); lower lr")
        return float(norm)

    def step(self, loss: Any, grad_clip: float) -> float:
        """:meth:`backward` then :meth:`apply`: one optimizer step on one batch's loss."""
        self.backward(loss)
        return self.apply(grad_clip)

    def non_finite(self) -> str | None:
        """Names the first parameter tensor holding a NaN or an infinity, with how many do (None: all finite)."""
        names = [(n, p) for n, p in self.model.named_parameters()]
        if self.value_head is not None:
            names += [(f"value_head.{n}", p) for n, p in self.value_head.named_parameters()]
        # Every step: one fused pass and one host sync for all tensors, not one sync per tensor (272 for a 30-layer
        # model, each a round trip on a GPU). A tensor's largest magnitude is inf or NaN exactly when it holds an
        # inf or a NaN (no overflow, unlike a 2-norm); only then are the tensors named one by one.
        maxima = torch._foreach_norm([p.detach() for _, p in names], float("inf"))
        if bool(torch.isfinite(torch.stack([m.float() for m in maxima])).all()):
            return None
        bad = [n for n, p in names if not bool(torch.isfinite(p.detach()).all())]
        return f"{bad[0]} and {len(bad) - 1} other tensor(s)" if bad else None

    def save(self, folder: Path) -> str:
        """Save in Hugging Face format (weights, config, tokenizer; the value head beside them) and return the
        checkpoint hash recorded in ``runs.policy_checkpoint_hash``. Non-finite weights are never saved."""
        bad = self.non_finite()
        if bad:
            raise TrainError(f"{self.where}: refusing to save a checkpoint with non-finite weights ({bad})")
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        self.model.save_pretrained(str(folder))
        for f in self.model_path.iterdir():  # tokenizer and chat template travel with the weights
            if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
                shutil.copy2(f, folder / f.name)
        if self.value_head is not None:
            torch.save(self.value_head.state_dict(), folder / "value_head.pt")
        self.model_path = folder
        return checkpoint_hash(f"hf:{folder}") or ""


# -- the training log ----------------------------------------------------------------------------------------
#: Deprecated log columns still written to the Parquet log, as copies of their new ones: old -> new
#: (docs/names.md).
DEPRECATED_LOG_COLUMNS: dict[str, str] = {"lag_mean": "staleness_mean", "lag_max": "staleness_max"}


@dataclass
class TrainLog:
    """One row per optimizer step, written to ``<out_dir>/train_log.parquet`` (and TensorBoard when installed)."""

    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    tensorboard: Any = None

    @classmethod
    def open(cls, out_dir: Path, main: bool) -> TrainLog:
        log = cls(out_dir / "train_log.parquet")
        if main:
            try:
                # optional (the tensorboard extra) and slow to import: only the main rank logs to it
                from torch.utils.tensorboard import SummaryWriter

                log.tensorboard = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:  # the tensorboard extra is not installed: the Parquet table is the log
                log.tensorboard = None
        return log

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append({**row, **{old: row[new] for old, new in DEPRECATED_LOG_COLUMNS.items() if new in row}})
        if self.tensorboard is not None:
            step = len(self.rows)
            for k, v in row.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                    self.tensorboard.add_scalar(f"{row['stage']}/{k}", v, step)

    def write(self) -> None:
        if not self.rows:
            return
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        table = pa.table({k: [r.get(k) for r in self.rows] for k in keys})
        tmp = self.path.with_suffix(".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, self.path)
        if self.tensorboard is not None:
            self.tensorboard.flush()


# -- the result ----------------------------------------------------------------------------------------------
@dataclass
class StageResult:
    name: str
    policy_version: str
    checkpoint: str
    checkpoint_hash: str
    runs: list[str]
    steps: int
    first_loss: float | None
    last_loss: float | None
    tokens: int


@dataclass
class TrainResult:
    stages: list[StageResult]
    log_path: str


# -- the loop ------------------------------------------------------------------------------------------------
def train(cfg: TrainConfig, lake: str | Path, *, log: Log = print) -> TrainResult:
    """Run every stage of ``cfg`` against ``lake`` (created when missing)."""
    hf_logging.disable_progress_bar()  # the trainer's log says what is loaded and saved
    device = _device(cfg.device)
    lake = str(lake)
    check_environment(cfg)  # before any file is written: a typo must not leave a half-made output behind
    dist = init_distributed(device)
    torch.manual_seed(cfg.seed + dist.rank)
    out_dir = cfg.resolve(cfg.out_dir)
    if dist.main:
        _refuse_trained_stages(cfg, lake)
        Lake.init(lake)
        out_dir.mkdir(parents=True, exist_ok=True)
    _barrier(dist)
    model_path = _base_model(cfg, out_dir, dist)
    if dist.main:
        for line in action_budget_warnings(cfg, model_path):
            log(line)
    versions = PolicyVersions(lake, cfg.name)
    current_version = f"{cfg.name}-base"
    if dist.main:
        versions.publish(current_version, checkpoint=str(model_path.resolve()))
    train_log = TrainLog.open(out_dir, dist.main)
    results: list[StageResult] = []
    for stage in cfg.stages:
        learner = Learner(model_path, device, dist, value_head=stage.kind == "rl" and stage.algo == "ppo")
        learner.new_optimizer(stage.lr)
        log(f"stage {stage.name} ({stage.kind}{'/' + stage.algo if stage.kind == 'rl' else ''}): starting from "
            f"{current_version}")
        wall, cpu = time.monotonic(), time.process_time()
        if stage.kind == "sft":
            result = _run_sft(cfg, stage, lake, learner, dist, train_log, log)
        else:
            result = _run_rl(cfg, stage, lake, learner, dist, train_log, versions, current_version, log)
        result["training_compute"] = training_compute(learner, device, dist, result["tokens"],
                                                      time.monotonic() - wall, time.process_time() - cpu)
        current_version = f"{cfg.name}-{stage.name}"
        folder = out_dir / stage.name
        digest = _save_and_publish(learner, folder, current_version, versions, dist)
        if dist.main:
            train_log.write()
            _register(cfg, stage, lake, current_version, folder, digest, result, train_log.path)
            if stage.eval is not None:
                run = f"{cfg.run_prefix}{stage.name}"
                _rollout(cfg, stage.eval, lake, run, stage.name, folder, current_version, log)
                result["runs"].append(run)
        _barrier(dist)
        model_path = folder
        results.append(StageResult(stage.name, current_version, str(folder), digest, result["runs"],
                                   result["steps"], result["first_loss"], result["last_loss"], result["tokens"]))
        log(f"stage {stage.name}: version {current_version} saved to {folder} ({result['steps']} steps, loss "
            f"{_fmt(result['first_loss'])} -> {_fmt(result['last_loss'])})")
    if train_log.tensorboard is not None:
        train_log.tensorboard.close()
    leave_distributed(dist)
    return TrainResult(results, str(train_log.path))


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TrainError(f"device {name!r}: CUDA is not available on this machine (use device = \"auto\")")
    return name


def _rollout_specs(cfg: TrainConfig) -> Iterator[tuple[str, StageConfig, RolloutSpec]]:
    """(key path, stage, spec) of every rollout the config plays: sft data, rl rollouts, evaluations."""
    for i, s in enumerate(cfg.stages):
        at = f"stages[{i}] ({s.name})"
        if s.kind == "sft" and s.data_policy is not None:
            yield f"{at}.data", s, s.data
        if s.kind == "rl":
            yield f"{at}.rollout", s, s.rollout
        if s.eval is not None:
            yield f"{at}.eval", s, s.eval


def check_environment(cfg: TrainConfig) -> None:
    """The environment, its splits, task ids and scripted data policies exist (a ConfigError naming the file and
    the key otherwise). Runs before anything is written."""
    where = cfg.source or "config"
    try:
        policies = policy_names(cfg.env)
    except TrajlakeError as e:
        raise ConfigError(f"{where}: env = {cfg.env!r}: {one_line(e)}") from None
    if cfg.model.build_tiny and cfg.model.tokenizer_env is not None:
        at = f"{where}: model.tokenizer_env = {cfg.model.tokenizer_env!r}"
        try:
            scripted = policy_names(cfg.model.tokenizer_env)
        except TrajlakeError as e:
            raise ConfigError(f"{at}: {one_line(e)}") from None
        if "oracle" not in scripted:
            raise ConfigError(f"{at}: the environment has no oracle policy to play the tokenizer's corpus")
    tasks: dict[str, set[str]] = {}
    for at, stage, spec in _rollout_specs(cfg):
        listed = f"{spec.split}\0{sorted(spec.env_args.items())!r}"  # the env's arguments can change its splits
        if listed not in tasks:
            try:
                tasks[listed] = {t["task_id"] for t in list_tasks(cfg.env, spec.split, **spec.env_args)}
            except TrajlakeError as e:
                raise ConfigError(f"{where}: {at}.split = {spec.split!r}: {one_line(e)}") from None
        unknown = sorted(set(spec.tasks) - tasks[listed])
        if unknown:
            raise ConfigError(f"{where}: {at}.tasks: {', '.join(unknown[:3])} not in {cfg.env}'s {spec.split!r} "
                              f"split")
        if at.endswith(".data") and stage.data_policy not in policies:
            raise ConfigError(f"{where}: {at.removesuffix('.data')}.data_policy = {stage.data_policy!r}: not a "
                              f"scripted policy of {cfg.env} ({', '.join(policies) or 'none'})")


def action_budget_warnings(cfg: TrainConfig, model_path: Path, n_tasks: int = 3) -> list[str]:
    """One loud line per language-model rollout whose ``max_new_tokens`` cannot hold the longest tool call the
    environment's oracle makes on the first ``n_tasks`` tasks it plays, under the model's tokenizer: such a
    policy can never act as the oracle does, so its rollouts cannot succeed (the Mini SWE B1 -> R1 run's flaw)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    eos = 1 if tok.eos_token_id is not None else 0

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"]) + eos

    longest: dict[str, tuple[int, str]] = {}
    out: list[str] = []
    for at, _stage, spec in _rollout_specs(cfg):
        if at.endswith(".data"):
            continue  # a scripted policy plays the data, not the model
        limit = int(spec.policy_args.get("max_new_tokens", LMSettings().max_new_tokens))
        key = f"{spec.split}:{','.join(spec.tasks)}"
        if key not in longest:
            longest[key] = oracle_call_tokens(cfg.env, spec.split, count, n_tasks, spec.tasks, **spec.env_args)
        need, which = longest[key]
        if need > limit:
            out.append(f"WARNING: {at}.policy_args.max_new_tokens = {limit} cannot hold the oracle's longest tool "
                       f"call on {cfg.env}'s {spec.split!r} split: {need} tokens ({which}) under {model_path}'s "
                       f"tokenizer; those episodes cannot succeed as the oracle does (raise max_new_tokens)")
    return out


def _refuse_trained_stages(cfg: TrainConfig, lake: str) -> None:
    ids = [f"{cfg.run_prefix}{s.name}.train" for s in cfg.stages]
    try:
        con = connect(lake)
    except LakeNotFoundError:
        return  # a new lake holds no stage
    found = [r[0] for r in con.execute(f"select run_id from runs where run_id in ({', '.join('?' * len(ids))})",
                                       ids).fetchall()]
    if found:
        raise TrainError(f"the lake already holds trained stage(s) {', '.join(sorted(found))}: train into a fresh "
                         f"lake or set another run_prefix in the config")


def _base_model(cfg: TrainConfig, out_dir: Path, dist: Dist) -> Path:
    if cfg.model.path is not None:
        path = cfg.resolve(cfg.model.path)
        if not (path / "config.json").is_file():
            raise TrainError(f"[model] path {path}: not a local Hugging Face model folder (no config.json)")
        return path
    path = out_dir / "base"
    if dist.main:
        m = cfg.model
        build_tiny_model(path, hidden_size=m.hidden_size, layers=m.layers, heads=m.heads, kv_heads=m.kv_heads,
                         max_positions=m.max_positions, seed=m.seed, vocab_size=m.vocab_size, env=m.tokenizer_env, corpus_tasks=m.corpus_tasks)
    _barrier(dist)
    return path


def _save_and_publish(learner: Learner, folder: Path, version: str, versions: Any, dist: Dist) -> str:
    digest = ""
    if dist.main:
        digest = learner.save(folder)
        versions.publish(version, checkpoint=str(folder.resolve()))
    _barrier(dist)
    return digest


#: Seconds between a trainer rollout worker's commits: committing every episode made a 2,040-episode data rollout
#: take 18 min instead of 16 s; run_rollout commits the rest when it returns, so a stage always sees them all.
ROLLOUT_COMMIT_EVERY_S = 10.0
#: ``runs.config.sampling_seed_rule`` of the trainer's rollouts. Every episode samples with
#: ``trajlake.policies.lm.sampling_seed(seed, task_id, env_seed, attempt)``; what differs is ``seed``.
COMMON_SEEDS = ("common: sampling_seed(seed, task_id, env_seed, attempt) with seed = policy_args.seed, the same for "
                "every policy (paired comparisons)")
FRESH_SEEDS = ("per-version: sampling_seed(seed, task_id, env_seed, attempt) with seed = training_seed(policy_args.seed, "
               "policy_version), a fresh stream for every policy version")
#: The rule of the asynchronous and fixed-staleness schedules, where one version may play several iterations' runs.
FRESH_RUN_SEEDS = ("per-version-and-run: sampling_seed(seed, task_id, env_seed, attempt) with seed = training_seed("
                   "policy_args.seed, policy_version + '|' + run_id), a fresh stream for every rollout")


def training_seed(base: int, policy_version: str) -> int:
    """The sampling seed of a training rollout of ``policy_version``: each iteration samples a fresh stream (with
    one seed for all, iteration k+1 would replay most of iteration k's tokens, and a stale episode's group
    baseline would hold its own near-copy)."""
    digest = hashlib.sha256(f"train:{base}:{policy_version}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _rollout(cfg: TrainConfig, spec: RolloutSpec, lake: str, run_id: str, label: str, policy_folder: Path | None,
             version: str | None, log: Log, *, scripted: str | None = None, fault_rate: float | None = None,
             training: bool = False, per_run_seeds: bool = False, turn_upgrades: bool = False) -> None:
    """Play ``spec`` into the lake through the rollout runner: the checkpoint in ``policy_folder`` as an ``hf:``
    policy pinned to ``version``, or a scripted policy of the environment. ``training``: sampling seeds fresh
    for this version (``FRESH_SEEDS``), or for this version and run with ``per_run_seeds`` (``FRESH_RUN_SEEDS``: a
    version that plays two runs must not replay its tokens); otherwise common to every policy (``COMMON_SEEDS``)."""
    rule = None
    if scripted is not None:
        policy, args, name = scripted, {}, None
    else:
        policy = f"hf:{policy_folder}"
        args = {"temperature": str(cfg.temperature), **spec.policy_args}
        name = cfg.name
        rule = COMMON_SEEDS
        if training:
            key = f"{version}|{run_id}" if per_run_seeds else str(version)
            args["seed"] = str(training_seed(int(args.get("seed", LMSettings().seed)), key))
            rule = FRESH_RUN_SEEDS if per_run_seeds else FRESH_SEEDS
    rc = RolloutConfig(lake=lake, run_id=run_id, env=cfg.env, policy=policy, split=spec.split,
                       seeds=parse_seeds(spec.seeds), workers=spec.workers,
                       fault_rate=spec.fault_rate if fault_rate is None else fault_rate,
                       fault_seed=cfg.seed, policy_version=version, attempts=spec.attempts, policy_args=args,
                       task_ids=spec.tasks, label=label, policy_name=name, commit_every_s=ROLLOUT_COMMIT_EVERY_S,
                       env_kwargs=dict(spec.env_args), cost_model=CostModel.for_run(args),
                       held_out_fault_kind=spec.held_out_fault_kind,
                       fault_kinds=tuple(spec.fault_kinds) or DEFAULT_FAULT_KINDS, sampling_seed_rule=rule,
                       tags=dict(cfg.tags), turn_upgrades=turn_upgrades)
    t0 = time.monotonic()
    summary = run_rollout(rc)
    if summary.failed_items:
        raise TrainError(f"rollout {run_id}: {len(summary.failed_items)} episode(s) failed, first: "
                         f"{summary.failed_items[0]}")
    log(f"  rollout {run_id}: {summary.written} episode(s) written ({summary.successes} successful) in "
        f"{time.monotonic() - t0:.0f} s")


FLOPS_RULE = ("6 x parameters x tokens through the training forward passes (forward 2, backward 4 per parameter "
              "and token), summed over ranks; the stage's rollouts, evaluation and re-scoring are not included")


def training_compute(learner: Learner, device: str, dist: Dist, policy_tokens: int, wall_seconds: float,
                     cpu_seconds: float) -> dict[str, Any]:
    """What a stage cost (``runs.config.training_compute`` of its ``.train`` run), so that total cost = training
    + deployment can be matched across arms. A collective: every rank calls it. ``wall_seconds`` includes the
    stage's own rollouts (RL); ``cpu_seconds`` is this process's (rank 0's) CPU time, threads included."""
    n_params = sum(int(p.numel()) for p in learner.parameters())
    through = int(_all_sum(dist, float(learner.tokens_trained_through)))
    on_gpu = device.startswith("cuda")
    return {"device": device, "world_size": dist.world, "wall_seconds": round(wall_seconds, 3),
            "cpu_seconds": round(cpu_seconds, 3), "gpu_seconds": round(wall_seconds * dist.world, 3) if on_gpu else 0.0,
            "policy_tokens_trained": int(policy_tokens), "tokens_through_training": through,
            "parameters": n_params, "flops_estimate": 6.0 * n_params * through, "flops_rule": FLOPS_RULE}


def _register(cfg: TrainConfig, stage: StageConfig, lake: str, version: str, folder: Path, digest: str,
              result: dict[str, Any], log_path: Path) -> None:
    """The stage's row in ``runs`` (run ``<prefix><stage>.train``, no episodes): its policy version, checkpoint
    hash, the whole config and where the checkpoint and the log are."""
    summary = {"stage": dataclasses.asdict(stage), "experiment": config_dict(cfg), "checkpoint": str(folder),
               "train_log": str(log_path), "steps": result["steps"], "first_loss": result["first_loss"],
               "last_loss": result["last_loss"], "tokens": result["tokens"], "data_runs": result["runs"],
               "training_compute": result["training_compute"]}
    with LakeWriter(Lake.open(lake), handle_signals=False) as w:
        w.write_runs([{"run_id": f"{cfg.run_prefix}{stage.name}.train", "created_at": utcnow(),
                       "label": stage.name, "config": json.dumps(summary, sort_keys=True, default=str),
                       "policy_name": cfg.name, "policy_version": version, "policy_checkpoint_hash": digest,
                       "code_version": code_version()}])


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


# -- B1: supervised ------------------------------------------------------------------------------------------
def _run_sft(cfg: TrainConfig, stage: StageConfig, lake: str, learner: Learner, dist: Dist, train_log: TrainLog,
             log: Log) -> dict[str, Any]:
    runs = list(stage.data_runs)
    if stage.data_policy is not None:
        run = f"{cfg.run_prefix}{stage.name}-data"
        if dist.main:
            _rollout(cfg, stage.data, lake, run, stage.name, None, None, log, scripted=stage.data_policy)
        _barrier(dist)
        runs.append(run)
    selection = Selection(runs=runs, success=True if stage.success_only else None, as_of=_pin(dist, lake))
    dataset = LakeTrajectories(lake, selection, tokenizer=learner.model_path, max_length=cfg.max_length,
                               rank=dist.rank, world_size=dist.world)
    batches = _batches(dataset, _per_rank(stage.batch_size, dist), learner, _shuffle_seed(cfg, dist, stage.name),
                       cfg.micro_batch_size)
    losses: list[float] = []
    tokens = 0
    for step in range(stage.steps):
        _schedule(learner, stage, step, f"stage {stage.name} step {step}")
        micro = next(batches)
        counts, n_tokens, denominator = _token_counts(cfg, dist, micro)
        local_tokens = sum(counts)
        if n_tokens == 0:
            raise TrainError(f"stage {stage.name}: no policy tokens to learn from in runs {', '.join(runs)} "
                             f"(success_only={stage.success_only}; {dataset.stats})")
        local_loss, entropy_sum = 0.0, 0.0
        for batch in micro:  # each loss over the whole batch's count: the gradients add up to the batch's
            out = learner.forward(batch, cfg.temperature)
            mask = batch["loss_mask"].to(learner.device)
            loss = tm.sft_loss(out["logp"], mask, cfg.loss_aggregation, denominator=denominator)
            entropy_sum += float(tm.masked_sum(out["entropy"].detach(), mask))
            learner.backward(loss)
            local_loss += float(loss.detach())
        if not micro:  # this rank's shard is empty: it still takes part in the gradient sum
            learner.backward(learner.zero_loss())
        entropy = entropy_sum / local_tokens if local_tokens > 0 else float("nan")
        grad_norm = learner.apply(cfg.grad_clip)
        value = _all_sum(dist, local_loss)  # each rank's share of the global normaliser
        losses.append(value)
        tokens += int(n_tokens)
        train_log.add({"stage": stage.name, "iteration": 0, "step": step, "loss": value, "kl": None,
                       "entropy": entropy, "lr": learner.lr, "grad_norm": grad_norm, "policy_tokens": int(n_tokens),
                       "ratio_mean": None, "ratio_max": None, "log_ratio_var": None, "staleness_mean": None,
                       "staleness_max": None, "reward_mean": None, "time": time.time()})
        if dist.main and (step % 10 == 0 or step == stage.steps - 1):
            log(f"  {stage.name} step {step}: loss {value:.4f} over {int(n_tokens)} policy tokens")
        if stage.plateau_check is not None and step + 1 == stage.plateau_check.step:
            _plateau_check(stage.name, stage.plateau_check, losses, train_log if dist.main else None, log)
    return {"runs": runs, "steps": stage.steps, "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, "tokens": tokens}


def _plateau_check(name: str, check: PlateauCheck, losses: list[float], train_log: TrainLog | None, log: Log) -> None:
    """Stage ``name``'s plateau check after its ``check.step``-th step: the mean of the last ``window`` losses (the
    same on every rank: each loss is summed across ranks) must be at most ``max_loss``, or PlateauError on every
    rank. ``train_log`` is the main rank's (None elsewhere): it logs the verdict and, on a failure, writes the
    training log first, so the stopped attempt's curve is kept."""
    mean = statistics.fmean(losses[-check.window:])
    failed = mean > check.max_loss
    steps = f"steps {check.step - check.window}-{check.step - 1}"
    if train_log is not None:
        log(f"stage {name}: plateau check {'failed' if failed else 'passed'}: mean loss {mean:.4f} over {steps} "
            f"(bar {check.max_loss})")
        if failed:
            train_log.write()
    if failed:
        raise PlateauError(f"stage {name}: mean training loss {mean:.4f} over {steps} is above "
                           f"plateau_check.max_loss = {check.max_loss}: the model is still on its loss plateau; no "
                           f"checkpoint was saved", mean_loss=mean, step=check.step)


def _schedule(learner: Learner, stage: StageConfig, step: int, where: str) -> None:
    """Set the learning rate of the stage's ``step``-th optimizer step (0-based, over all its iterations)."""
    total = stage.steps * (stage.iterations if stage.kind == "rl" else 1)
    learner.set_lr(tm.learning_rate(step, total, stage.lr, warmup_steps=stage.warmup_steps,
                                    schedule=stage.lr_schedule, min_lr_ratio=stage.min_lr_ratio))
    learner.where = where


def _shuffle_seed(cfg: TrainConfig, dist: Dist, what: str) -> int | None:
    """The seed of a stage's (or iteration's) sample order on this rank; None when ``cfg.shuffle`` is off."""
    if not cfg.shuffle:
        return None
    return int.from_bytes(hashlib.sha256(f"shuffle:{cfg.seed}:{what}:{dist.rank}".encode()).digest()[:4], "little")


def _per_rank(batch_size: int, dist: Dist) -> int:
    return max(1, math.ceil(batch_size / dist.world))


def _token_counts(cfg: TrainConfig, dist: Dist, micro: list[dict[str, Any]]) -> tuple[list[float], float, float]:
    """A step's policy tokens: per micro-batch of this rank (counted on the host, where the batches are built),
    their sum over the ranks, and the loss's normaliser. Both sums are collectives: every rank, every step."""
    counts = [float(b["loss_mask"].sum()) for b in micro]
    n_tokens = _all_sum(dist, sum(counts))
    return counts, n_tokens, _denominator(cfg, dist, micro, n_tokens)


def _denominator(cfg: TrainConfig, dist: Dist, micro: list[dict[str, Any]], global_tokens: float) -> float:
    """The loss's global normaliser, so that the ranks' and micro-batches' summed gradients equal one batch's:
    the policy-token count for ``token-mean``, else the number of sequences with at least one policy token
    (all-reduced)."""
    if cfg.loss_aggregation == "token-mean":
        return global_tokens
    local = sum(float((b["loss_mask"].sum(-1) > 0).sum()) for b in micro)
    return _all_sum(dist, local)


#: A rank's shard of at most this many samples is read from the lake once and kept in memory for later epochs
#: (and shuffled as a whole); a larger one is streamed every epoch through a shuffle buffer of this size.
CACHED_SAMPLES = 50_000


def _epoch_samples(dataset: Any, rng: random.Random | None) -> Iterator[Iterator[dict[str, Any]]]:
    """The dataset's samples, epoch after epoch. Without ``rng``: in the lake's order, read each epoch. With it:
    shuffled; a shard of at most ``CACHED_SAMPLES`` samples is read once, put in episode-id order (the lake's file
    order depends on how the commits that wrote it fell in time, so the same seed would otherwise give another
    order from one run to the next) and permuted anew each epoch; a larger one is streamed through a shuffle
    buffer in the lake's order (consecutive episodes of a lake come from one run, one task family)."""
    if rng is None:
        while True:
            yield iter(dataset)
    first = list(itertools.islice(iter(dataset), CACHED_SAMPLES + 1))
    cache = first if len(first) <= CACHED_SAMPLES else None
    if cache is not None:
        cache.sort(key=lambda sample: sample["episode_id"])  # stable: an episode's pieces keep their order
    while True:
        if cache is not None:
            rng.shuffle(cache)
            yield iter(list(cache))
        else:
            yield _shuffle_buffer(iter(dataset), rng, CACHED_SAMPLES)


def _shuffle_buffer(stream: Iterator[dict[str, Any]], rng: random.Random, size: int) -> Iterator[dict[str, Any]]:
    buf: list[dict[str, Any]] = []
    for sample in stream:
        buf.append(sample)
        if len(buf) >= size:
            i = rng.randrange(len(buf))
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()
    rng.shuffle(buf)
    yield from buf


def _batches(dataset: Any, size: int, learner: Learner, shuffle_seed: int | None = None, micro_batch_size: int = 0
             ) -> Iterator[list[dict[str, Any]]]:
    """Batches of ``size`` samples, cycling over the dataset (epochs), shuffled when ``shuffle_seed`` is given
    (``_epoch_samples``); each batch as its padded micro-batches of ``micro_batch_size`` samples (0: one, the
    whole batch), each padded to its own longest sample; an empty list when this rank's shard is empty. A
    micro-batch holding turns sampled under a grammar carries their replayed masks (``grammar_masks``), which the
    learner's log-probs apply."""
    pad_id = int(getattr(learner.model.config, "pad_token_id", None) or 0)
    grammars = getattr(dataset, "grammars", None)
    vocab = int(learner.model.get_output_embeddings().weight.shape[0])
    masks = BatchGrammarMasks(dataset.tokenizer, grammars, vocab) if grammars else None
    per_pass = micro_batch_size if micro_batch_size > 0 else size

    def collated(buf: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for lo in range(0, len(buf), per_pass):
            batch = pad_collate(buf[lo:lo + per_pass], pad_id)
            batch["grammar_masks"] = masks(batch) if masks is not None else None
            out.append(batch)
        return out

    rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
    for epoch in _epoch_samples(dataset, rng):
        buf: list[dict[str, Any]] = []
        seen = False
        for sample in epoch:
            seen = True
            buf.append(sample)
            if len(buf) == size:
                yield collated(buf)
                buf = []
        if buf:
            yield collated(buf)
        if not seen:
            yield []


# -- R1/R2/R3: policy gradient -------------------------------------------------------------------------------
class _Actor:
    """The asynchronous trainer's actor (``async_rollouts``): a thread that plays the stage's rollouts one after
    another while the learner trains. Rollout r starts once rollout r-1 is written and the learner has published
    version r-1-max_staleness of the stage (bounded staleness: the learner trains rollout r at version r-1), and
    plays the newest version published then. The runner records each episode's ``policy_lag`` when it starts, so
    an episode that starts after the learner published a newer version records lag > 0."""

    def __init__(self, cfg: TrainConfig, stage: StageConfig, lake: str, first: tuple[str, Path], log: Log):
        self.cfg, self.stage, self.lake, self.log = cfg, stage, lake, log
        self.cond = threading.Condition()
        self.versions: list[tuple[str, Path]] = [first]
        """The stage's published versions (label, checkpoint folder), oldest first; guarded by ``cond``."""
        self.played: dict[int, str] = {}
        """Iteration -> the version its rollout played, once written."""
        self.error: BaseException | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self._play, name="trajlake-actor", daemon=True)
        self.thread.start()

    def _play(self) -> None:
        try:
            choice: tuple[str, Path] | None = None
            for r in range(1, self.stage.iterations + 1):
                with self.cond:
                    if choice is None:  # not chosen when rollout r-1 was handed over: wait for a version
                        # rollout r may play version r-1-max_staleness of the stage or a newer one
                        self.cond.wait_for(functools.partial(self._may_play, r))
                        choice = self.versions[-1]
                    if self.stopping:
                        return
                    label, folder = choice
                run = f"{self.cfg.run_prefix}{self.stage.name}-it{r}"
                _rollout(self.cfg, self.stage.rollout, self.lake, run, self.stage.name, folder, label, self.log,
                         fault_rate=_fault_rate(self.stage, r - 1), training=True, per_run_seeds=True,
                         turn_upgrades=self.stage.turn_upgrades)
                with self.cond:
                    self.played[r] = label
                    # the next rollout's version is chosen in the same hand-over when it may start now, so it
                    # never depends on how fast this thread wakes: the learner cannot yet have trained on rollout r
                    choice = self.versions[-1] if self._may_play(r + 1) else None
                    self.cond.notify_all()
        except BaseException as e:  # handed to the learner, which raises it
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def _may_play(self, r: int) -> bool:
        """Whether rollout ``r`` may start (or the actor must stop): called under ``cond``."""
        return self.stopping or len(self.versions) - 1 >= r - 1 - self.stage.max_staleness

    def publish(self, label: str, folder: Path) -> None:
        with self.cond:
            self.versions.append((label, folder))
            self.cond.notify_all()

    def wait_for(self, iteration: int) -> str:
        """The version rollout ``iteration`` played, once it is written (its failure raised here)."""
        with self.cond:
            self.cond.wait_for(lambda: iteration in self.played or self.error is not None)
            if iteration not in self.played:
                assert self.error is not None
                if isinstance(self.error, TrajlakeError):
                    raise self.error
                raise TrainError(f"stage {self.stage.name}: the actor's rollout {iteration} failed: "
                                 f"{one_line(self.error)}") from self.error
            return self.played[iteration]

    def stop(self) -> None:
        """Play no further rollout and wait for the one in progress (its episodes are committed, not cut)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join()


def _current_env_version(env: str) -> dict[str, str]:
    """{env_id: the environment version this code runs} of the registered environment (empty when it has none)."""
    cls = registry.spec(env).load()
    env_id, version = getattr(cls, "env_id", None), getattr(cls, "env_version", None)
    return {str(env_id): str(version)} if isinstance(env_id, str) and isinstance(version, str) else {}


def _run_rl(cfg: TrainConfig, stage: StageConfig, lake: str, learner: Learner, dist: Dist, train_log: TrainLog,
            versions: Any, start_version: str, log: Log) -> dict[str, Any]:
    """The RL iterations under one of three schedules: synchronous (play the learner's version, then train),
    ``fixed_staleness = k`` (play the version of k updates before, train on that rollout only) or
    ``async_rollouts`` (an ``_Actor`` thread plays while the learner trains)."""
    if stage.async_rollouts and dist.world > 1:
        raise TrainError(f"stage {stage.name}: async_rollouts runs in one process, not under torchrun "
                         f"(WORLD_SIZE = {dist.world})")
    runs: list[str] = []
    stage_versions: list[tuple[str, Path]] = [(start_version, learner.model_path)]
    """The stage's versions (label, checkpoint folder), oldest first: the start, then one per iteration."""
    losses: list[float] = []
    tokens = 0
    lagged = stage.fixed_staleness is not None
    actor = _Actor(cfg, stage, lake, stage_versions[0], log) if stage.async_rollouts and dist.main else None
    env_now = _current_env_version(cfg.env) if stage.max_env_age is not None else {}
    if stage.ref_kl_coef:
        learner.freeze_reference()  # pi_ref: the stage's starting checkpoint (B1 for R1)
    try:
        for it in range(1, stage.iterations + 1):
            run = f"{cfg.run_prefix}{stage.name}-it{it}"
            learner_version = stage_versions[-1][0]
            if actor is not None:
                played = actor.wait_for(it)
            else:
                k = stage.fixed_staleness or 0
                played, folder = stage_versions[max(0, len(stage_versions) - 1 - k)]
                if dist.main:
                    _rollout(cfg, stage.rollout, lake, run, stage.name, folder, played, log,
                             fault_rate=_fault_rate(stage, it - 1), training=True, per_run_seeds=lagged)
            _barrier(dist)
            runs.append(run)
            published = versions.all()
            selection = Selection(runs=[run] if lagged else list(runs), max_staleness=stage.max_staleness,
                                  staleness_version="end" if stage.partial_rollouts else "start",
                                  policy_version_order=published, learner_version=learner_version,
                                  max_env_age=stage.max_env_age, now=dt.datetime.now(dt.UTC),
                                  current_env_version=env_now or None, as_of=_pin(dist, lake))
            episodes, excluded = without_env_errors(select_episodes(lake, selection))
            if dist.main and excluded:
                log(f"  {stage.name} it {it}: {excluded} episode(s) left out of the batch: the environment failed "
                    f"them ({', '.join(ENV_ERROR_CLASSES)}), not the policy")
            credit = _episode_credit(cfg, stage, lake, episodes)
            returns = credit.returns()
            advantages, turn_advantages = _advantages(stage, episodes, credit,
                                                      placebo_seed=cfg.seed * 1_000_003 + it)
            ids = episodes.column("episode_id").to_pylist()
            counted = "policy_version_end" if stage.partial_rollouts else "policy_version_start"
            staleness = {e: int(staleness_of(v, published, learner_version) or 0) for e, v in
                         zip(ids, episodes.column(counted).to_pylist(), strict=True)}
            prefixes = prefix_turns(lake, episodes) if stage.partial_rollouts else {}
            ages = _episode_ages(lake, stage, episodes, selection, env_now)
            dataset = LakeTrajectories(lake, selection, tokenizer=learner.model_path, advantages=advantages,
                                       max_length=cfg.max_length, rank=dist.rank, world_size=dist.world,
                                       episodes=episodes)
            batches = _batches(dataset, _per_rank(stage.batch_size, dist), learner,
                               _shuffle_seed(cfg, dist, f"{stage.name}.{it}"), cfg.micro_batch_size)
            reward_mean = sum(returns.values()) / max(1, len(returns))
            if cfg.policy_loss == "clip" and any(v > 0 for v in staleness.values()):
                learner.freeze_proximal()  # decoupled PPO's pi_prox: the learner as this iteration starts
            for step in range(stage.steps):
                _schedule(learner, stage, (it - 1) * stage.steps + step,
                          f"stage {stage.name} iteration {it} step {step}")
                cleared = [mask_prefixes(b, prefixes) for b in next(batches)]
                micro, masked = [b for b, _ in cleared], sum(n for _, n in cleared)
                row = _rl_step(cfg, stage, learner, dist, micro, staleness, credit, turn_advantages)
                row.update(_lag_and_age(micro, ages))
                row.update(stage=stage.name, iteration=it, step=step, reward_mean=reward_mean, time=time.time(),
                           excluded_env_errors=excluded, played_version=played,
                           prefix_tokens_masked=masked if stage.partial_rollouts else None)
                train_log.add(row)
                losses.append(row["loss"])
                tokens += row["policy_tokens"]
                if dist.main:
                    log(f"  {stage.name} it {it} step {step}: loss {row['loss']:.4g}, kl {_fmt(row['kl'])}, ratio "
                        f"mean {_fmt(row['ratio_mean'])}, staleness max {row['staleness_max']}, policy lag max "
                        f"{row['policy_lag_max']}, age max {_fmt(row['age_seconds_max'])} s, return mean "
                        f"{reward_mean:.4g}")
            learner.proximal = None
            if it < stage.iterations:  # the next iteration plays the updated policy as a new version
                label = f"{cfg.name}-{stage.name}.{it}"
                folder = Path(cfg.resolve(cfg.out_dir)) / f"{stage.name}.{it}"
                _save_and_publish(learner, folder, label, versions, dist)
                stage_versions.append((label, folder))
                if actor is not None:
                    actor.publish(label, folder)
                if dist.main:
                    train_log.write()
    finally:
        if actor is not None:
            actor.stop()
    return {"runs": runs, "steps": stage.steps * stage.iterations, "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, "tokens": tokens}


def prefix_turns(lake: str, episodes: pa.Table) -> dict[str, int]:
    """Partial rollouts: per episode whose policy turns carry more than one version (``turns.policy_version``),
    K0, the number of its policy turns before its last version's first turn (the old prefix); 0 for the others."""
    ids = episodes.column("episode_id").to_pylist()
    if not ids:
        return {}
    con = connect(lake)
    con.execute("create temp table sel(episode_id varchar)")
    con.executemany("insert into sel values (?)", [[i] for i in ids])
    rows = con.execute("select episode_id, list(policy_version order by turn_idx) from turns join sel "
                       "using (episode_id) where actor = 'policy' group by 1").fetchall()
    out = dict.fromkeys(ids, 0)
    for e, versions in rows:
        last = versions[-1]
        k0 = len(versions)
        while k0 > 0 and versions[k0 - 1] == last:
            k0 -= 1
        out[e] = k0
    return out


def mask_prefixes(batch: dict[str, Any], prefixes: dict[str, int]) -> tuple[dict[str, Any], int]:
    """The batch with the loss mask of every old-prefix token cleared (policy turns k < K0 of ``prefix_turns``):
    those tokens stay in the context but leave the loss, its token-mean denominator, the ratios and the
    trajectory weight. Returns the batch and how many loss tokens were cleared."""
    if not batch or not any(prefixes.get(e, 0) for e in batch["episode_id"]):
        return batch, 0
    k0 = torch.tensor([prefixes.get(e, 0) for e in batch["episode_id"]], dtype=torch.long)
    turn = batch["token_turn"]
    keep = (turn >= k0[:, None]).to(batch["loss_mask"].dtype)
    before = float(batch["loss_mask"].sum())
    out = dict(batch, loss_mask=batch["loss_mask"] * keep)
    return out, int(before - float(out["loss_mask"].sum()))


@dataclass(frozen=True)
class EpisodeAges:
    """When each episode of an iteration ended (seconds since the epoch) and, with ``max_env_age.versions``, how
    many environment versions it is behind the one running (None: not computed)."""

    ended: dict[str, float]
    env_versions: dict[str, int | None] | None = None


def _episode_ages(lake: str, stage: StageConfig, episodes: pa.Table, selection: Selection,
                  env_now: dict[str, str]) -> EpisodeAges:
    ids = episodes.column("episode_id").to_pylist()
    ended = {e: t.timestamp() for e, t in zip(ids, episodes.column("ended_at").to_pylist(), strict=True)
             if t is not None}
    if stage.max_env_age is None or stage.max_env_age.versions is None:
        return EpisodeAges(ended)
    lk = Lake.open(lake)
    order = env_versions_in_lake_order(lk, pinned_versions(lk, selection.as_of)["episodes"])
    ages = env_version_ages(episodes.column("env_id").to_pylist(), episodes.column("env_version").to_pylist(),
                            dict(order), env_now or None)
    return EpisodeAges(ended, dict(zip(ids, ages, strict=True)))


def _lag_and_age(micro: list[dict[str, Any]], ages: EpisodeAges) -> dict[str, Any]:
    """The step's log columns on its batch (its micro-batches): ``policy_lag_mean``/``_max`` (the lag the runner
    recorded when each episode started; unknown lags left out), ``age_seconds_mean``/``_max`` (now - the
    episode's end) and, with a TTL by environment version, ``env_version_age_max``."""
    ids = [e for b in micro for e in b["episode_id"]]
    lags = [int(x) for b in micro for x in b.get("policy_lag", []) if x is not None]
    now = time.time()
    secs = [now - ages.ended[e] for e in ids if e in ages.ended]
    env = [a for e in ids if ages.env_versions is not None and (a := ages.env_versions.get(e)) is not None]
    return {"policy_lag_mean": sum(lags) / len(lags) if lags else None, "policy_lag_max": max(lags, default=None),
            "age_seconds_mean": sum(secs) / len(secs) if secs else None, "age_seconds_max": max(secs, default=None),
            "env_version_age_max": max(env, default=None)}


def _fault_rate(stage: StageConfig, iteration: int) -> float:
    """R3's curriculum: the schedule's rate for this iteration (0-based), else the rollout's fixed rate."""
    sched = stage.fault_rate_schedule
    return fault_rate_at(iteration, sched) if sched else stage.rollout.fault_rate


#: Error classes of episodes the environment failed, not the policy: never a model failure in an RL batch.
ENV_ERROR_CLASSES = (ErrorClass.ENV_BUG, ErrorClass.ENV_TRANSIENT)


def without_env_errors(episodes: pa.Table) -> tuple[pa.Table, int]:
    """The episodes whose ``error_class`` is not an environment failure (ENV_BUG, ENV_TRANSIENT), and how many
    were left out: punishing the policy for a broken grader or a flaky tool would teach it nothing true."""
    env_failed = pc.is_in(episodes["error_class"], value_set=pa.array([str(c) for c in ENV_ERROR_CLASSES]))
    keep = pc.invert(pc.fill_null(env_failed, False))
    kept = episodes.filter(keep)
    return kept, episodes.num_rows - kept.num_rows


def _violations(cfg: TrainConfig, con: Any) -> dict[str, float]:
    """V of 19.3 per episode of the temp table ``sel``, as ``cfg.safety_violations`` counts them: ``denials``
    (gateway calls denied), ``executed`` (the attacker's goal achieved, plus
    irreversible calls that ran while untrusted text was in the context) or ``both``."""
    out: dict[str, float] = {}
    if cfg.safety_violations in ("denials", "both"):
        rows = con.execute("select g.episode_id, count(*) from gateway_events g join sel using (episode_id) "
                           "where g.decision = ? group by 1", [str(Decision.DENY)])
        for e, n in rows.fetchall():
            out[e] = out.get(e, 0.0) + float(n)
    if cfg.safety_violations in ("executed", "both"):
        rows = con.execute(
            "select e.episode_id, coalesce(e.attack_success::int, 0) + (select count(*) from gateway_events g "
            "where g.episode_id = e.episode_id and g.executed and g.side_effect_class = ? "
            "and coalesce(len(g.taint), 0) > 0) from episodes e join sel using (episode_id)",
            [str(SideEffectClass.IRREVERSIBLE)])
        for e, n in rows.fetchall():
            out[e] = out.get(e, 0.0) + float(n)
    return out


@dataclass(frozen=True)
class Credit:
    """What the episodes of an RL iteration earned (19.3), turn by turn.

    ``terminal``: R_task - lambda_c C - lambda_s V per episode, which enters at the episode's last policy turn.
    ``process``: with a process reward, the weighted process reward p_k each policy turn k = 0..K-1 earned
    (``tm.policy_turn_rewards`` of the reward's per-turn values), ``[K]`` per episode; None without one (R1).
    ``gamma`` and ``shaping`` (``per_turn`` or ``potential``) say how the two combine (``tm.episode_turn_rewards``)."""

    terminal: dict[str, float]
    process: dict[str, Any] | None = None
    gamma: float = 1.0
    shaping: str = "per_turn"

    def turns(self, episode_id: str) -> int | None:
        """K, the policy turns of the episode as the process reward saw them (None without a process reward)."""
        return None if self.process is None else len(self.process[episode_id])

    def turn_rewards(self, episode_id: str, k_turns: int, *, end_correction: bool = True) -> Any:
        """r_0..r_{K-1} of the episode (float64 ``[K]``): without a process reward the terminal part at the last
        turn and 0 elsewhere (R1); with one ``tm.episode_turn_rewards`` (``end_correction``: the potential's terminal
        correction, for an episode taken as ended)."""
        if self.process is None:
            rewards = torch.zeros(k_turns, dtype=torch.float64)
            if k_turns:
                rewards[-1] = self.terminal[episode_id]
            return rewards
        process = self.process[episode_id]
        if len(process) != k_turns:
            raise TrainError(f"episode {episode_id}: {k_turns} policy turns in the batch but {len(process)} in the "
                             f"lake's turns; the process reward cannot be placed")
        return tm.episode_turn_rewards(self.terminal[episode_id], process, self.gamma,
                                       "potential" if self.shaping == "potential" else "per_turn",
                                       end_correction=end_correction)

    def returns(self) -> dict[str, float]:
        """G_0 per episode: the terminal part without a process reward (R1), else sum_k gamma^k r_k (with the
        potential's terminal correction)."""
        if self.process is None:
            return dict(self.terminal)
        out = {}
        for e, process in self.process.items():
            k = len(process)
            out[e] = float(tm.returns_to_go([self.turn_rewards(e, k)], self.gamma)[0, 0]) if k else self.terminal[e]
        return out


def _episode_credit(cfg: TrainConfig, stage: StageConfig, lake: str, episodes: Any) -> Credit:
    """The terminal part of 19.3 per episode, R_task - lambda_c * cost_usd - lambda_s * V (safety violations,
    counted as ``safety_violations`` says), and, with a process reward, its per-turn values (the reward's
    ``process_rewards.PER_TURN`` function over the lake's turns) placed on the policy turns that earned them
    (``tm.policy_turn_rewards``) and weighted by ``process_weight``."""
    ids = episodes.column("episode_id").to_pylist()
    if not ids:
        return Credit({}, {} if stage.process_reward is not None else None, cfg.gamma, stage.process_shaping)
    task = episodes.column("success" if cfg.task_reward == "success" else "reward_total").to_pylist()
    cost = episodes.column("cost_usd").to_pylist()
    con = connect(lake)
    con.execute("create temp table sel(episode_id varchar)")
    con.executemany("insert into sel values (?)", [[i] for i in ids])
    violations = _violations(cfg, con) if cfg.lambda_safety else {}
    process: dict[str, Any] | None = None
    if stage.process_reward is not None:
        fn = process_rewards.PER_TURN[stage.process_reward]
        cols = "episode_id, turn_idx, role, actor, raw_content, action_schema, tool_args, status, env_state_hash"
        turns: dict[str, list[dict[str, Any]]] = {e: [] for e in ids}
        cur = con.execute(f"select {cols} from turns t join sel using (episode_id) order by episode_id, turn_idx")
        names = [d[0] for d in cur.description]
        for row in cur.fetchall():
            rec = dict(zip(names, row, strict=True))
            turns[rec["episode_id"]].append(rec)
        process = {e: stage.process_weight * tm.policy_turn_rewards(fn(t), [str(x["actor"]) for x in t])
                   for e, t in turns.items()}
    terminal = {}
    for e, r, c in zip(ids, task, cost, strict=True):
        r_task = float(bool(r)) if cfg.task_reward == "success" else float(r or 0.0)
        terminal[e] = r_task - cfg.lambda_cost * float(c or 0.0) - cfg.lambda_safety * violations.get(e, 0.0)
    return Credit(terminal, process, cfg.gamma, stage.process_shaping)


def _advantages(stage: StageConfig, episodes: Any, credit: Credit, placebo_seed: int = 0
                ) -> tuple[dict[str, float] | None, dict[str, list[float]] | None]:
    """(per-episode, per-turn) advantages for RLOO/GRPO (groups: same task, seed and environment version); both
    None for PPO, whose advantages come from GAE inside each step.

    Without a process reward (R1): one advantage per episode from its return (RLOO 19.7 or GRPO). With one (R2):
    per-turn advantages, ``tm.turn_group_advantages`` of the returns-to-go G_k = sum_{j>=k} gamma^(j-k) r_j, the
    baseline of turn k taken from the other members' G_k. The placebo control shuffles the returns (R1), or whole
    episodes' return rows (R2), within each group first (seeded by ``placebo_seed``)."""
    if stage.algo == "ppo":
        return None, None
    ids = episodes.column("episode_id").to_pylist()
    groups = episodes.column("group_id").to_pylist()
    if credit.process is None:
        rewards = torch.tensor([credit.terminal[e] for e in ids], dtype=torch.float64)
        if stage.placebo_shuffle_rewards:
            rewards = tm.shuffle_within_groups(rewards, groups, torch.Generator().manual_seed(placebo_seed))
        adv = tm.rloo_advantages(rewards, groups) if stage.algo == "rloo" else tm.grpo_advantages(rewards, groups)
        return {e: float(a) for e, a in zip(ids, adv.tolist(), strict=True)}, None
    lengths = [int(credit.turns(e) or 0) for e in ids]
    g = tm.returns_to_go([credit.turn_rewards(e, k) for e, k in zip(ids, lengths, strict=True)], credit.gamma)
    if stage.placebo_shuffle_rewards:
        g = tm.shuffle_within_groups(g, groups, torch.Generator().manual_seed(placebo_seed))
    turn_adv = tm.turn_group_advantages(g, lengths, groups, "rloo" if stage.algo == "rloo" else "grpo")
    return None, {e: turn_adv[i, :k].tolist() for i, (e, k) in enumerate(zip(ids, lengths, strict=True))}


def _turn_advantage_tokens(batch: dict[str, Any], turn_advantages: dict[str, list[float]], loss_mask: Any,
                           observations: bool = False) -> Any:
    """Per-turn advantages ``[B, K]`` on the batch's loss tokens (``tm.turns_to_tokens``): each policy token gets
    its turn's. ``observations`` (the mask ablation): a loss token outside a policy turn gets the advantage of the
    last policy turn before it."""
    rows = [turn_advantages[e] for e in batch["episode_id"]]
    table = torch.zeros(len(rows), max([1, *(len(r) for r in rows)]))
    for b, r in enumerate(rows):
        table[b, :len(r)] = torch.tensor(r, dtype=torch.float64)
    turn = batch["token_turn"]
    if observations:
        turn = torch.cummax(turn, dim=-1).values
    return tm.turns_to_tokens(table.to(loss_mask.device), turn.to(loss_mask.device), loss_mask)


def _with_observations(batch: dict[str, Any], logp: Any, mask: Any, old: Any, prox: Any) -> tuple[Any, Any, Any]:
    """The mask ablation's loss mask: the policy's tokens plus every later token it did not produce (observations
    and template glue), whose behaviour and proximal log-probs are taken as the learner's own (ratio 1)."""
    observations = _observation_tokens(batch["attention_mask"], mask)
    own = logp.detach()
    on_obs = observations.bool()
    return mask + observations, torch.where(on_obs, own, old), torch.where(on_obs, own, prox)


def policy_objective(cfg: TrainConfig, logp: Any, logp_prox: Any, logp_behavior: Any, advantages: Any, mask: Any,
                     denominator: float) -> tuple[Any, dict[str, float]]:
    """The policy loss of an RL step, with the off-policy correction counted once (docs/training.md, "The
    loss"). ``clip``: decoupled PPO, ratios against the proximal policy ``logp_prox`` and the behaviour policy
    only in the truncated trajectory weight min(prod pi_prox / mu, c). ``reinforce``: -A log pi weighted by the
    truncated trajectory ratio min(prod pi / mu, c) (detached), its only correction."""
    if cfg.policy_loss == "reinforce":
        weights = tm.truncated_importance_weights(tm.sequence_log_ratio(logp.detach(), logp_behavior, mask),
                                                  cfg.is_max_weight)
        scale = weights if advantages.dim() == 1 else weights[:, None]
        loss = tm.reinforce_loss(logp, advantages * scale, mask, cfg.loss_aggregation, denominator)
        return loss, {"is_weight_mean": float(weights.mean())}
    return tm.decoupled_clip_loss(logp, logp_prox, logp_behavior, advantages, mask, max_weight=cfg.is_max_weight,
                                  clip_low=cfg.clip_low, clip_high=cfg.clip_high, level=cfg.ratio_level,
                                  mode=cfg.loss_aggregation, denominator=denominator)


def _rl_step(cfg: TrainConfig, stage: StageConfig, learner: Learner, dist: Dist, micro: list[dict[str, Any]],
             staleness: dict[str, int], credit: Credit, turn_advantages: dict[str, list[float]] | None = None
             ) -> dict[str, Any]:
    """One optimizer step on a batch, given as its micro-batches (``micro_batch_size``): each is forwarded and
    backpropagated in turn with every loss term normalised by the whole batch's count (policy tokens or sequences,
    summed across ranks), so the accumulated gradient is the batch's. Returns the step's log row."""
    counts, n_tokens, denominator = _token_counts(cfg, dist, micro)
    local_tokens = sum(counts)
    if n_tokens == 0:
        raise TrainError(f"stage {stage.name}: no policy tokens with behaviour log-probs to learn from")
    # the other normalisers are collectives too: every rank computes them, whatever its shard holds
    obs_denominator = n_tokens + _all_sum(dist, sum(float(_observation_tokens(b["attention_mask"], b["loss_mask"]).sum())
                                                    for b in micro)) if stage.loss_on_observations else 0.0
    n_sequences = _all_sum(dist, float(sum(len(b["episode_id"]) for b in micro))) if stage.algo == "ppo" else 0.0
    if not micro:
        grad_norm = learner.step(learner.zero_loss(), cfg.grad_clip)
        return {"loss": _all_sum(dist, 0.0), "kl": None, "kl_ref": None, "entropy": None, "lr": learner.lr, "grad_norm": grad_norm,
                "policy_tokens": int(n_tokens), "ratio_mean": None, "ratio_max": None, "log_ratio_var": None,
                "staleness_mean": None, "staleness_max": None}
    parts = [_rl_micro_step(cfg, stage, learner, b, staleness, credit, turn_advantages, tokens, n_tokens,
                            obs_denominator or denominator, n_sequences) for b, tokens in zip(micro, counts, strict=True)]
    grad_norm = learner.apply(cfg.grad_clip)
    stale = torch.cat([p["stale"] for p in parts])
    diag = tm.ratio_diagnostics(torch.cat([p["seq_log_ratio"] for p in parts]),
                                torch.cat([p["lengths"] for p in parts]), max_weight=cfg.is_max_weight)

    def batch_mean(key: str, weight: str) -> float | None:
        """Per-micro-batch means, each over its ``weight`` (policy tokens, loss tokens or rows), as one mean over
        the batch."""
        values = [(p[key], p[weight]) for p in parts if p[key] is not None]
        if not values:
            return None
        total = sum(w for _, w in values)
        return sum(v * w for v, w in values) / total if total > 0 else sum(v for v, _ in values) / len(values)

    value_losses = [p["value_loss"] for p in parts if p["value_loss"] is not None]
    return {"loss": _all_sum(dist, sum(p["loss"] for p in parts)),
            "kl": batch_mean("kl", "tokens"), "kl_ref": batch_mean("kl_ref", "tokens"),
            "entropy": sum(p["entropy_sum"] for p in parts) / local_tokens if local_tokens > 0 else float("nan"),
            "lr": learner.lr, "grad_norm": grad_norm, "policy_tokens": int(n_tokens),
            "ratio_mean": diag.get("ratio_mean"), "ratio_max": diag.get("ratio_max"),
            "log_ratio_var": diag.get("log_ratio_var"), "log_ratio_var_slope": diag.get("log_ratio_var_slope"),
            "ess_frac": diag.get("ess_frac"), "frac_truncated": diag.get("frac_truncated"),
            "staleness_mean": float(stale.mean()), "staleness_max": int(stale.max()),
            "clip_frac": batch_mean("clip_frac", "loss_tokens"),
            "is_weight_mean": batch_mean("is_weight_mean", "rows"),
            "value_loss": sum(value_losses) if value_losses else None}


def _observation_tokens(attention_mask: Any, mask: Any) -> Any:
    """The tokens the mask ablation adds to the loss: every token after the policy's first one that it did not
    produce (observations and template glue), padding left out."""
    after_first_action = torch.cumsum(mask, dim=-1) > 0
    return attention_mask.to(mask.device).to(mask.dtype) * (1 - mask) * after_first_action.to(mask.dtype)


def _rl_micro_step(cfg: TrainConfig, stage: StageConfig, learner: Learner, batch: dict[str, Any],
                   staleness: dict[str, int], credit: Credit, turn_advantages: dict[str, list[float]] | None,
                   tokens: float, n_tokens: float, denominator: float, n_sequences: float) -> dict[str, Any]:
    """Forward and backward of one micro-batch (``tokens`` policy tokens) of an RL step; every loss term is divided
    by the whole batch's count (``denominator`` for the policy loss, ``n_tokens`` policy tokens for the KL terms,
    ``n_sequences`` for PPO's value loss), so the micro-batches' gradients add up to the batch's. Returns what the
    step logs."""
    dev = learner.device
    out = learner.forward(batch, cfg.temperature)
    mask = batch["loss_mask"].to(dev)
    if not bool(batch["has_behavior_logprobs"].all()):
        raise TrainError(f"stage {stage.name}: an episode without behaviour log-probs reached the RL loss "
                         f"({[e for e, h in zip(batch['episode_id'], batch['has_behavior_logprobs'], strict=True) if not h][:1]})")
    old = batch["behavior_logprobs"].to(dev)
    stale = torch.tensor([staleness[e] for e in batch["episode_id"]], dtype=torch.float32, device=dev)
    seq_log_ratio = tm.sequence_log_ratio(out["logp"].detach(), old, mask)
    lengths = mask.sum(-1)
    value_loss = None
    if stage.algo == "ppo":
        advantages, value_loss = _gae_advantages(cfg, out, batch, credit, mask)
        value_loss = value_loss * (len(batch["episode_id"]) / n_sequences)
    elif turn_advantages is None:
        advantages = batch["advantage"].to(dev).float()
    # pi_prox: for an episode the learner sampled at this iteration's start (staleness 0) it is the behaviour
    # policy itself; a stale one is re-scored by the frozen copy made when the iteration started.
    prox = old
    if cfg.policy_loss == "clip" and bool((stale > 0).any()):
        prox = torch.where((stale > 0)[:, None], learner.proximal_logprobs(batch, cfg.temperature), old)
    loss_mask, behaviour = mask, old
    if stage.loss_on_observations:  # the mask ablation: a wrong loss mask, on purpose
        loss_mask, behaviour, prox = _with_observations(batch, out["logp"], mask, old, prox)
    if stage.algo != "ppo" and turn_advantages is not None:  # R2: per-turn advantages on each turn's tokens
        advantages = _turn_advantage_tokens(batch, turn_advantages, loss_mask, stage.loss_on_observations)
    loss, stats = policy_objective(cfg, out["logp"], prox, behaviour, advantages, loss_mask, denominator)
    # the KL terms are token means over the whole batch: this micro-batch's mean times its share of its tokens
    share = tokens / n_tokens
    kl = tm.kl_to_behavior(out["logp"], old, mask)
    if cfg.kl_coef:
        loss = loss + cfg.kl_coef * (kl * share)
    kl_ref = None
    if stage.ref_kl_coef:  # the KL penalty to the stage's start (docs/training.md, "The loss")
        kl_ref = tm.kl_to_reference(out["logp"], learner.reference_logprobs(batch, cfg.temperature), mask)
        loss = loss + stage.ref_kl_coef * (kl_ref * share)
    if value_loss is not None:
        loss = loss + cfg.value_coef * value_loss
    learner.backward(loss)
    return {"loss": float(loss.detach()), "kl": float(kl.detach()),
            "kl_ref": None if kl_ref is None else float(kl_ref.detach()), "tokens": tokens,
            "loss_tokens": float(loss_mask.sum()), "rows": float(stale.shape[0]),
            "entropy_sum": float(tm.masked_sum(out["entropy"].detach(), mask)), "stale": stale,
            "seq_log_ratio": seq_log_ratio, "lengths": lengths, "clip_frac": stats.get("clip_frac"),
            "is_weight_mean": stats.get("is_weight_mean"),
            "value_loss": None if value_loss is None else float(value_loss.detach())}


def _gae_advantages(cfg: TrainConfig, out: dict[str, Any], batch: dict[str, Any], credit: Credit,
                    mask: Any) -> tuple[Any, Any]:
    """PPO's per-token advantages: the value head read at the last context token before each policy turn (the
    history h_t), GAE over environment turns (19.4) with each policy turn's reward (``Credit.turn_rewards``: the
    terminal part on the last turn, a process reward on the turn that earned it), bootstrapped from the value
    after the last observation when the episode was truncated (whose potential, under ``potential`` shaping, is
    then kept: the bootstrap values the shaped continuation)."""
    values = out["values"]
    token_turn = batch["token_turn"].to(values.device)
    # a turn starts at its first generated token: under a grammar the first loss token may come after a forced
    # prefix (generated_turn marks every generated token; token_turn only the loss tokens)
    generated = batch.get("generated_turn")
    turn_of = generated.to(values.device) if generated is not None else token_turn
    lengths = batch["attention_mask"].sum(-1)
    adv_rows, value_terms = [], []
    for b in range(values.shape[0]):
        k_turns = int(batch["n_policy_turns"][b])
        starts = [int(((turn_of[b] == k) if bool((turn_of[b] == k).any()) else (token_turn[b] == k)).nonzero()[0])
                  for k in range(k_turns)]
        v = torch.stack([values[b, s - 1] for s in starts]) if starts else values.new_zeros(0)
        terminated = bool(batch["terminated"][b])
        rewards = credit.turn_rewards(batch["episode_id"][b], k_turns, end_correction=terminated).to(
            device=values.device, dtype=torch.float32)
        boot = 0.0 if terminated else float(values[b, int(lengths[b]) - 1].detach())
        adv, ret = tm.gae(rewards, v.detach(), cfg.gamma, cfg.gae_lambda, terminated=terminated,
                          bootstrap_value=boot)
        adv_rows.append(adv)
        value_terms.append(((v - ret) ** 2).mean() if k_turns else values.new_zeros(()))
    k_max = max((int(a.shape[0]) for a in adv_rows), default=0)
    turn_adv = torch.zeros(values.shape[0], max(1, k_max), device=values.device)
    for b, a in enumerate(adv_rows):
        turn_adv[b, :a.shape[0]] = a
    return tm.turns_to_tokens(turn_adv, token_turn, mask), torch.stack(value_terms).mean()


__all__ = ["Dist", "Learner", "StageResult", "TrainError", "TrainLog", "TrainResult", "init_distributed", "train"]
