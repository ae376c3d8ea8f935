"""The trainer's lake reader: a torch ``IterableDataset`` of trajectories streamed from the lake's own tables.

``select_episodes`` picks episodes (runs, splits, environment versions, policy versions, success, terminated only,
maximum policy lag, a time-travel pin) from the small ``episodes`` table. ``LakeTrajectories`` shards that
selection across data-parallel ranks and dataloader workers, streams the ``turns`` table's files in Arrow record
batches (only the needed columns, only the shard's episode ids, row groups skipped by their ``episode_id``
statistics), assembles an episode once all its ``n_turns`` rows are in, and yields one sample per episode (or per
policy turn for trimmed contexts) as numpy arrays. ``pad_collate`` and ``pack`` make batches of them.

Token ids are used exactly as recorded (token in, token out) when the episode was recorded with the trainer's
tokenizer and chat template; otherwise (text-only or byte-token episodes, another model's tokenizer) the episode
is re-rendered from ``raw_content`` exactly as an ``hf:`` policy would have seen it, and the re-rendered pieces must
concatenate to the tokenization of the whole text (the prefix check). See docs/training.md, "Reading the lake".
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset, get_worker_info

from trajlake.envs.policy import BYTE_TOKENIZER_ID
from trajlake.errors import TrajlakeError
from trajlake.lake.store import Lake
from trajlake.schema import PARQUET_SCHEMA_KEY, arrow_schema, check_schema_version
from trajlake.schemas.vocab import Actor, Role

EPISODE_COLUMNS: tuple[str, ...] = (
    "episode_id", "run_id", "task_id", "env_id", "env_version", "env_seed", "group_id", "attempt",
    "policy_version_start", "policy_lag", "success", "terminated", "truncated", "termination_reason",
    "reward_total", "reward_components", "cost_usd", "n_turns", "n_policy_tokens", "split")
"""Columns of ``select_episodes``'s table (``split`` in addition to the ones the trainer uses)."""

_LIGHT_COLUMNS = ("episode_id", "turn_idx", "actor", "role", "tokenizer_id", "context_dropped_hash",
                  "context_strategy", "action_schema", "token_ids", "loss_mask", "behavior_logprobs")
"""Turn columns always read; ``raw_content`` is added only for row groups holding an episode to re-render."""

SAMPLE_KEYS: tuple[str, ...] = (
    "episode_id", "group_id", "task_id", "input_ids", "loss_mask", "behavior_logprobs", "token_turn",
    "n_policy_turns", "advantage", "reward", "terminated", "policy_version", "policy_lag", "retokenized")


class TrainDataError(TrajlakeError):
    """Turn rows the trainer cannot use as they are (missing turn, misaligned arrays, a text-only episode without
    the trainer's tokenizer); the message names the episode, the turn and the field."""


class RetokenizationError(TrainDataError):
    """An episode re-rendered with the trainer's tokenizer breaks the prefix property (its per-turn pieces do not
    concatenate to the tokenization of the whole text), or a trimmed context was recorded with another
    tokenizer; ``on_mismatch="skip"`` skips and counts such episodes instead."""


# -- selecting episodes ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Selection:
    """Which episodes to read. Every field is optional; a None field selects everything. A field that takes a
    sequence also accepts one string (one value)."""

    runs: Sequence[str] | None = None
    """``episodes.run_id`` in this set (also prunes the partitions read)."""
    splits: Sequence[str] | None = None
    """``episodes.split`` in this set (train, dev, hidden, test, unknown)."""
    env_versions: Sequence[str] | None = None
    """``episodes.env_version`` in this set."""
    policy_versions: Sequence[str] | None = None
    """``episodes.policy_version_start`` in this set (episodes are pinned to the version they started with)."""
    success: bool | None = None
    """True: only successful episodes (B1 trains on successes); False: only graded failures. Ungraded episodes
    (``success`` null) are in neither set."""
    terminated_only: bool = False
    """Only episodes that ended by task semantics (drops truncated ones)."""
    max_policy_lag: int | None = None
    """``episodes.policy_lag`` <= this. A null lag (unknown: offline data, older schema versions) counts as 0, so
    pre-recorded data is not dropped by a lag bound meant for the learner's own rollouts."""
    as_of: str | dict[str, int] | None = None
    """Time-travel pin, as ``Lake.resolve_as_of`` (``table=version,...``, a JSON object, an ISO-8601 instant).
    None: the tables' versions when the selection is read."""


