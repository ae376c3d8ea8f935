"""Streaming and assembly: ``LakeTrajectories``, the trainer's torch ``IterableDataset`` over a selection.

It shards the selected episodes across data-parallel ranks and dataloader workers, streams the ``turns``
table's files in Arrow record batches (only the needed columns, only the shard's episode ids, row groups skipped
by their ``episode_id`` statistics), assembles an episode once all its ``n_turns`` rows are in, and yields one
sample per episode (or per policy turn for trimmed contexts) built by ``samples.SampleBuilder``.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from torch.utils.data import IterableDataset, get_worker_info

from trajlake.errors import TrajlakeError
from trajlake.lake.store import LakeArg, as_lake
from trajlake.render.grammar import Grammar
from trajlake.schema import PARQUET_SCHEMA_KEY, check_schema_version
from trajlake.schemas.vocab import Actor
from trajlake.train.data.samples import (
    RetokenizationError,
    SampleBuilder,
    TrainDataError,
    Turn,
    check_alignment,
    fingerprint_key,
    where,
    whole_exact,
)
from trajlake.train.data.selection import (
    ALL_EPISODES,
    Selection,
    pinned_versions,
    select_episodes,
)

_LIGHT_COLUMNS = ("episode_id", "turn_idx", "actor", "role", "tokenizer_id", "context_dropped_hash",
                  "context_strategy", "action_schema", "token_ids", "loss_mask", "behavior_logprobs")
"""Turn columns always read; ``raw_content`` is added only for row groups holding an episode to re-render."""

SAMPLE_KEYS: tuple[str, ...] = (
    "episode_id", "group_id", "task_id", "input_ids", "loss_mask", "behavior_logprobs", "token_turn",
    "n_policy_turns", "advantage", "reward", "terminated", "policy_version", "policy_lag", "retokenized",
    "generated_turn", "grammar")
"""Keys of every sample (see docs/training.md, "Reading the lake")."""


@dataclass
class _Open:
    """An episode whose turn rows are still being read."""

    n_turns: int
    turns: dict[int, Turn] = field(default_factory=dict)


def _list_parts(arr: pa.Array, dtype: Any) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """(flat values, offsets, is_null) of a list column, without a Python object per element."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return values, offsets, nulls


def _only(ids: pa.Array | pa.ChunkedArray, wanted: Mapping[str, Any]) -> pa.Array | pa.ChunkedArray | bool | None:
    """A filter keeping the rows whose episode id is in ``wanted``: None when none is, True when all are. The
    membership test runs over the batch's distinct ids (a few hundred), so its cost does not grow with the
    shard (an Arrow ``is_in`` would hash the shard's whole id set for every batch)."""
    distinct = pc.unique(ids).to_pylist()
    keep = [i for i in distinct if i in wanted]
    if not keep:
        return None
    if len(keep) == len(distinct):
        return True
    return pc.is_in(ids, value_set=pa.array(keep, pa.string()))


