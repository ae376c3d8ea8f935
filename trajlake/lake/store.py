"""The lake: one Delta table per schema table under ``<lake>/<table>/``.

trajlake writes the Parquet data files itself (pyarrow: zstd, page checksums, no dictionary on list columns,
the schema version in each file's key-value metadata, size-capped files) and commits them to the Delta log
with delta-rs transactions. Readers always go through the Delta log's file list (``files``), never a glob:
data files do not contain the partition column, and removed files stay on disk until vacuum.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from trajlake._version import __version__
from trajlake.errors import (
    ConcurrentChangeError,
    LakeNotFoundError,
    SchemaVersionError,
    TrajlakeError,
    one_line,
)
from trajlake.lake.delta_log import (
    DELTA_LOG,
    INTENT_KEY,
    LogEntryActions,
    log_entry_name,
    log_entry_version,
    parse_log_entry,
    version_name,
)
from trajlake.lake.storage import LakeStorage, is_uri, storage_error
from trajlake.schema import (
    BASE_SCHEMA_VERSION,
    PARQUET_SCHEMA_KEY,
    PARQUET_TABLE_KEY,
    SCHEMA_VERSION,
    TABLES,
    added_since,
    arrow_schema,
    check_schema_version,
    table_def,
)

META_DIR = "_trajlake"
COMMIT_RECORDS = "commits"
"""Folder under META_DIR holding, per table, the sha256 of every Delta log entry trajlake committed or saw
committed (one small file per version, named ``delta_log.version_name``): ``verify`` checks the log still holds
them, unchanged."""
COMMIT_INTENTS = "intents"
"""Folder under META_DIR holding, per table, the commit intents of commits under way: a writer writes one (the
files it will add and remove) before each commit, names it in the commit's ``commitInfo`` (``INTENT_KEY``), and
deletes it after recording the commit. A writer killed between its commit and the record leaves both, so the next
writer's first commit (``Lake.recover_commit_records``), ``compact`` and ``verify`` recognise the entry as trajlake's;
an entry may only do what its intent says (a subset of its adds and removes)."""
LAKE_FILE = "lake.json"
DEFAULT_RETENTION_HOURS = 7 * 24
TARGET_FILE_BYTES = 256 * 1024 * 1024  # in-memory Arrow bytes per data file (zstd makes files several x smaller)
ROW_GROUP_ROWS = 32_768
# In-memory Arrow bytes per row group (32,768 rows of ~400 tokens would be ~120 MB): the Parquet encoder's
# working set is one row group, so this caps what a commit holds besides its buffer.
ROW_GROUP_BYTES = 32 * 1024 * 1024
# The Parquet encoder's scratch memory (levels, pages, compression) lives for one row group: the system allocator
# gives it back at once, where pyarrow's default pool (mimalloc) keeps tens of MB of it.
_ENCODER_POOL = pa.system_memory_pool()
# Partition files a sink keeps open at once (one writer per partition); past it the oldest is finished.
MAX_OPEN_FILES = 32
# Columns never given min/max statistics in the Delta log (large free text, hashes).
_NO_STATS = frozenset({"raw_content", "tool_args", "statement", "config", "reason", "content_hash",
                       "observation_hash", "env_state_hash", "final_state_hash", "args_hash",
                       "state_hash_before", "state_hash_after", "context_dropped_hash"})
CHECKSUM_HEX = 32
_CHECKSUM_NAME = re.compile(rf"\.([0-9a-f]{{{CHECKSUM_HEX}}})\.zstd\.parquet$")
_SAFE_PART = re.compile(r"^[A-Za-z0-9._-]{1,80}$")


@dataclass(frozen=True)
class DataFile:
    """One live data file of a table at some version."""

    path: str  # relative to the table root, as in the Delta log
    size: int
    num_records: int | None
    partition_values: dict[str, str | None]
    modification_time: int  # ms since epoch


CHECKPOINT_INTERVAL = 100


def _delta_table_config() -> dict[str, str]:
    return {
        "delta.deletedFileRetentionDuration": "interval 7 days",
        "delta.logRetentionDuration": "interval 30 days",
        "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
    }


def intent_vouches(intents: dict[str, dict[str, Any]], entry: LogEntryActions) -> bool:
    """Whether a log entry is a trajlake writer's: it names one of ``intents`` (the table's, still on storage)
    and adds and removes only files that intent lists (so an intent left by a writer killed before its commit
    vouches for nothing else)."""
    intent = intents.get(entry.intent) if entry.intent is not None else None
    if intent is None or entry.error is not None:
        return False
    adds = {unquote(str(p)) for p in intent.get("adds") or []}
    removes = {unquote(str(p)) for p in intent.get("removes") or []}
    return entry.add_paths <= adds and entry.remove_paths <= removes


def _post_commit_hooks(d: deltalake.DeltaTable) -> deltalake.PostCommitHookProperties:
    """What delta-rs does after the commit of the version following ``d``'s: write a checkpoint every
    ``delta.checkpointInterval`` versions (as by default), and clean up expired log entries only with those
    checkpoints. By default delta-rs runs the clean-up after every commit, and it lists the whole ``_delta_log``
    (on a local disk, a stat per entry, three times): each commit then costs more the longer the log (measured
    after ``compact`` of a 2,000-version lake: 136 ms of CPU per flush with the default, 92 ms with this). The
    clean-up can only delete entries a checkpoint covers, so running it when one is written deletes the same
    entries (bench/bench_lake.py --commits)."""
    interval = max(1, int(d.metadata().configuration.get("delta.checkpointInterval") or CHECKPOINT_INTERVAL))
    new_version = d.version() + 1
    # delta-rs checkpoints version v when v + 1 is a multiple of the interval (99, 199, ...). A commit that delta-rs
    # retries past another writer's lands later than new_version: the clean-up then waits for the next checkpoint
    # (it deletes only entries a checkpoint covers, whenever it runs)
    return deltalake.PostCommitHookProperties(create_checkpoint=True,
                                              cleanup_expired_logs=(new_version + 1) % interval == 0)


def _delta_schema(name: str) -> pa.Schema:
    # The Delta schema is the Arrow schema minus our file metadata; nullability follows the JSON definition.
    return arrow_schema(name).remove_metadata()


def schema_upgrade(current: Any, name: str) -> tuple[list[pa.Field], list[str]]:
    """What a table written under an older minor schema version lacks: (columns to add, columns whose NOT NULL
    constraint a later version relaxed). ``current`` is the table's Delta schema (``DeltaTable.schema()``)."""
    have = {f.name: f for f in current.fields}
    add = [f for f in _delta_schema(name) if f.name not in have]
    relax = [f.name for f in _delta_schema(name) if f.name in have and f.nullable and not have[f.name].nullable]
    return add, relax