def _values(name: str, v: Sequence[str] | None) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        return [v]
    out = list(v)
    if not all(isinstance(x, str) for x in out):
        raise TrajlakeError(f"Selection.{name}: expected strings, got {out!r}")
    return out


def open_lake_arg(lake: str | Path | Lake) -> Lake:
    return lake if isinstance(lake, Lake) else Lake.open(lake)


def _pinned(lake: Lake, as_of: str | dict[str, int] | None) -> dict[str, int]:
    """Versions of every table: the pin, else the current ones (so every later read sees the same snapshot)."""
    return lake.resolve_as_of(as_of) or lake.versions()


def _selection_mask(t: pa.Table, s: Selection) -> pa.ChunkedArray | pa.Array | None:
    conds: list[Any] = []
    for col, name in (("run_id", "runs"), ("split", "splits"), ("env_version", "env_versions"),
                      ("policy_version_start", "policy_versions")):
        vals = _values(name, getattr(s, name))
        if vals is not None:
            conds.append(pc.is_in(t[col], value_set=pa.array(vals, pa.string())))
    if s.success is not None:
        conds.append(pc.equal(t["success"], pa.scalar(bool(s.success))))
    if s.terminated_only:
        conds.append(pc.equal(t["terminated"], pa.scalar(True)))
    if s.max_policy_lag is not None:
        lag = pc.fill_null(t["policy_lag"], pa.scalar(0, pa.int32()))
        conds.append(pc.less_equal(lag, pa.scalar(int(s.max_policy_lag), pa.int32())))
    if not conds:
        return None
    mask = conds[0]
    for c in conds[1:]:
        mask = pc.and_kleene(mask, c)
    return pc.fill_null(mask, False)


def _episode_schema() -> pa.Schema:
    full = arrow_schema("episodes")
    return pa.schema([full.field(c).with_nullable(True) for c in EPISODE_COLUMNS])


def select_episodes(lake: str | Path | Lake, selection: Selection = Selection()) -> pa.Table:
    """One row per selected episode, sorted by ``episode_id``, with the columns ``EPISODE_COLUMNS``. Reads only
    those columns of the ``episodes`` table (never the turns), pruning ``run_id`` partitions when ``runs`` is
    given, at the pinned version (``selection.as_of``)."""
    lk = open_lake_arg(lake)
    version = _pinned(lk, selection.as_of)["episodes"]
    runs = _values("runs", selection.runs)
    pfilter = [("run_id", "in", runs)] if runs is not None else None
    schema = _episode_schema()
    parts = []
    for _, t in lk.iter_tables("episodes", version, columns=list(EPISODE_COLUMNS), partition_filters=pfilter):
        mask = _selection_mask(t, selection)
        if mask is not None:
            t = t.filter(mask)
        if t.num_rows:
            parts.append(t.select(list(EPISODE_COLUMNS)).cast(schema))
    if not parts:
        return schema.empty_table()
    table = pa.concat_tables(parts)
    return table.take(pc.sort_indices(table, sort_keys=[("episode_id", "ascending")]))


# -- the trainer's tokenizer -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def _fingerprint_key(tokenizer_id: str) -> tuple[str, str] | None:
    """(tok, tmpl) hashes of a policy-recorded fingerprint; None for other ids (byte tokens, imports, demo)."""
    if "|tok:" not in tokenizer_id:
        return None
    from trajlake.render.chat import split_fingerprint

    parts = split_fingerprint(tokenizer_id)
    return parts.get("tok", ""), parts.get("tmpl", "")