class LakeTrajectories(IterableDataset[dict[str, Any]]):
    """Trajectories of a lake selection for training (see the module docstring and docs/training.md).

    ``tokenizer``: the trainer's tokenizer (a model or tokenizer folder, or a loaded Hugging Face tokenizer).
    Episodes recorded with the same tokenizer and chat template (the ``tok`` and ``tmpl`` hashes of their
    ``tokenizer_id``) are used token for token; the others are re-rendered with it. Without one, stored ids are
    used when every turn carries them from one real tokenizer, and a text-only or byte-token episode is an error.

    ``advantages``: per ``episode_id`` (NaN in the sample when absent). ``max_length``: longer samples are
    skipped and counted (never cut: a cut episode would keep its reward). ``rank``/``world_size`` and the
    dataloader's workers shard the episodes (no overlap, the union is the whole selection). ``episodes``: an
    already selected table (``select_episodes``'s columns), instead of reading ``selection`` again.
    ``on_mismatch``: what to do with a ``RetokenizationError`` ("raise" or "skip" and count). ``batch_rows``:
    turn rows per Arrow record batch.

    The table versions are pinned when the dataset is built (``selection.as_of``, else the versions then), so
    every epoch and worker reads the same snapshot; data-parallel ranks that build their datasets at different
    times should pass the same ``as_of`` (or the same ``episodes`` table and ``as_of``).

    ``stats`` counts what the last iterator did: n_episodes (episodes assembled), n_samples, n_tokens and
    n_policy_tokens (of the yielded samples), n_retokenized (episodes re-rendered), n_skipped_too_long (samples),
    n_skipped_mismatch (episodes). A dataloader worker process keeps its own copy: with ``num_workers > 0`` the
    main process's ``stats`` stay empty.
    """

    def __init__(self, lake: LakeArg, selection: Selection = ALL_EPISODES, *,
                 tokenizer: str | Path | Any | None = None, advantages: Mapping[str, float] | None = None,
                 max_length: int | None = None, rank: int = 0, world_size: int = 1,
                 episodes: pa.Table | None = None, on_mismatch: Literal["raise", "skip"] = "raise",
                 batch_rows: int = 8192):
        super().__init__()
        if not 0 <= rank < world_size:
            raise TrajlakeError(f"rank {rank} is not in 0..world_size-1 (world_size {world_size})")
        if on_mismatch not in ("raise", "skip"):
            raise TrajlakeError(f"on_mismatch: 'raise' or 'skip', not {on_mismatch!r}")
        if batch_rows < 1:
            raise TrajlakeError(f"batch_rows must be >= 1, not {batch_rows}")
        self.lake = as_lake(lake)
        self.selection = selection
        self.versions = pinned_versions(self.lake, selection.as_of)
        pinned = dataclasses.replace(selection, as_of=dict(self.versions))
        table = select_episodes(self.lake, pinned) if episodes is None else episodes
        missing = [c for c in ("episode_id", "n_turns") if c not in table.column_names]
        if missing:
            raise TrajlakeError(f"episodes table lacks column(s) {', '.join(missing)} (use select_episodes)")
        self.episodes = table.take(pc.sort_indices(table, sort_keys=[("episode_id", "ascending")]))
        # The turns' file list is read here, in the process that builds the dataset: delta-rs's runtime does not
        # survive a fork, so dataloader workers only read Parquet files.
        runs = sorted(set(self.episodes["run_id"].to_pylist())) if "run_id" in self.episodes.column_names else None
        self.turn_files = self.lake.files("turns", self.versions["turns"],
                                          [("run_id", "in", runs)] if runs is not None else None)
        self.run_grammars, self.grammars, self.run_env_kwargs = self._run_configs(runs)
        self.advantages = dict(advantages or {})
        self.max_length = max_length
        self.rank, self.world_size = rank, world_size
        self.on_mismatch = on_mismatch
        self.batch_rows = batch_rows
        self.builder = SampleBuilder(tokenizer)
        self.tokenizer: Any = self.builder.tokenizer
        self.tokenizer_name = self.builder.tokenizer_name
        self.tokenizer_key = self.builder.tokenizer_key
        self.stats: dict[str, int] = self._fresh_stats()

    def renderer(self) -> Any:
        """The ``ChatRenderer`` of the trainer's tokenizer (built on first use)."""
        return self.builder.renderer()

    def _run_configs(self, runs: Sequence[str] | None
                     ) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, Any]]]:
        """({run_id: grammar sha256}, {sha256: grammar text}) of the selected runs that decoded under a grammar
        (``runs.config.grammar``), and {run_id: env_kwargs} of those that set environment arguments (what a
        re-rendered system prompt lists: memory adds its tools), at the pinned runs version."""
        by_run: dict[str, str] = {}
        texts: dict[str, str] = {}
        env_kwargs: dict[str, dict[str, Any]] = {}
        wanted = None if runs is None else set(runs)
        for _, t in self.lake.iter_tables("runs", self.versions.get("runs"), columns=["run_id", "config"]):
            for run_id, config in zip(t["run_id"].to_pylist(), t["config"].to_pylist(), strict=True):
                if wanted is not None and run_id not in wanted:
                    continue
                try:
                    cfg = json.loads(config or "{}")
                except ValueError:
                    continue  # not ours to judge here; such a run has no grammar
                kwargs = cfg.get("env_kwargs") if isinstance(cfg, dict) else None
                if isinstance(kwargs, dict) and kwargs:
                    env_kwargs[str(run_id)] = kwargs
                g = cfg.get("grammar") if isinstance(cfg, dict) else None
                if isinstance(g, dict) and g.get("text"):
                    grammar = Grammar.from_config(g)
                    by_run[str(run_id)] = grammar.sha256
                    texts[grammar.sha256] = grammar.text
        return by_run, texts, env_kwargs

    @staticmethod
    def _fresh_stats() -> dict[str, int]:
        return dict.fromkeys(("n_episodes", "n_samples", "n_tokens", "n_policy_tokens", "n_retokenized",
                              "n_skipped_too_long", "n_skipped_mismatch"), 0)

    def __len__(self) -> int:
        """Episodes in the whole selection (all ranks and workers; a trimmed episode yields several samples)."""
        return self.episodes.num_rows

    # -- sharding ------------------------------------------------------------------------------------------------
    def shard_indices(self, worker_id: int = 0, num_workers: int = 1) -> range:
        """Rows of the sorted selection that shard ``rank * num_workers + worker_id`` of
        ``world_size * num_workers`` reads: every ``n_shards``-th episode from its own offset."""
        n_shards = self.world_size * num_workers
        return range(self.rank * num_workers + worker_id, self.episodes.num_rows, n_shards)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        self.stats = stats = self._fresh_stats()
        mine = self.episodes.take(pa.array(list(self.shard_indices(wid, nw)), pa.int64()))
        return self._iterate(mine, stats)

    # -- streaming the turns -------------------------------------------------------------------------------------
    def _iterate(self, mine: pa.Table, stats: dict[str, int]) -> Iterator[dict[str, Any]]:
        if mine.num_rows == 0:
            return
        meta = {r["episode_id"]: r for r in mine.to_pylist()}
        ids_sorted = sorted(meta)
        open_: dict[str, _Open] = {}
        for eid, r in meta.items():
            if int(r["n_turns"]) == 0:
                stats["n_episodes"] += 1  # nothing to learn from an episode without turns
            else:
                open_[eid] = _Open(int(r["n_turns"]))
        runs = {r["run_id"] for r in meta.values()} if "run_id" in mine.column_names else None
        self.builder.new_pass()
        turns_version = self.versions["turns"]
        for f in self.turn_files:
            if not open_:
                break
            run = f.partition_values.get("run_id")
            if runs is not None and run is not None and run not in runs:
                continue  # another shard's partition
            path = self.lake.abs_path("turns", f.path)
            # the lake's filesystem: None (plain paths) locally, S3 for a lake on object storage
            with pq.ParquetFile(path, page_checksum_verification=True, filesystem=self.lake.filesystem) as pf:
                md = pf.schema_arrow.metadata or {}
                check_schema_version(md.get(PARQUET_SCHEMA_KEY), path)
                names = set(pf.schema_arrow.names)
                leaves = pf.metadata.schema
                eid_col = next((i for i in range(len(leaves)) if leaves.column(i).path == "episode_id"), -1)
                for rg in range(pf.num_row_groups):
                    if not self._row_group_may_hold(pf, rg, eid_col, ids_sorted):
                        continue
                    need_raw = "raw_content" in names and self._needs_raw(pf, rg, open_)
                    cols = [c for c in (*_LIGHT_COLUMNS, *(("raw_content",) if need_raw else ())) if c in names]
                    for batch in pf.iter_batches(batch_size=self.batch_rows, row_groups=[rg], columns=cols):
                        keep = _only(batch.column("episode_id"), open_)
                        if keep is None:
                            continue
                        if keep is not True:
                            batch = batch.filter(keep)
                        done = self._add_rows(batch, open_, need_raw, (path, rg))
                        for eid in done:
                            yield from self._episode_samples(meta[eid], open_.pop(eid), stats)
                        for ep in open_.values():  # still open: let go of this batch's buffers
                            for t in ep.turns.values():
                                t.own()
        for eid, ep in sorted(open_.items()):
            have = set(ep.turns)
            gone = next(i for i in range(ep.n_turns) if i not in have)
            raise TrainDataError(f"{where(eid, gone, 'turn_idx')}: missing (the episode has n_turns "
                                 f"{ep.n_turns}; {len(have)} turn rows found at turns version {turns_version})")

    @staticmethod
    def _row_group_may_hold(pf: pq.ParquetFile, rg: int, col: int, ids_sorted: list[str]) -> bool:
        """False when the row group's episode_id statistics exclude every id of the shard (predicate pushdown)."""
        if col < 0:
            return True
        st = pf.metadata.row_group(rg).column(col).statistics
        if st is None or not st.has_min_max:
            return True
        lo, hi = st.min, st.max
        if isinstance(lo, bytes):
            lo, hi = lo.decode("utf-8", "replace"), hi.decode("utf-8", "replace")
        i = bisect.bisect_left(ids_sorted, lo)
        return i < len(ids_sorted) and ids_sorted[i] <= hi

    def _needs_raw(self, pf: pq.ParquetFile, rg: int, open_: Mapping[str, _Open]) -> bool:
        """Whether a row group holds a turn of the shard that is re-rendered or trimmed (needs ``raw_content``):
        a turn without token ids, with a tokenizer other than the trainer's, or with a dropped context."""
        names = pf.schema_arrow.names
        cols = [c for c in ("episode_id", "tokenizer_id", "context_dropped_hash") if c in names]
        t = pf.read_row_group(rg, columns=cols)
        keep = _only(t["episode_id"], open_)
        if keep is None:
            return False
        if keep is not True:
            t = t.filter(keep)
        if "context_dropped_hash" in t.column_names and t["context_dropped_hash"].null_count < t.num_rows:
            return True
        if self.tokenizer_key is None:
            return False  # nothing is re-rendered without the trainer's tokenizer
        if "tokenizer_id" not in t.column_names or t["tokenizer_id"].null_count:
            return True
        return any(fingerprint_key(tid) != self.tokenizer_key for tid in pc.unique(t["tokenizer_id"]).to_pylist())

    def _add_rows(self, batch: pa.RecordBatch, open_: dict[str, _Open], raw_read: bool,
                  source: tuple[str, int]) -> list[str]:
        """Add a filtered batch's rows to their open episodes; returns the episodes now complete."""
        n = batch.num_rows
        names = batch.schema.names

        def strings(col: str) -> list[Any]:
            return batch.column(col).to_pylist() if col in names else [None] * n

        eids = batch.column("episode_id").to_pylist()
        tidx = batch.column("turn_idx").to_numpy(zero_copy_only=False)
        actor, role, tok, dropped = strings("actor"), strings("role"), strings("tokenizer_id"), \
            strings("context_dropped_hash")
        strategy, schema_, raw = strings("context_strategy"), strings("action_schema"), strings("raw_content")
        lists: dict[str, tuple[Any, Any, Any] | None] = {}
        for col, dtype in (("token_ids", np.int32), ("loss_mask", np.int8), ("behavior_logprobs", np.float32)):
            lists[col] = _list_parts(batch.column(col), dtype) if col in names else None
        done: list[str] = []
        for i in range(n):
            eid = eids[i]
            ep = open_.get(eid)
            if ep is None:
                continue  # an episode already complete (an identical duplicate row is ignored)
            k = int(tidx[i])
            if not 0 <= k < ep.n_turns:
                raise TrainDataError(f"{where(eid, k, 'turn_idx')}: outside 0..{ep.n_turns - 1} (n_turns "
                                     f"{ep.n_turns})")
            arrays: list[Any] = []
            for col in ("token_ids", "loss_mask", "behavior_logprobs"):
                parts = lists[col]
                if parts is None or parts[2][i]:
                    arrays.append(None)
                else:
                    values, offsets, _ = parts
                    arrays.append(values[offsets[i]:offsets[i + 1]])
            ep.turns[k] = Turn(k, actor[i], role[i], tok[i], dropped[i], strategy[i], schema_[i], raw[i],
                                arrays[0], arrays[1], arrays[2], raw_read, source,
                                filesystem=self.lake.filesystem)
            if len(ep.turns) == ep.n_turns:
                done.append(eid)
        return done

    # -- one episode -> samples ----------------------------------------------------------------------------------
    def _episode_samples(self, meta: Mapping[str, Any], ep: _Open, stats: dict[str, int]
                         ) -> Iterator[dict[str, Any]]:
        eid = str(meta["episode_id"])
        turns = [ep.turns[i] for i in range(ep.n_turns)]
        stats["n_episodes"] += 1
        check_alignment(eid, turns)
        try:
            if any(t.dropped_hash for t in turns):
                self._fill_raw(eid, turns)
                pieces = self.builder.trimmed(eid, turns)
                retok = False
            elif self.builder.exact(eid, turns):
                pieces = [whole_exact(turns)]
                retok = False
            else:
                self._fill_raw(eid, turns)
                pieces = [self.builder.rerender(eid, str(meta.get("env_id") or ""), turns,
                                                self.run_env_kwargs.get(str(meta.get("run_id"))))]
                retok = True
                stats["n_retokenized"] += 1
        except RetokenizationError:
            if self.on_mismatch == "raise":
                raise
            stats["n_skipped_mismatch"] += 1
            return
        k_total = sum(1 for t in turns if t.actor == Actor.POLICY)
        lag = meta.get("policy_lag")
        reward = meta.get("reward_total")
        adv = self.advantages.get(eid)
        # the grammar whose masks the learner rebuilds: only for stored ids (a re-rendered episode's tokens were
        # not sampled under it)
        grammar = None if retok else self.run_grammars.get(str(meta.get("run_id")))
        for ids, mask, lp, tturn, policy_turn, gturn in pieces:
            if self.max_length is not None and ids.shape[0] > self.max_length:
                stats["n_skipped_too_long"] += 1
                continue
            stats["n_samples"] += 1
            stats["n_tokens"] += int(ids.shape[0])
            stats["n_policy_tokens"] += int(mask.sum(dtype=np.int64))
            yield {
                "episode_id": eid, "group_id": meta.get("group_id"), "task_id": meta.get("task_id"),
                "input_ids": ids, "loss_mask": mask, "behavior_logprobs": lp, "token_turn": tturn,
                "n_policy_turns": k_total, "advantage": math.nan if adv is None else float(adv),
                "reward": math.nan if reward is None else float(reward), "terminated": bool(meta.get("terminated")),
                "policy_version": meta.get("policy_version_start"), "policy_lag": None if lag is None else int(lag),
                "retokenized": retok, "generated_turn": gturn, "grammar": grammar, "policy_turn": policy_turn,
                "run_id": meta.get("run_id"), "success": meta.get("success"), "truncated": meta.get("truncated"),
            }

    @staticmethod
    def _fill_raw(eid: str, turns: Sequence[Turn]) -> None:
        """Read ``raw_content`` of turns whose row group was read without it (an episode spanning row groups)."""
        lacking: dict[tuple[str, int], list[Turn]] = {}
        for t in turns:
            if not t.raw_read:
                lacking.setdefault(t.source, []).append(t)
        for (path, rg), ts in lacking.items():
            with pq.ParquetFile(path, page_checksum_verification=True, filesystem=ts[0].filesystem) as pf:
                tab = pf.read_row_group(rg, columns=["episode_id", "turn_idx", "raw_content"])
            tab = tab.filter(pc.equal(tab["episode_id"], pa.scalar(eid)))
            raw = dict(zip(tab["turn_idx"].to_pylist(), tab["raw_content"].to_pylist(), strict=True))
            for t in ts:
                t.raw, t.raw_read = raw.get(t.idx), True


__all__ = ["SAMPLE_KEYS", "LakeTrajectories"]