def _part_dir(col: str, value: str | None) -> str:
    if value is None:
        return f"{col}=__null__"
    if _SAFE_PART.match(value):
        return f"{col}={value}"
    return f"{col}=h{hashlib.sha256(value.encode()).hexdigest()[:20]}"


class _FileStats:
    """Delta file statistics (numRecords, minValues, maxValues, nullCount) accumulated over row groups."""

    def __init__(self) -> None:
        self.rows = 0
        self.nulls: dict[str, int] = {}
        self.lo: dict[str, Any] = {}
        self.hi: dict[str, Any] = {}

    def add(self, t: pa.Table) -> None:
        self.rows += t.num_rows
        for f in t.schema:
            if pa.types.is_nested(f.type):
                continue
            col = t.column(f.name)
            self.nulls[f.name] = self.nulls.get(f.name, 0) + col.null_count
            if f.name in _NO_STATS or col.null_count == len(col) or pa.types.is_boolean(f.type):
                continue
            mm = pc.min_max(col)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            self.lo[f.name] = _pick(self.lo.get(f.name), lo, min)
            self.hi[f.name] = _pick(self.hi.get(f.name), hi, max)

    def json(self) -> str:
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        for name, lo in self.lo.items():
            hi = self.hi[name]
            if isinstance(lo, str) and (len(lo) > 64 or len(hi) > 64):
                continue  # a truncated max would be wrong; skip instead
            if isinstance(lo, dt.datetime):
                lo = lo.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                hi = hi.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            mins[name], maxs[name] = lo, hi
        return json.dumps({"numRecords": self.rows, "minValues": mins, "maxValues": maxs, "nullCount": self.nulls})


def _pick(old: Any, new: Any, better: Any) -> Any:
    """min/max of two partial results; a NaN (all values of a row group NaN) loses to a number."""
    if old is None or (isinstance(old, float) and old != old):
        return new
    if new is None or (isinstance(new, float) and new != new):
        return old
    return better(old, new)


def _stats_json(t: pa.Table, name: str) -> str:
    stats = _FileStats()
    stats.add(t)
    return stats.json()


ZSTD_LEVEL = 1