def _load_tokenizer(tokenizer: Any) -> tuple[Any, str]:
    if not isinstance(tokenizer, (str, Path)):
        return tokenizer, str(getattr(tokenizer, "name_or_path", "") or "tokenizer")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise TrajlakeError("re-rendering episodes needs transformers: pip install 'trajlake[lm]'") from e
    path = Path(tokenizer)
    if not path.exists():
        raise TrajlakeError(f"tokenizer {path}: no such folder (give the trainer's model or tokenizer folder)")
    try:
        return AutoTokenizer.from_pretrained(str(path)), path.name
    except Exception as e:  # transformers raises OSError, ValueError, ... for unreadable folders
        raise TrajlakeError(f"tokenizer {path}: cannot load: {str(e).splitlines()[0] if str(e) else e!r}") from e


# -- one episode's turns ---------------------------------------------------------------------------------------

@dataclass
class _Turn:
    idx: int
    actor: str
    role: str
    tokenizer_id: str | None
    dropped_hash: str | None
    strategy: str | None
    action_schema: str | None
    raw: str | None
    ids: npt.NDArray[np.int32] | None
    mask: npt.NDArray[np.int8] | None
    logprobs: npt.NDArray[np.float32] | None
    raw_read: bool
    """Whether ``raw_content`` was read with the row (see ``_needs_raw``; ``_fill_raw`` reads it later)."""
    source: tuple[str, int]
    """(file, row group) the row came from."""
    owned: bool = False
    filesystem: Any = None
    """The lake's ``pyarrow.fs`` filesystem for ``source`` (None: a local path)."""

    def own(self) -> None:
        """Copy the array slices, so an episode still open at the end of a batch does not keep the batch."""
        if self.owned:
            return
        self.owned = True
        if self.ids is not None:
            self.ids = self.ids.copy()
        if self.mask is not None:
            self.mask = self.mask.copy()
        if self.logprobs is not None:
            self.logprobs = self.logprobs.copy()


@dataclass
class _Open:
    n_turns: int
    turns: dict[int, _Turn] = field(default_factory=dict)


def _list_parts(arr: pa.Array, dtype: Any) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """(flat values, offsets, is_null) of a list column, without a Python object per element."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return values, offsets, nulls


_Piece = tuple[Any, Any, Any, Any, "int | None"]
"""(input_ids, loss_mask, behavior_logprobs, token_turn, policy_turn) of one sample."""


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


def _where(episode_id: str, turn: int | None, column: str | None = None) -> str:
    out = f"episode {episode_id}"
    if turn is not None:
        out += f" turn {turn}"
    return out + (f": turns.{column}" if column else "")


# -- the dataset -----------------------------------------------------------------------------------------------

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

    def __init__(self, lake: str | Path | Lake, selection: Selection = Selection(), *,
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
        self.lake = open_lake_arg(lake)
        self.selection = selection
        self.versions = _pinned(self.lake, selection.as_of)
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
        self.advantages = dict(advantages or {})
        self.max_length = max_length
        self.rank, self.world_size = rank, world_size
        self.on_mismatch = on_mismatch
        self.batch_rows = batch_rows
        self.tokenizer: Any = None
        self.tokenizer_name = ""
        self.tokenizer_key: tuple[str, str] | None = None
        if tokenizer is not None:
            from trajlake.render.chat import tokenizer_fingerprint

            self.tokenizer, self.tokenizer_name = _load_tokenizer(tokenizer)
            self.tokenizer_key = _fingerprint_key(tokenizer_fingerprint(self.tokenizer, self.tokenizer_name))
        self._renderer: Any = None
        self._seen_tokenizer: tuple[str, Any] | None = None
        self._tools: dict[str, Mapping[str, Mapping[str, Any]] | None] = {}
        self.stats: dict[str, int] = self._fresh_stats()

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
        self._seen_tokenizer = None
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
            raise TrainDataError(f"{_where(eid, gone, 'turn_idx')}: missing (the episode has n_turns "
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
        return any(_fingerprint_key(tid) != self.tokenizer_key for tid in pc.unique(t["tokenizer_id"]).to_pylist())

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
                raise TrainDataError(f"{_where(eid, k, 'turn_idx')}: outside 0..{ep.n_turns - 1} (n_turns "
                                     f"{ep.n_turns})")
            arrays: list[Any] = []
            for col in ("token_ids", "loss_mask", "behavior_logprobs"):
                parts = lists[col]
                if parts is None or parts[2][i]:
                    arrays.append(None)
                else:
                    values, offsets, _ = parts
                    arrays.append(values[offsets[i]:offsets[i + 1]])
            ep.turns[k] = _Turn(k, actor[i], role[i], tok[i], dropped[i], strategy[i], schema_[i], raw[i],
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
        self._check_alignment(eid, turns)
        try:
            if any(t.dropped_hash for t in turns):
                pieces = self._trimmed(eid, turns)
                retok = False
            elif self._exact(eid, turns):
                pieces = [self._whole_exact(turns)]
                retok = False
            else:
                pieces = [self._rerender(eid, str(meta.get("env_id") or ""), turns)]
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
        for ids, mask, lp, tturn, policy_turn in pieces:
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
                "retokenized": retok, "policy_turn": policy_turn, "run_id": meta.get("run_id"),
                "success": meta.get("success"), "truncated": meta.get("truncated"),
            }

    @staticmethod
    def _check_alignment(eid: str, turns: Sequence[_Turn]) -> None:
        for t in turns:
            n = None if t.ids is None else t.ids.shape[0]
            for col, arr in (("loss_mask", t.mask), ("behavior_logprobs", t.logprobs)):
                if arr is None:
                    continue
                if n is None:
                    raise TrainDataError(f"{_where(eid, t.idx, col)}: has {arr.shape[0]} values but token_ids "
                                         f"is null")
                if arr.shape[0] != n:
                    raise TrainDataError(f"{_where(eid, t.idx, col)}: has {arr.shape[0]} values, token_ids {n}")
            if t.mask is not None and t.mask.size and (t.mask.max() > 1 or t.mask.min() < 0):
                raise TrainDataError(f"{_where(eid, t.idx, 'loss_mask')}: values other than 0 and 1")

    def _exact(self, eid: str, turns: Sequence[_Turn]) -> bool:
        """Whether the stored ids are used as they are; raises for a text-only episode without a tokenizer."""
        if self.tokenizer_key is not None:
            return all(t.ids is not None and t.tokenizer_id is not None
                       and _fingerprint_key(t.tokenizer_id) == self.tokenizer_key for t in turns)
        first = turns[0].tokenizer_id if turns else None
        for t in turns:
            if t.ids is None or t.tokenizer_id is None or t.tokenizer_id == BYTE_TOKENIZER_ID:
                what = "no token ids" if t.ids is None or t.tokenizer_id is None else "byte tokens"
                raise TrainDataError(f"text-only episode {eid} (turn {t.idx} has {what}): pass the trainer's "
                                     f"tokenizer (LakeTrajectories(..., tokenizer=MODEL_DIR)) to re-render it")
            if _tok_key(t.tokenizer_id) != _tok_key(first):
                raise TrainDataError(f"{_where(eid, t.idx, 'tokenizer_id')}: {t.tokenizer_id!r} differs from turn "
                                     f"0's {first!r}: pass the trainer's tokenizer to re-render the episode")
        assert first is not None
        seen = getattr(self, "_seen_tokenizer", None)
        if seen is None:
            self._seen_tokenizer = (first, _tok_key(first))
        elif seen[1] != _tok_key(first):
            raise TrainDataError(f"{_where(eid, 0, 'tokenizer_id')}: {first!r} differs from {seen[0]!r} of an "
                                 f"earlier episode: pass the trainer's tokenizer so that every episode is in its "
                                 f"vocabulary")
        return True

    @staticmethod
    def _whole_exact(turns: Sequence[_Turn]) -> _Piece:
        ids_parts, mask_parts, lp_parts, turn_parts = [], [], [], []
        k = 0
        for t in turns:
            assert t.ids is not None
            n = t.ids.shape[0]
            ids_parts.append(t.ids)
            m = t.mask if t.mask is not None else np.zeros(n, np.int8)
            mask_parts.append(m)
            lp_parts.append(t.logprobs if t.logprobs is not None else np.full(n, np.nan, np.float32))
            if t.actor == Actor.POLICY:
                turn_parts.append(np.where(m == 1, np.int32(k), np.int32(-1)).astype(np.int32))
                k += 1
            else:
                turn_parts.append(np.full(n, -1, np.int32))
        ids = np.concatenate(ids_parts).astype(np.int64) if ids_parts else np.zeros(0, np.int64)
        mask = np.concatenate(mask_parts).astype(np.int8, copy=False) if mask_parts else np.zeros(0, np.int8)
        lp = np.concatenate(lp_parts).astype(np.float32, copy=True) if lp_parts else np.zeros(0, np.float32)
        lp[mask != 1] = np.nan
        tturn = np.concatenate(turn_parts) if turn_parts else np.zeros(0, np.int32)
        return ids, mask, lp, tturn, None

    # -- trimmed contexts ----------------------------------------------------------------------------------------
    def _trimmed(self, eid: str, turns: Sequence[_Turn]) -> list[_Piece]:
        """One sample per policy turn with token ids: the context its model saw and what it sampled."""
        from trajlake.render.exactness import model_contexts

        self._fill_raw(eid, turns)
        rows = [{"turn_idx": t.idx, "actor": t.actor, "token_ids": t.ids, "tokenizer_id": t.tokenizer_id,
                 "context_dropped_hash": t.dropped_hash, "raw_content": t.raw, "behavior_logprobs": t.logprobs}
                for t in turns]
        try:
            contexts = model_contexts(rows)
        except ValueError as e:
            raise TrainDataError(f"episode {eid}: turns.context_dropped_hash: {e}") from None
        policy_k = {t.idx: k for k, t in enumerate(tt for tt in turns if tt.actor == Actor.POLICY)}
        out: list[_Piece] = []
        for c in contexts:
            t = turns[c.turn_idx]
            kept = [i for i in range(c.turn_idx) if c.dropped is None or not c.dropped[0] <= i < c.dropped[1]]
            for i in [*kept, c.turn_idx]:
                tid = turns[i].tokenizer_id
                ok = tid is not None and (_fingerprint_key(tid) == self.tokenizer_key if self.tokenizer_key
                                          else _tok_key(tid) == _tok_key(t.tokenizer_id))
                if not ok or turns[i].ids is None:
                    raise RetokenizationError(
                        f"{_where(eid, i, 'tokenizer_id')}: the trimmed context of turn {c.turn_idx} was recorded "
                        f"with {tid!r}, not the trainer's tokenizer; a trimmed context is not re-rendered")
            ctx = np.asarray(c.context_ids, np.int64)
            gen = t.ids.astype(np.int64) if t.ids is not None else np.zeros(0, np.int64)
            gmask = t.mask if t.mask is not None else np.zeros(gen.shape[0], np.int8)
            ids = np.concatenate([ctx, gen])
            mask = np.concatenate([np.zeros(ctx.shape[0], np.int8), gmask.astype(np.int8)])
            glp = t.logprobs.astype(np.float32) if t.logprobs is not None else np.full(gen.shape[0], np.nan,
                                                                                        np.float32)
            lp = np.concatenate([np.full(ctx.shape[0], np.nan, np.float32), glp])
            lp[mask != 1] = np.nan
            k = policy_k[c.turn_idx]
            tturn = np.where(mask == 1, np.int32(k), np.int32(-1)).astype(np.int32)
            out.append((ids, mask, lp, tturn, k))
        return out

    @staticmethod
    def _fill_raw(eid: str, turns: Sequence[_Turn]) -> None:
        """Read ``raw_content`` of turns whose row group was read without it (an episode spanning row groups)."""
        lacking: dict[tuple[str, int], list[_Turn]] = {}
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

    # -- re-rendering ------------------------------------------------------------------------------------------
    def _tool_docs(self, env_id: str) -> Mapping[str, Mapping[str, Any]] | None:
        """The environment class's ``tool_docs`` (None: not a registered environment, e.g. an import)."""
        if env_id not in self._tools:
            from trajlake.envs import registry

            try:
                cls = registry.spec(env_id).load()
            except TrajlakeError:
                self._tools[env_id] = None
            else:
                self._tools[env_id] = dict(getattr(cls, "tool_docs", {}) or {})
        return self._tools[env_id]

    def renderer(self) -> Any:
        """The ``ChatRenderer`` of the trainer's tokenizer (built on first use)."""
        if self._renderer is None:
            from trajlake.render.chat import ChatRenderer, TemplateError

            try:
                self._renderer = ChatRenderer(self.tokenizer, self.tokenizer_name)
            except TemplateError as e:
                raise TrajlakeError(f"the trainer's tokenizer cannot re-render episodes: {e}") from None
        return self._renderer

    def _rerender(self, eid: str, env_id: str, turns: Sequence[_Turn]) -> _Piece:
        """The episode as an ``hf:`` policy with the trainer's tokenizer would have seen it, with the prefix check."""
        from trajlake.render.chat import system_prompt
        from trajlake.render.toolcall import format_call, parse_tool_call

        assert self.tokenizer is not None, "_exact raised the text-only error"
        self._fill_raw(eid, turns)
        r = self.renderer()
        first_pol = next((i for i, t in enumerate(turns) if t.actor == Actor.POLICY), len(turns))
        lead = turns[:first_pol]
        tools = self._tool_docs(env_id)
        system_parts = ([system_prompt(tools)] if tools is not None else []) + \
            [t.raw or "" for t in lead if t.role == Role.SYSTEM]
        users = [t for t in lead if t.role != Role.SYSTEM]
        texts: list[str] = []
        pieces: list[list[int]] = []
        owners: list[int] = []
        masks: list[int] = []
        policy_k: list[int] = []
        if lead:
            text = r.initial_text("\n\n".join(system_parts) or None, "\n\n".join(t.raw or "" for t in users))
            texts.append(text)
            pieces.append(r.encode(text))
            owners.append((users[0] if users else lead[0]).idx)
            masks.append(0)
            policy_k.append(-1)
        k = 0
        for t in turns[first_pol:]:
            if t.actor == Actor.POLICY:
                if t.raw is None:
                    raise TrainDataError(f"{_where(eid, t.idx, 'raw_content')}: null on a policy turn of an episode "
                                         f"to re-render")
                parsed = parse_tool_call(t.raw)
                body = format_call(parsed.tool, json.loads(parsed.action)["args"]) if parsed.ok and parsed.tool \
                    else t.raw
                texts.append(body + r.eos_text)
                pieces.append([*r.encode(body), r.eos_id])
                # a turn recorded as not trainable (its stored mask all 0) stays so
                masks.append(0 if t.mask is not None and t.mask.size and not t.mask.any() else 1)
                policy_k.append(k)
                k += 1
            else:
                text = r.observation_text(t.raw or "", True)
                texts.append(text)
                pieces.append(r.encode(text))
                masks.append(0)
                policy_k.append(-1)
            owners.append(t.idx)
        flat = [i for p in pieces for i in p]
        whole = r.encode("".join(texts))
        if whole != flat:
            self._prefix_error(eid, texts, pieces, owners, flat, whole)
        lens = [len(p) for p in pieces]
        ids = np.asarray(flat, np.int64)
        mask = np.repeat(np.asarray(masks, np.int8), lens)
        tturn = np.repeat(np.asarray(policy_k, np.int32), lens)
        tturn[mask != 1] = -1
        return ids, mask, np.full(ids.shape[0], np.nan, np.float32), tturn, None

    def _prefix_error(self, eid: str, texts: Sequence[str], pieces: Sequence[Sequence[int]], owners: Sequence[int],
                      flat: Sequence[int], whole: Sequence[int]) -> None:
        """Raise naming the first turn whose tokens do not continue the previous turns: the smallest K for which
        the tokenization of texts[0..K] is not pieces[0..K] (bisection: only failing episodes pay for it)."""
        r = self.renderer()
        ends = np.cumsum([len(p) for p in pieces]).tolist()

        def breaks(k: int) -> bool:
            return bool(r.encode("".join(texts[:k + 1])) != list(flat[:ends[k]]))

        lo, hi = 0, len(pieces) - 1  # breaks(hi) holds: the whole text
        while lo < hi:
            mid = (lo + hi) // 2
            if breaks(mid):
                hi = mid
            else:
                lo = mid + 1
        mine = r.encode("".join(texts[:lo + 1]))
        got = list(flat[:ends[lo]])
        i = next((j for j, (a, b) in enumerate(zip(got, mine, strict=False)) if a != b), min(len(got), len(mine)))
        a = got[i] if i < len(got) else None
        b = mine[i] if i < len(mine) else None
        show_a = repr(r.decode([a])) if a is not None else "end"
        show_b = repr(r.decode([b])) if b is not None else "end"
        raise RetokenizationError(
            f"episode {eid} turn {owners[lo]}: re-rendered with the trainer's tokenizer, the turn's tokens do not "
            f"continue the previous turns exactly: token {i} is {a} ({show_a}) turn by turn but {b} ({show_b}) when "
            f"the text up to this turn is tokenized whole")