class Lake:
    """A trajlake lake rooted at a local directory or an object-store prefix (``s3://bucket/prefix``)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.storage = LakeStorage(root)
        # The commit path keeps one DeltaTable per table and refreshes it incrementally (reads only the new log
        # entries, ~1-2 ms) instead of replaying the whole log for each commit (~6-20 ms, growing with versions).
        self._commit_tables: dict[str, deltalake.DeltaTable] = {}
        self._commit_tables_lock = threading.Lock()
        self._schema_current: set[str] = set()

    @property
    def root(self) -> Path:
        """The lake's local folder; a lake on object storage has none (use ``location``)."""
        if self.storage.root_path is None:
            raise TrajlakeError(f"{self.location} is on object storage: it has no local folder")
        return self.storage.root_path

    @property
    def location(self) -> str:
        """Where the lake is: its absolute local path or its ``s3://bucket/prefix`` URI."""
        return self.storage.uri

    @property
    def name(self) -> str:
        """The lake's folder name (the last part of its URI on object storage)."""
        return self.storage.root_path.name if self.storage.root_path is not None else self.location.rsplit("/", 1)[-1]

    @property
    def is_local(self) -> bool:
        return self.storage.local

    @property
    def filesystem(self) -> Any:
        """The ``pyarrow.fs`` filesystem of ``abs_path`` paths: None (plain local paths) for a local lake."""
        return self.storage.fs

    def __getstate__(self) -> dict[str, Any]:
        # the cached tables and the lock stay in this process
        return {"root": self.storage.root_path if self.is_local else self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"])  # type: ignore[misc]

    def _latest(self, name: str) -> deltalake.DeltaTable:
        """The table at its newest version, for committing (caller holds ``_commit_tables_lock``)."""
        d = self._commit_tables.get(name)
        if d is None:
            d = self._commit_tables[name] = self.delta(name)
        elif not self.is_local or self.storage.exists(name, DELTA_LOG, log_entry_name(d.version() + 1)):
            # Locally, a stat of the next log entry tells whether anything was committed since: versions are
            # contiguous, and an entry exists once committed. A refresh lists the whole `_delta_log` directory
            # (delta-rs's local store has no listing from an offset), a cost that grows with the log.
            d.update_incremental()
        if name not in self._schema_current:
            # this process's first commit to the table: record what a writer killed before us left unrecorded
            self.recover_commit_records(name)
            before = d.version()
            if self._upgrade_schema(name, d):
                d.update_incremental()
                self.record_commits(name, before + 1, d.version())  # the upgrade's own log entries
            self._schema_current.add(name)
        return d

    def _upgrade_schema(self, name: str, d: deltalake.DeltaTable) -> bool:
        """Bring a table written under an older minor schema version up to this one before its first commit:
        add the new (nullable) columns and relax the NOT NULL constraints a later version dropped. Old rows
        keep their content hashes (null columns are not hashed). Readers never migrate: a view reads a
        missing column as null. Returns whether anything changed."""
        add, relax = schema_upgrade(d.schema(), name)
        if add:
            with self.commit_intent(name) as props:
                d.alter.add_columns([deltalake.Field.from_arrow(f) for f in add], commit_properties=props())
                self.record_commits(name, d.version(), d.version())
        for col in relax:
            with self.commit_intent(name) as props:
                d.alter.drop_column_not_null(col, commit_properties=props())
                self.record_commits(name, d.version(), d.version())
        return bool(add or relax)

    # -- lifecycle -------------------------------------------------------------------------------------------
    @classmethod
    def init(cls, path: str | os.PathLike[str]) -> Lake:
        """Create a lake (idempotent: an existing lake is opened and any missing table created)."""
        lake = cls._init_remote(str(path)) if is_uri(path) else cls._init_local(Path(path).absolute())
        opts = lake.storage.storage_options
        for name in TABLES:
            uri = lake.table_uri(name)
            try:
                exists = deltalake.DeltaTable.is_deltatable(uri, storage_options=opts)
            except OSError as e:
                if lake.is_local:
                    raise
                raise storage_error(uri, e) from e
            if exists:
                with lake._commit_tables_lock:
                    lake._latest(name)  # an existing lake written by an older minor version is upgraded
            else:
                deltalake.DeltaTable.create(
                    uri, _delta_schema(name), mode="ignore", partition_by=list(table_def(name).partition_by) or None,
                    name=name, description=table_def(name).description, configuration=_delta_table_config(),
                    storage_options=opts,
                )
        return lake

    @classmethod
    def _lake_json(cls) -> bytes:
        return json.dumps({
            "format": "trajlake",
            "schema_version": SCHEMA_VERSION,
            "created_at": dt.datetime.now(dt.UTC).isoformat(),
            "created_by": f"trajlake {__version__}",
        }, indent=2).encode()

    @classmethod
    def _init_remote(cls, uri: str) -> Lake:
        st = LakeStorage(uri)
        if st.exists(META_DIR, LAKE_FILE):
            return cls.open(uri)
        if any(n != META_DIR for n in st.listdir()):
            raise TrajlakeError(f"{st.uri} holds objects and is not a trajlake lake: give an empty or new prefix")
        st.write_bytes(cls._lake_json(), META_DIR, LAKE_FILE)
        return cls(uri)

    @classmethod
    def _init_local(cls, root: Path) -> Lake:
        meta = root / META_DIR / LAKE_FILE
        if meta.exists():
            lake = cls.open(root)
        else:
            if root.exists() and not root.is_dir():
                raise TrajlakeError(f"{root} is a file, not a folder: a lake needs an empty or new folder")
            if root.exists() and any(p for p in root.iterdir() if p.name != META_DIR):
                raise TrajlakeError(f"{root} exists and is not an empty directory or a trajlake lake")
            try:
                (root / META_DIR).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise TrajlakeError(f"cannot create a lake at {root}: {e.strerror or one_line(e)}") from e
            tmp = meta.with_suffix(".tmp")
            tmp.write_bytes(cls._lake_json())
            os.replace(tmp, meta)
            lake = cls(root)
        return lake

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Lake:
        """Open an existing lake; refuses one written with another schema major version."""
        if is_uri(path):
            st = LakeStorage(path)
            where = st.uri_of(META_DIR, LAKE_FILE)
            try:
                text = st.read_bytes(META_DIR, LAKE_FILE).decode()
            except FileNotFoundError:
                raise LakeNotFoundError(f"{st.uri} is not a trajlake lake (no {META_DIR}/{LAKE_FILE}); run "
                                        f"`trajlake init`") from None
            try:
                remote = json.loads(text)
            except json.JSONDecodeError as e:
                raise TrajlakeError(f"{where}: unreadable lake metadata: {e}") from e
            check_schema_version(remote.get("schema_version"), where)
            return cls(str(path))
        root = Path(path).absolute()
        meta = root / META_DIR / LAKE_FILE
        if not meta.exists():
            raise LakeNotFoundError(f"{root} is not a trajlake lake (no {META_DIR}/{LAKE_FILE}); run `trajlake init`")
        try:
            info = json.loads(meta.read_text())
        except json.JSONDecodeError as e:
            raise TrajlakeError(f"{meta}: unreadable lake metadata: {e}") from e
        check_schema_version(info.get("schema_version"), str(meta))
        return cls(root)

    # -- paths and versions ----------------------------------------------------------------------------------
    def table_uri(self, name: str) -> str:
        table_def(name)
        return self.storage.uri_of(name)

    @property
    def meta_dir(self) -> Path:
        """The local ``_trajlake`` folder (local lakes only; ``storage`` reaches it on object storage)."""
        return self.root / META_DIR

    def delta(self, name: str, version: int | None = None) -> deltalake.DeltaTable:
        uri = self.table_uri(name)
        try:
            return deltalake.DeltaTable(uri, version=version, storage_options=self.storage.storage_options)
        except Exception as e:  # delta-rs raises several types for missing tables / versions
            if not self.is_local and isinstance(e, OSError):
                raise storage_error(uri, e) from e
            raise TrajlakeError(f"table {name!r} at version {version}: {one_line(e)}") from e

    def versions(self) -> dict[str, int]:
        """Current version of every table (on an object store the five logs are read concurrently: each is a
        few requests, and their latency, not CPU, is the cost)."""
        def version(name: str) -> int:
            return self.delta(name).version()

        if self.is_local:
            return {name: version(name) for name in TABLES}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(TABLES)) as pool:
            return dict(zip(TABLES, pool.map(version, TABLES), strict=True))

    def resolve_as_of(self, as_of: str | dict[str, int] | None) -> dict[str, int] | None:
        """Parse an ``--as-of`` value: ``table=version,...`` (missing tables: current), a JSON object, or an
        ISO-8601 timestamp (each table as of that instant)."""
        if as_of is None or as_of == "":
            return None
        if isinstance(as_of, dict):
            out = dict(as_of)
        else:
            text = as_of.strip()
            if text.startswith("{"):
                try:
                    out = {str(k): int(v) for k, v in json.loads(text).items()}
                except (ValueError, AttributeError) as e:
                    raise TrajlakeError(f"--as-of: not a JSON object of table versions: {text!r}") from e
            elif "=" in text:
                out = {}
                for part in text.split(","):
                    k, _, v = part.partition("=")
                    try:
                        out[k.strip()] = int(v)
                    except ValueError as e:
                        raise TrajlakeError(f"--as-of: {part!r} is not table=version") from e
            else:
                try:
                    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
                except ValueError as e:
                    raise TrajlakeError(
                        f"--as-of: {text!r} is neither table=version pairs (as printed by `trajlake info`) "
                        f"nor an ISO-8601 timestamp") from e
                if when.tzinfo is None:
                    when = when.replace(tzinfo=dt.UTC)
                out = {}
                for name in TABLES:
                    d = self.delta(name)
                    try:
                        d.load_as_version(when)
                        out[name] = d.version()
                    except Exception:
                        out[name] = 0  # the table was created after that instant: its empty first version
        unknown = set(out) - set(TABLES)
        if unknown:
            raise TrajlakeError(f"--as-of: unknown table(s) {', '.join(sorted(unknown))}")
        current = self.versions()
        for tname, ver in out.items():
            if ver < 0 or ver > current[tname]:
                raise TrajlakeError(f"--as-of: {tname} has versions 0..{current[tname]}, not {ver}")
        return {name: out.get(name, current[name]) for name in TABLES}

    def latest_add_actions(self, name: str) -> pa.Table:
        """The live files of ``name`` at its newest version (``DeltaTable.get_add_actions(flatten=True)``), from
        the incrementally refreshed table of the commit path."""
        return self.latest_snapshot(name)[1]

    def latest_snapshot(self, name: str) -> tuple[int, pa.Table]:
        """(newest version, its live files as ``latest_add_actions``): the read version a ``commit_if_unchanged``
        of a check made against these files must name."""
        with self._commit_tables_lock:
            d = self._latest(name)
            return d.version(), pa.table(d.get_add_actions(flatten=True))

    def files(self, name: str, version: int | None = None,
              partition_filters: list[tuple[str, str, Any]] | None = None) -> list[DataFile]:
        """Live data files of ``name`` at ``version`` (the table's own file list)."""
        d = self.delta(name, version)
        actions = pa.table(d.get_add_actions(flatten=True))
        pcols = [c for c in actions.column_names if c.startswith("partition.")]
        out = []
        for row in actions.to_pylist():
            pv = {c.removeprefix("partition."): row[c] for c in pcols}
            if partition_filters and not all(_match(pv.get(k), op, v) for k, op, v in partition_filters):
                continue
            out.append(DataFile(row["path"], int(row["size_bytes"]), row.get("num_records"), pv,
                                int(_ms(row["modification_time"]))))
        return out

    def abs_path(self, name: str, rel: str) -> str:
        """A data file's path: a local path, or ``bucket/prefix/...`` in ``filesystem`` on object storage."""
        from urllib.parse import unquote

        if self.is_local:
            return os.path.join(self.table_uri(name), unquote(rel))
        return self.storage.path(name, unquote(rel))

    def remove_file(self, name: str, rel: str) -> None:
        """Delete a data file (a missing one is not an error)."""
        if self.is_local:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.abs_path(name, rel))
        else:
            from urllib.parse import unquote

            self.storage.remove(name, unquote(rel))

    def file_sha256(self, name: str, rel: str) -> str:
        """sha256 of a data file's bytes (FileNotFoundError when it is missing)."""
        if self.is_local:
            return file_sha256(self.abs_path(name, rel))
        h = hashlib.sha256()
        assert self.filesystem is not None
        with self.filesystem.open_input_stream(self.abs_path(name, rel)) as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
        return h.hexdigest()

    # -- writing ---------------------------------------------------------------------------------------------
    def write_files(self, name: str, table: pa.Table) -> list[AddAction]:
        """Write ``table`` (already in the table's schema) as data files; returns Add actions to commit.

        Nothing is visible until the actions are committed (``commit``)."""
        with self.open_sink(name) as sink:
            sink.write(table)
            return sink.close()

    def open_sink(self, name: str) -> DataFileSink:
        """A streaming writer of ``name``'s data files: ``write`` tables as they come (each is encoded as row
        groups right away), ``close`` for the Add actions to commit."""
        return DataFileSink(self, name)

    def drop_rows(self, name: str, actions: Sequence[AddAction], column: str, values: Sequence[str],
                  delete_old: bool = True) -> list[AddAction]:
        """Rewrite data files without the rows whose ``column`` is in ``values`` (a row group at a time); returns
        the new files' Add actions. The old files are deleted (``delete_old``, for uncommitted files) or kept (for
        committed ones: readers of older versions still need them until vacuum)."""
        drop = pa.array(sorted(set(values)), pa.string())
        with self.open_sink(name) as sink:
            for a in actions:
                path = self.abs_path(name, a.path)
                pf = pq.ParquetFile(path, filesystem=self.filesystem)
                for i in range(pf.num_row_groups):
                    t = pf.read_row_group(i)
                    for k, v in a.partition_values.items():
                        t = t.append_column(k, pa.array([v] * t.num_rows, pa.string()))
                    sink.write(t.filter(pc.invert(pc.is_in(t[column], value_set=drop))))
                pf.close()
            new = sink.close()
        if delete_old:
            for a in actions:
                self.remove_file(name, a.path)
        return new

    def commit(self, name: str, actions: Sequence[AddAction | RemoveAction], retries: int = 200,
               expect_present: list[str] | None = None) -> int:
        """Commit actions as one Delta transaction; returns the new table version.

        Pure appends are retried by delta-rs itself. Transactions that remove files (compaction) fail when the
        table moved; they are retried here after checking that every removed file (``expect_present``) is
        still live, so a concurrent compaction can never make two transactions remove the same rows."""
        if not actions:
            return self.delta(name).version()
        td = table_def(name)
        last: Exception | None = None
        with self.commit_intent(name, actions) as props:
            for attempt in range(retries):
                with self._commit_tables_lock:
                    d = self._latest(name)
                    if expect_present:
                        live = {f.path for f in self.files(name)}
                        gone = [p for p in expect_present if p not in live]
                        if gone:
                            raise ConcurrentChangeError(
                                f"{name}: {len(gone)} file(s) were removed concurrently: {gone[0]}")
                    try:
                        before = d.version()
                        d.create_write_transaction(list(actions), mode="append", schema=_delta_schema(name),
                                                   partition_by=list(td.partition_by) or None,
                                                   commit_properties=props(),
                                                   post_commithook_properties=_post_commit_hooks(d))
                        d.update_incremental()
                        self.record_commits(name, before + 1, d.version())
                        return d.version()
                    except CommitFailedError as e:  # another writer won the version: refresh and try again
                        last = e
                time.sleep(min(0.5, 0.01 * (attempt + 1)))
        raise TrajlakeError(f"{name}: could not commit after {retries} attempts: {one_line(last) if last else ''}")

    def commit_rewritten(self, name: str, removes: Sequence[RemoveAction], adds: Sequence[AddAction],
                         clean_up_on: type[BaseException] = TrajlakeError) -> int:
        """Commit files rewritten from live ones as one transaction: ``removes`` (each must still be live, as
        ``commit``'s ``expect_present``) and ``adds``, their replacements; returns the new version. When the commit
        raises ``clean_up_on`` the added files are deleted, so nothing uncommitted stays behind, and the error
        re-raised (the default: only errors that say the commit did not happen)."""
        try:
            return self.commit(name, [*removes, *adds], expect_present=[r.path for r in removes])
        except clean_up_on:
            for a in adds:
                self.remove_file(name, a.path)
            raise

    def commit_if_unchanged(self, name: str, actions: Sequence[AddAction | RemoveAction], read_version: int,
                            refresh: bool = True) -> int | None:
        """Commit ``actions`` as version ``read_version + 1`` or not at all: an optimistic compare-and-swap on the
        Delta log. Returns the new version, or None when the table moved past ``read_version`` (another writer
        committed since the caller's check): the caller re-checks what was added and tries again.

        delta-rs creates the log entry ``<read_version + 1>.json`` only if it does not exist (a conditional put,
        If-None-Match: * on object storage; a no-replace rename locally), and ``max_commit_retries=0`` stops it
        from rebasing onto a newer version by itself. ``refresh=False`` skips looking for newer versions first
        (the caller's ``latest_snapshot`` just did): a newer one then makes the put fail, which is as safe."""
        td = table_def(name)
        with self._commit_tables_lock:
            d = self._commit_tables.get(name) if not refresh else None
            if d is None:
                d = self._latest(name)
            if d.version() != read_version:
                return None
            with self.commit_intent(name, actions) as props:
                try:
                    d.create_write_transaction(list(actions), mode="append", schema=_delta_schema(name),
                                               partition_by=list(td.partition_by) or None,
                                               commit_properties=props(max_commit_retries=0),
                                               post_commithook_properties=_post_commit_hooks(d))
                except CommitFailedError:
                    return None  # another writer created that version first
                d.update_incremental()
                self.record_commits(name, read_version + 1, d.version())
            return read_version + 1  # ours (d may already show a later writer's version too)

    @contextlib.contextmanager
    def commit_intent(self, name: str, actions: Sequence[AddAction | RemoveAction] = ()
                       ) -> Iterator[Callable[..., deltalake.CommitProperties]]:
        """Write a commit intent (``COMMIT_INTENTS``) for a commit of ``actions``; yields a factory of the
        ``CommitProperties`` that name it in the entry's ``commitInfo``; deletes the intent when the block ends
        (the caller has recorded the commit by then, or made none)."""
        nonce = uuid.uuid4().hex
        body = {"adds": [a.path for a in actions if isinstance(a, AddAction)],
                "removes": [a.path for a in actions if isinstance(a, RemoveAction)],
                "pid": os.getpid(), "at": time.time()}
        self.storage.write_bytes(json.dumps(body).encode(), META_DIR, COMMIT_INTENTS, name, nonce)

        def props(**kw: Any) -> deltalake.CommitProperties:
            return deltalake.CommitProperties(custom_metadata={INTENT_KEY: nonce}, **kw)

        try:
            yield props
        finally:
            with contextlib.suppress(OSError, TrajlakeError):  # a leftover intent is harmless (compact drops it)
                self.storage.remove(META_DIR, COMMIT_INTENTS, name, nonce)

    def commit_intents(self, name: str) -> dict[str, dict[str, Any]]:
        """The commit intents of ``name`` still on storage (intent name -> its content; unreadable ones are
        left out: they can vouch for nothing)."""
        try:
            names = self.storage.listdir(META_DIR, COMMIT_INTENTS, name)
        except (OSError, TrajlakeError):
            return {}
        out: dict[str, dict[str, Any]] = {}
        for n in names:
            if n.startswith(".") or n.endswith(".tmp"):
                continue
            try:
                body = json.loads(self.storage.read_bytes(META_DIR, COMMIT_INTENTS, name, n))
            except (OSError, TrajlakeError, ValueError):
                continue
            if isinstance(body, dict):
                out[n] = body
        return out

    def log_entry(self, name: str, version: int) -> LogEntryActions:
        """What the log entry of ``version`` of ``name`` does (``error`` set when it cannot be read)."""
        try:
            return parse_log_entry(self.storage.read_bytes(name, DELTA_LOG, log_entry_name(version)))
        except (OSError, TrajlakeError) as e:
            return LogEntryActions(None, 0, 0, one_line(e))

    def recover_commit_records(self, name: str) -> list[int]:
        """Record the log entries of ``name`` that a trajlake writer committed but died before recording: an
        unrecorded entry naming a commit intent still on storage, doing no more than the intent says. Deletes
        the intents it used. Returns the versions recorded. Cheap when no intent is left (one listing)."""
        intents = self.commit_intents(name)
        if not intents:
            return []
        st = self.storage
        try:
            records = {int(n) for n in st.listdir(META_DIR, COMMIT_RECORDS, name) if n.isdigit()}
            on_log = st.listdir(name, DELTA_LOG)
        except (OSError, TrajlakeError):
            return []
        if not records:
            return []  # a lake written before commit records: nothing is judged, nothing to recover
        first = min(records)
        recovered: list[int] = []
        for v in sorted(v for n in on_log if (v := log_entry_version(n)) is not None and v > first
                        and v not in records):
            entry = self.log_entry(name, v)
            if intent_vouches(intents, entry):
                self.record_commits(name, v, v)
                with contextlib.suppress(OSError, TrajlakeError):
                    st.remove(META_DIR, COMMIT_INTENTS, name, str(entry.intent))
                recovered.append(v)
        return recovered

    def record_commits(self, name: str, first: int, last: int) -> None:
        """Record the sha256 of log entries ``first..last`` (see COMMIT_RECORDS): the log alone cannot show
        that its newest entry was deleted or that an entry was edited."""
        if not self.is_local:
            self._record_commits_remote(name, first, last)
            return
        folder = self.meta_dir / COMMIT_RECORDS / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for v in range(first, last + 1):
                target = folder / version_name(v)
                if target.exists():
                    continue
                entry = Path(self.table_uri(name)) / DELTA_LOG / log_entry_name(v)
                digest = hashlib.sha256(entry.read_bytes()).hexdigest()
                tmp = folder / f".{version_name(v)}.{os.getpid()}.{threading.get_ident()}.tmp"
                tmp.write_text(digest, encoding="ascii")
                os.replace(tmp, target)
        except OSError:
            pass  # evidence for verify only: never fail a commit that already happened

    def _record_commits_remote(self, name: str, first: int, last: int) -> None:
        st = self.storage
        for v in range(first, last + 1):
            try:
                if st.exists(META_DIR, COMMIT_RECORDS, name, version_name(v)):
                    continue
                entry = st.read_bytes(name, DELTA_LOG, log_entry_name(v))
                st.write_bytes(hashlib.sha256(entry).hexdigest().encode("ascii"), META_DIR, COMMIT_RECORDS, name,
                               version_name(v))
            except (OSError, TrajlakeError):
                return  # evidence for verify only: never fail a commit that already happened

    def append(self, name: str, table: pa.Table) -> int:
        """Write and commit ``table`` in one transaction."""
        return self.commit(name, self.write_files(name, table))

    # -- reading ---------------------------------------------------------------------------------------------
    def read_file(self, name: str, f: DataFile, columns: list[str] | None = None) -> pa.Table:
        """Read one data file, check its schema version, and restore the partition column."""
        path = self.abs_path(name, f.path)
        pf = pq.ParquetFile(path, page_checksum_verification=True, filesystem=self.filesystem)
        md = pf.schema_arrow.metadata or {}
        check_schema_version(md.get(PARQUET_SCHEMA_KEY), path)
        cols = None if columns is None else [c for c in columns if c in pf.schema_arrow.names]
        t = pf.read(columns=cols)
        for c in added_since(name, BASE_SCHEMA_VERSION):
            # A file written before the column existed reads it as null (and is hashed as absent). Presence, not
            # the file's version, decides: a column may be added within a minor version (as attack_success
            # was within 1.1), and files written before it must still read.
            if c.name not in t.column_names and (columns is None or c.name in columns):
                t = t.append_column(pa.field(c.name, c.arrow_type, nullable=True), pa.nulls(t.num_rows, c.arrow_type))
        for k, v in f.partition_values.items():
            if columns is None or k in columns:
                t = t.append_column(k, pa.array([v] * t.num_rows, pa.string()))
        if columns is None:
            order = [c for c in table_def(name).column_names if c in t.column_names]
            t = t.select(order)
        return t

    def iter_tables(self, name: str, version: int | None = None, columns: list[str] | None = None,
                    partition_filters: list[tuple[str, str, Any]] | None = None) -> Iterator[tuple[DataFile, pa.Table]]:
        for f in self.files(name, version, partition_filters):
            yield f, self.read_file(name, f, columns)