@functools.lru_cache(maxsize=256)
def _tok_key(tokenizer_id: str | None) -> Any:
    """What makes two tokenizer ids the same vocabulary: the tok/tmpl hashes of a fingerprint (the name is the
    model folder's and changes between checkpoints), else the id itself."""
    if tokenizer_id is None:
        return None
    return _fingerprint_key(tokenizer_id) or tokenizer_id


# -- batches ---------------------------------------------------------------------------------------------------

def _scalars(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "advantage": torch.tensor([float(s["advantage"]) for s in samples], dtype=torch.float32),
        "reward": torch.tensor([float(s["reward"]) for s in samples], dtype=torch.float32),
        "terminated": torch.tensor([bool(s["terminated"]) for s in samples], dtype=torch.bool),
        "n_policy_turns": torch.tensor([int(s["n_policy_turns"]) for s in samples], dtype=torch.long),
        "has_behavior_logprobs": torch.tensor([_has_logprobs(s) for s in samples], dtype=torch.bool),
        "episode_id": [s["episode_id"] for s in samples],
        "group_id": [s["group_id"] for s in samples],
        "task_id": [s.get("task_id") for s in samples],
        "policy_version": [s["policy_version"] for s in samples],
        "policy_lag": [s.get("policy_lag") for s in samples],
        "retokenized": [bool(s.get("retokenized")) for s in samples],
    }


def _has_logprobs(s: Mapping[str, Any]) -> bool:
    """Every loss token has a recorded behaviour log-prob (and there is at least one loss token)."""
    m = np.asarray(s["loss_mask"]) == 1
    return bool(m.any() and np.isfinite(np.asarray(s["behavior_logprobs"])[m]).all())


def pad_collate(samples: Sequence[Mapping[str, Any]], pad_id: int = 0) -> dict[str, Any]:
    """Right-padded ``[B, Lmax]`` tensors: input_ids (long), attention_mask (long), loss_mask (float, 0 on padding),
    behavior_logprobs (float, NaN -> 0; ``has_behavior_logprobs`` [B] says whether every loss token of a sample
    had one, ``behavior_logprobs_mask`` [B, Lmax] which tokens did), token_turn (long, -1 on padding); [B]:
    advantage, reward, terminated, n_policy_turns; lists: episode_id, group_id, task_id, policy_version,
    policy_lag, retokenized."""
    if not samples:
        raise TrajlakeError("pad_collate: no samples")
    b = len(samples)
    lmax = max(1, max(int(np.asarray(s["input_ids"]).shape[0]) for s in samples))
    ids = np.full((b, lmax), pad_id, np.int64)
    att = np.zeros((b, lmax), np.int64)
    mask = np.zeros((b, lmax), np.float32)
    lp = np.zeros((b, lmax), np.float32)
    lp_ok = np.zeros((b, lmax), np.float32)
    tturn = np.full((b, lmax), -1, np.int64)
    for i, s in enumerate(samples):
        n = int(np.asarray(s["input_ids"]).shape[0])
        ids[i, :n] = s["input_ids"]
        att[i, :n] = 1
        mask[i, :n] = s["loss_mask"]
        row_lp = np.asarray(s["behavior_logprobs"], np.float32)
        finite = np.isfinite(row_lp)
        lp[i, :n] = np.where(finite, row_lp, 0.0)
        lp_ok[i, :n] = finite
        tturn[i, :n] = s["token_turn"]
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(att),
            "loss_mask": torch.from_numpy(mask), "behavior_logprobs": torch.from_numpy(lp),
            "behavior_logprobs_mask": torch.from_numpy(lp_ok), "token_turn": torch.from_numpy(tturn),
            **_scalars(samples)}