class DataFileSink:
    """Streams rows into data files of one table (one open file per partition value).

    Every ``write`` is encoded at once as row groups of at most ``ROW_GROUP_ROWS`` rows and ``ROW_GROUP_BYTES``
    in-memory bytes, so the caller can release what it wrote: memory stays at one row group, whatever the
    total. Files roll over at ``TARGET_FILE_BYTES``. ``close`` finishes the files (sha256 of the bytes in the
    name, fsync) and returns their Add actions; ``abort`` (or leaving the ``with`` block on an error) removes
    them. zstd level 1, page checksums, no dictionary on list columns, the schema version in the key-value
    metadata."""

    def __init__(self, lake: Lake, name: str):
        self.lake = lake
        self.name = name
        td = table_def(name)
        schema = arrow_schema(name)
        self._loose = pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)
        self._pcol = td.partition_by[0] if td.partition_by else None
        meta = dict(schema.metadata or {})
        meta[PARQUET_SCHEMA_KEY] = SCHEMA_VERSION.encode()
        meta[PARQUET_TABLE_KEY] = name.encode()
        meta[b"trajlake.writer_version"] = __version__.encode()
        fields = [f for f in self._loose if f.name != self._pcol]
        self._file_schema = pa.schema(fields, metadata=meta)
        # Dictionary encoding made list columns (token ids, masks, log-probs) ~31% larger: scalars only.
        self._scalars = [f.name for f in fields if not pa.types.is_nested(f.type)]
        self._open: dict[str | None, _OpenFile] = {}  # insertion order = least recently used first
        self._done: list[AddAction] = []
        self._closed = False
        # On object storage files are spooled locally and uploaded once finished (named by their sha256, which
        # is known only then): a PUT is atomic, so no partial object is ever visible, and nothing needs a rename.
        self._spool: str | None = None if lake.is_local else tempfile.mkdtemp(prefix="trajlake-spool-")

    def __enter__(self) -> DataFileSink:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None or not self._closed:
            self.abort()

    def write(self, table: pa.Table) -> None:
        """Encode ``table`` (the table's columns, partition column included) into the open files."""
        if table.num_rows == 0:
            return
        table = table.select(self._loose.names).cast(self._loose)
        if self._pcol is None:
            self._write_part(None, table)
            return
        col = table.column(self._pcol)
        keys = pc.unique(col).to_pylist()
        if len(keys) == 1:
            self._write_part(keys[0], table.drop_columns([self._pcol]))
            return
        for k in keys:
            mask = pc.is_null(col) if k is None else pc.equal(col, k)
            self._write_part(k, table.filter(mask).drop_columns([self._pcol]))

    def _write_part(self, key: str | None, part: pa.Table) -> None:
        per_row = max(1, part.nbytes // max(1, part.num_rows))
        step = max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES // per_row))
        for start in range(0, part.num_rows, step):
            group = part.slice(start, step)
            f = self._open.pop(key, None)
            if f is not None and f.nbytes and f.nbytes + group.nbytes > TARGET_FILE_BYTES:
                self._finish(f)
                f = None
            if f is None:
                if len(self._open) >= MAX_OPEN_FILES:
                    self._finish(self._open.pop(next(iter(self._open))))
                f = self._new_file(key)
            self._open[key] = f  # most recently used last
            f.writer.write_table(group, row_group_size=group.num_rows)
            f.stats.add(group)
            f.nbytes += group.nbytes

    def _new_file(self, key: str | None) -> _OpenFile:
        pvals: dict[str, str | None] = {self._pcol: key} if self._pcol is not None else {}
        rel_dir = "/".join(_part_dir(k, v) for k, v in pvals.items())
        tmp_rel = (rel_dir + "/" if rel_dir else "") + f"part-{uuid.uuid4().hex}"
        if self._spool is not None:
            tmp = os.path.join(self._spool, tmp_rel.replace("/", "__") + ".inprogress")
        else:
            tmp = os.path.join(self.lake.table_uri(self.name), tmp_rel + ".inprogress")
            os.makedirs(os.path.dirname(tmp), exist_ok=True)
        writer = pq.ParquetWriter(tmp, self._file_schema, compression="zstd", compression_level=ZSTD_LEVEL,
                                  use_dictionary=self._scalars, write_page_checksum=True,
                                  write_statistics=self._scalars, memory_pool=_ENCODER_POOL)
        return _OpenFile(tmp_rel, tmp, pvals, writer, _FileStats())

    def _finish(self, f: _OpenFile) -> None:
        f.writer.close()
        # The file name carries the sha256 of its bytes, so `verify` detects any flipped byte.
        if self._spool is not None:
            self._upload(f)
            return
        digest = file_sha256(f.tmp, fsync=True)
        rel = f"{f.tmp_rel}.{digest[:CHECKSUM_HEX]}.zstd.parquet"
        path = os.path.join(self.lake.table_uri(self.name), rel)
        os.replace(f.tmp, path)
        self._done.append(AddAction(rel, os.path.getsize(path), f.pvals, int(time.time() * 1000), True,
                                    f.stats.json()))

    def _upload(self, f: _OpenFile) -> None:
        digest = file_sha256(f.tmp)
        rel = f"{f.tmp_rel}.{digest[:CHECKSUM_HEX]}.zstd.parquet"
        size = os.path.getsize(f.tmp)
        fs = self.lake.filesystem
        target = self.lake.abs_path(self.name, rel)
        try:
            with open(f.tmp, "rb") as src, fs.open_output_stream(target) as out:
                shutil.copyfileobj(src, out, 8 << 20)
        except OSError as e:
            raise storage_error(self.lake.storage.uri_of(self.name, rel), e) from e
        finally:
            os.remove(f.tmp)
        self._done.append(AddAction(rel, size, f.pvals, int(time.time() * 1000), True, f.stats.json()))

    def close(self) -> list[AddAction]:
        """Finish every file; returns the Add actions (nothing is visible until they are committed)."""
        while self._open:
            self._finish(self._open.pop(next(iter(self._open))))
        self._closed = True
        self._drop_spool()
        return list(self._done)

    def _drop_spool(self) -> None:
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)

    def abort(self) -> None:
        """Remove every file this sink wrote (finished or not)."""
        for f in self._open.values():
            with contextlib.suppress(Exception):
                f.writer.close()
            with contextlib.suppress(FileNotFoundError):
                os.remove(f.tmp)
        self._open.clear()
        for a in self._done:
            self.lake.remove_file(self.name, a.path)
        self._done.clear()
        self._closed = True
        self._drop_spool()