def pack(samples: Iterable[Mapping[str, Any]], max_tokens: int, pad_id: int = 0) -> Iterator[dict[str, Any]]:
    """Pack samples, in order, into ``[1, max_tokens]`` rows: input_ids, attention_mask, position_ids (restarting
    at 0 for each sample), ``segment`` (the sample's index in the row, -1 on padding), loss_mask, behavior_logprobs
    (NaN -> 0), behavior_logprobs_mask, token_turn; per segment: ``cu_seqlens`` and the [S] values and lists of
    ``pad_collate``. Attention is NOT masked across segments by these tensors: only a model that honours
    position_ids-based packing (transformers' flash-attention varlen path) keeps samples apart; otherwise use
    ``pad_collate`` (the default). A sample longer than ``max_tokens`` is an error (never cut)."""
    row: list[Mapping[str, Any]] = []
    used = 0
    for s in samples:
        n = int(np.asarray(s["input_ids"]).shape[0])
        if n > max_tokens:
            raise TrajlakeError(f"pack: episode {s['episode_id']} has {n} tokens, over max_tokens {max_tokens} "
                                f"(filter with LakeTrajectories(max_length=...))")
        if row and used + n > max_tokens:
            yield _packed(row, max_tokens, pad_id)
            row, used = [], 0
        row.append(s)
        used += n
    if row:
        yield _packed(row, max_tokens, pad_id)


def _packed(row: Sequence[Mapping[str, Any]], max_tokens: int, pad_id: int) -> dict[str, Any]:
    ids = np.full(max_tokens, pad_id, np.int64)
    att = np.zeros(max_tokens, np.int64)
    pos = np.zeros(max_tokens, np.int64)
    seg = np.full(max_tokens, -1, np.int64)
    mask = np.zeros(max_tokens, np.float32)
    lp = np.zeros(max_tokens, np.float32)
    lp_ok = np.zeros(max_tokens, np.float32)
    tturn = np.full(max_tokens, -1, np.int64)
    cu = [0]
    at = 0
    for j, s in enumerate(row):
        n = int(np.asarray(s["input_ids"]).shape[0])
        sl = slice(at, at + n)
        ids[sl] = s["input_ids"]
        att[sl] = 1
        pos[sl] = np.arange(n)
        seg[sl] = j
        mask[sl] = s["loss_mask"]
        row_lp = np.asarray(s["behavior_logprobs"], np.float32)
        finite = np.isfinite(row_lp)
        lp[sl] = np.where(finite, row_lp, 0.0)
        lp_ok[sl] = finite
        tturn[sl] = s["token_turn"]
        at += n
        cu.append(at)
    out = {"input_ids": ids, "attention_mask": att, "position_ids": pos, "segment": seg, "loss_mask": mask,
           "behavior_logprobs": lp, "behavior_logprobs_mask": lp_ok, "token_turn": tturn}
    tensors: dict[str, Any] = {k: torch.from_numpy(v).unsqueeze(0) for k, v in out.items()}
    tensors["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    return {**tensors, **_scalars(row)}


__all__ = [
    "EPISODE_COLUMNS",
    "SAMPLE_KEYS",
    "LakeTrajectories",
    "RetokenizationError",
    "Selection",
    "TrainDataError",
    "pack",
    "pad_collate",
    "select_episodes",
]