@dataclass
class _OpenFile:
    tmp_rel: str
    tmp: str
    pvals: dict[str, str | None]
    writer: pq.ParquetWriter
    stats: _FileStats
    nbytes: int = 0


def file_sha256(path: str, fsync: bool = False) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
        if fsync:
            os.fsync(fh.fileno())
    return h.hexdigest()


def checksum_from_name(rel: str) -> str | None:
    """The sha256 prefix recorded in a data file's name, if it has one."""
    m = _CHECKSUM_NAME.search(rel)
    return m.group(1) if m else None


def _match(value: Any, op: str, target: Any) -> bool:
    if op == "=":
        return bool(value == target)
    if op == "in":
        return value in target
    if op == "!=":
        return bool(value != target)
    raise ValueError(f"unsupported partition filter op {op!r}")


def _ms(v: Any) -> float:
    if isinstance(v, dt.datetime):
        return v.timestamp() * 1000
    return float(v)


#: What the readers and reports accept as a lake: an open ``Lake``, a local path or an object-store URI.
LakeArg = Lake | str | os.PathLike[str]


def as_lake(lake: LakeArg) -> Lake:
    """The ``Lake`` of ``lake``: itself when already open, else the existing lake at that path or URI (never
    created)."""
    return lake if isinstance(lake, Lake) else Lake.open(lake)


def lake_location(lake: LakeArg) -> str:
    """Where ``lake`` is, as reports name it: an open lake's location, or the path or URI as given."""
    return lake.location if isinstance(lake, Lake) else os.fspath(lake)


__all__ = ["DEFAULT_RETENTION_HOURS", "ConcurrentChangeError", "DataFile", "Lake", "LakeArg", "SchemaVersionError", "as_lake",
           "lake_location"]
