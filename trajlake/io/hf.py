"""Export the lake as a Hugging Face Hub dataset (``trajlake export hf``; see docs/export.md).

Layout written in the output folder (the Hub's "manual configuration" layout)::

    README.md                                         dataset card: YAML front matter (configs, license) + body
    data/<table>/<split>-00000-of-0000N.parquet       one config per table, one or more shards per split

Rows are streamed from DuckDB (``connect(lake, versions)``, pinned to one version of every table) in Arrow
record batches and written shard by shard with pyarrow; no table is ever held in Python memory as a whole.
Rows are ordered by split and primary key, so two exports of the same pinned versions hold the same rows in the
same order.

Splits: ``episodes`` and ``tasks`` use their own ``split`` column; ``turns`` and ``gateway_events`` take the
split of their episode (a join; they get no extra column); ``runs`` have no split and go to a single ``train``
split. Rows of the ``hidden`` split are left out unless ``include_hidden``: an episode counts as hidden when its
split is ``hidden`` or its task id is listed in ``tasks`` with split ``hidden``, and its turns and gateway events
go with it.

Types: every schema type maps to a ``datasets`` feature directly except ``map<string, float64>``, which
``datasets`` cannot represent (``Features.from_arrow_schema`` raises on Arrow maps); map columns are exported as
``list<struct<key: string, value: float64>>`` (DuckDB ``map_entries``), which loads as
``List({"key": Value("string"), "value": Value("float64")})``. ``dict(...)`` of the pairs gives the map back.

``push`` uploads the folder with ``huggingface_hub.HfApi().upload_folder`` using the token in ``$HF_TOKEN``.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from trajlake._version import __version__
from trajlake.errors import TrajlakeError
from trajlake.lake.store import Lake, LakeArg, as_lake
from trajlake.schema import SCHEMA_VERSION, TABLES, table_def, to_arrow_type, type_to_str

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "DEFAULT_SHARD_ROWS",
    "HIDDEN_SPLIT",
    "LAYOUTS",
    "NO_SPLIT_NAME",
    "ExportSummary",
    "ExportTarget",
    "SplitExport",
    "TableExport",
    "contamination_card",
    "export_arrow_schema",
    "export_hf",
    "export_type_str",
    "not_checked_card",
    "prepare_export",
    "push_export",
    "push_to_hub",
    "recover_export",
    "set_temp_directory",
    "write_staged",
]

DEFAULT_SHARD_ROWS = 100_000
"""Most rows in one Parquet shard."""
DEFAULT_MAX_SHARD_BYTES = 512 * 1024 * 1024
"""A shard is closed once its compressed size reaches this (checked after each row group, so approximate)."""
ROW_GROUP_ROWS = 10_000
"""Rows per DuckDB record batch and so at most per Parquet row group (small enough for the Hub's viewer)."""
HIDDEN_SPLIT = "hidden"
NO_SPLIT_NAME = "train"
"""Split of the rows of tables without a split column (``runs``)."""
DATA_DIR = "data"
CARD = "README.md"

_SPLIT_COL = "__trajlake_split"
_SPLIT_RE = re.compile(r"^\w+(\.\w+)*$")  # the Hub's rule for split names
_LICENSE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$")
_REPO_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Tables whose split comes from their episode, and whether a table has its own split column.
_SPLIT_FROM_EPISODE = ("turns", "gateway_events")
_OWN_SPLIT = ("episodes", "tasks")


# ------------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class SplitExport:
    """One split of one exported table."""

    split: str
    rows: int
    files: tuple[str, ...]
    """Shard paths relative to the output folder (``data/<table>/<split>-0000i-of-0000N.parquet``)."""


@dataclass(frozen=True)
class TableExport:
    """One exported table (one Hub config)."""

    table: str
    splits: tuple[SplitExport, ...]
    excluded_hidden: int
    """Rows left out because they belong to the hidden split (0 with ``include_hidden``)."""
    left_out: tuple[tuple[str, int], ...] = ()
    """Other rows left out, as (reason, count) pairs (the training layouts' filters, e.g. not successful)."""

    @property
    def rows(self) -> int:
        """Rows exported over all splits."""
        return sum(s.rows for s in self.splits)

    def split(self, name: str) -> SplitExport | None:
        """The split ``name``, or None when the table has no rows in it."""
        return next((s for s in self.splits if s.split == name), None)


@dataclass(frozen=True)
class ExportSummary:
    """What ``export_hf`` wrote (and pushed)."""

    out: Path
    tables: dict[str, TableExport]
    versions: dict[str, int]
    """Delta version of every lake table the export read (all tables, not only the exported ones)."""
    include_hidden: bool
    license: str
    exported_at: str
    pushed_to: str | None = None
    """``https://huggingface.co/datasets/<repo_id>`` after a push, else None."""
    contamination: tuple[dict[str, Any], ...] = ()
    """Per exported evaluation split: the contamination scan's summary (``contamination_summary``)."""
    commit_url: str | None = None
    layout: str = "trajectories"
    """``trajectories`` (one config per lake table), ``sft`` or ``rl`` (see :mod:`trajlake.io.hf_layouts`)."""
    notes: tuple[str, ...] = ()
    """Things the export could not do for some rows (e.g. no tool list for an environment), one line each."""

    @property
    def as_of(self) -> str:
        """The ``--as-of`` value that pins the versions this export read."""
        return ",".join(f"{t}={v}" for t, v in self.versions.items())

    @property
    def card(self) -> Path:
        """Path of the dataset card."""
        return self.out / CARD

    def rows(self, table: str, split: str | None = None) -> int:
        """Rows exported for ``table`` (in ``split`` when given)."""
        te = self.tables[table]
        if split is None:
            return te.rows
        s = te.split(split)
        return s.rows if s else 0


# ------------------------------------------------------------------------------------------------- types
def _export_type(t: Any) -> Any:
    """A schema type with every map replaced by a list of {key, value} structs."""
    if isinstance(t, str):
        return t
    (kind, arg), = t.items()
    if kind == "list":
        return {"list": _export_type(arg)}
    if kind == "map":
        return {"list": {"struct": [{"name": "key", "type": _export_type(arg[0])},
                                    {"name": "value", "type": _export_type(arg[1])}]}}
    return {"struct": [{**c, "type": _export_type(c["type"])} for c in arg]}


def _has_map(t: Any) -> bool:
    if isinstance(t, str):
        return False
    (kind, arg), = t.items()
    if kind == "map":
        return True
    if kind == "list":
        return _has_map(arg)
    return any(_has_map(c["type"]) for c in arg)


def _nullable_nested(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable (DuckDB's Arrow output marks nested fields nullable)."""
    if pa.types.is_list(t):
        return pa.list_(_nullable_nested(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _nullable_nested(f.type), True) for f in t])
    return t


def export_type_str(table: str, column: str) -> str:
    """The type of ``table.column`` as exported (maps become ``list<struct<key, value>>``)."""
    return type_to_str(_export_type(table_def(table).column(column).type))


def export_arrow_schema(table: str, metadata: dict[str, str] | None = None) -> pa.Schema:
    """The Arrow schema of the exported Parquet shards of ``table``."""
    fields = [pa.field(c.name, _nullable_nested(to_arrow_type(_export_type(c.type))), c.nullable)
              for c in table_def(table).columns]
    meta = {"trajlake.schema_version": SCHEMA_VERSION, "trajlake.table": table, **(metadata or {})}
    return pa.schema(fields, metadata=meta)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _select_list(table: str, alias: str) -> str:
    out = []
    for c in table_def(table).columns:
        ref = f"{alias}.{_q(c.name)}"
        if isinstance(c.type, dict) and "map" in c.type:
            out.append(f"map_entries({ref}) AS {_q(c.name)}")
        elif _has_map(c.type):
            raise TrajlakeError(f"{table}.{c.name}: maps nested in {c.type_str()} cannot be exported yet")
        else:
            out.append(ref)
    return ", ".join(out)


# ------------------------------------------------------------------------------------------------- queries
_HIDDEN_TASK_IDS = f"(SELECT task_id FROM tasks WHERE split = '{HIDDEN_SPLIT}')"


def _hidden_episode(alias: str) -> str:
    """SQL predicate: the episode ``alias`` belongs to the hidden split (by its own split or its task's)."""
    return f"({alias}.split = '{HIDDEN_SPLIT}' OR {alias}.task_id IN {_HIDDEN_TASK_IDS})"


def _from_where(table: str, include_hidden: bool, hidden: bool = False) -> tuple[str, str, str]:
    """(FROM clause, WHERE clause, split expression) of ``table``; ``hidden`` selects the excluded rows."""
    if table in _SPLIT_FROM_EPISODE:
        frm = f"{table} t JOIN episodes e ON t.episode_id = e.episode_id"
        pred, split = _hidden_episode("e"), "e.split"
    elif table == "episodes":
        frm, pred, split = "episodes t", _hidden_episode("t"), "t.split"
    elif table in _OWN_SPLIT:
        frm, pred, split = f"{table} t", f"(t.split = '{HIDDEN_SPLIT}')", "t.split"
    else:
        frm, pred, split = f"{table} t", "FALSE", f"'{NO_SPLIT_NAME}'"
    if hidden:
        return frm, f"WHERE {pred}", split
    return frm, ("" if include_hidden else f"WHERE NOT {pred}"), split


def _export_query(table: str, include_hidden: bool) -> str:
    frm, where, split = _from_where(table, include_hidden)
    order = ", ".join(f"t.{_q(k)}" for k in table_def(table).primary_key)
    return (f"SELECT {_select_list(table, 't')}, {split} AS {_SPLIT_COL} FROM {frm} {where} "
            f"ORDER BY {_SPLIT_COL}, {order}")


def _count_hidden(con: duckdb.DuckDBPyConnection, table: str) -> int:
    frm, where, _ = _from_where(table, include_hidden=False, hidden=True)
    row = con.execute(f"SELECT count(*) FROM {frm} {where}").fetchone()
    return int(row[0]) if row else 0


def _arrow_reader(con: duckdb.DuckDBPyConnection, sql: str) -> pa.RecordBatchReader:
    res = con.execute(sql)
    to_reader = getattr(res, "to_arrow_reader", None)
    if to_reader is not None:  # duckdb >= 1.4
        return to_reader(ROW_GROUP_ROWS)
    return res.fetch_record_batch(ROW_GROUP_ROWS)


# ------------------------------------------------------------------------------------------------- writing
def _parquet_writer(sink: Any, schema: pa.Schema) -> pq.ParquetWriter:
    opts: dict[str, Any] = {"compression": "zstd", "write_page_index": True}
    try:  # content-defined chunking (pyarrow >= 21): re-uploads of a grown export deduplicate on the Hub (Xet)
        return pq.ParquetWriter(sink, schema, use_content_defined_chunking=True, **opts)
    except TypeError:
        return pq.ParquetWriter(sink, schema, **opts)


class _ShardWriter:
    """Writes the rows of one table into size-capped shards, split by split (rows arrive ordered by split)."""

    def __init__(self, table: str, folder: Path, rel: str, schema: pa.Schema, shard_rows: int,
                 max_shard_bytes: int):
        self.table, self.folder, self.rel, self.schema = table, folder, rel, schema
        self.shard_rows, self.max_shard_bytes = shard_rows, max_shard_bytes
        self.splits: list[SplitExport] = []
        self._split: str | None = None
        self._tmp_files: list[Path] = []
        self._split_rows = 0
        self._sink: Any = None
        self._writer: pq.ParquetWriter | None = None
        self._shard_rows_written = 0

    def _open_shard(self) -> None:
        assert self._split is not None
        path = self.folder / f".{self._split}-{len(self._tmp_files):05d}.parquet.tmp"
        self._tmp_files.append(path)
        self._sink = open(path, "wb")  # noqa: SIM115 - closed in close_shard
        self._writer = _parquet_writer(self._sink, self.schema)
        self._shard_rows_written = 0

    def close_shard(self) -> None:
        """Close the open shard, if any (also on errors, so no file handle leaks)."""
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer, self._sink = None, None

    def _finish_split(self) -> None:
        if self._split is None:
            return
        self.close_shard()
        n = len(self._tmp_files)
        files = []
        for i, tmp in enumerate(self._tmp_files):
            name = f"{self._split}-{i:05d}-of-{n:05d}.parquet"
            os.replace(tmp, self.folder / name)
            files.append(f"{self.rel}/{name}")
        self.splits.append(SplitExport(self._split, self._split_rows, tuple(files)))
        self._split, self._tmp_files, self._split_rows = None, [], 0

    def _start_split(self, split: str) -> None:
        if not _SPLIT_RE.match(split):
            raise TrajlakeError(f"{self.table}: split {split!r} is not a valid Hub split name (letters, digits, _)")
        if any(s.split == split for s in self.splits):  # rows arrive ordered by split
            raise TrajlakeError(f"{self.table}: rows of split {split!r} arrived out of order")
        self._split = split

    def write(self, split: str, rows: pa.Table) -> None:
        """Append ``rows`` (all of ``split``) to the current shard, rotating shards at the caps."""
        if split != self._split:
            self._finish_split()
            self._start_split(split)
        offset = 0
        while offset < rows.num_rows:
            if self._writer is None:
                self._open_shard()
            assert self._writer is not None
            take = min(rows.num_rows - offset, self.shard_rows - self._shard_rows_written)
            part = rows.slice(offset, take)
            self._writer.write_table(part, row_group_size=max(1, take))
            offset += take
            self._shard_rows_written += take
            self._split_rows += take
            if self._shard_rows_written >= self.shard_rows or self._sink.tell() >= self.max_shard_bytes:
                self.close_shard()

    def finish(self) -> list[SplitExport]:
        """Close the last shard. A table without rows gets no shard (``datasets`` cannot load an empty split)."""
        self._finish_split()
        return self.splits


def _split_runs(values: Sequence[Any]) -> Iterator[tuple[str, int, int]]:
    """(split, start, length) of each run of equal values."""
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            yield str(values[start]), start, i - start
            start = i


def _export_table(con: duckdb.DuckDBPyConnection, table: str, staging: Path, *, include_hidden: bool,
                  shard_rows: int, max_shard_bytes: int, metadata: dict[str, str]) -> TableExport:
    rel = f"{DATA_DIR}/{table}"
    folder = staging / rel
    folder.mkdir(parents=True, exist_ok=True)
    schema = export_arrow_schema(table, metadata)
    sw = _ShardWriter(table, folder, rel, schema, shard_rows, max_shard_bytes)
    try:
        reader = _arrow_reader(con, _export_query(table, include_hidden))
        for batch in reader:
            if batch.num_rows == 0:
                continue
            splits = batch.column(_SPLIT_COL).to_pylist()
            if None in splits:
                raise TrajlakeError(f"{table}: a row has no split (null split, or an episode without one)")
            data = pa.Table.from_batches([batch]).drop_columns([_SPLIT_COL]).cast(schema)
            for split, start, length in _split_runs(splits):
                sw.write(split, data.slice(start, length))
    except duckdb.Error as e:
        raise TrajlakeError(f"export of {table}: {str(e).splitlines()[0]}") from e
    finally:
        sw.close_shard()
    splits = sw.finish()
    if not splits:
        folder.rmdir()
    excluded = 0 if include_hidden else _count_hidden(con, table)
    return TableExport(table, tuple(splits), excluded)


# ------------------------------------------------------------------------------------------------- the card
def _yaml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render_card(summary: ExportSummary, lake_name: str) -> str:
    """The dataset card (README.md): YAML front matter with the configs, then schema, versions and notes."""
    tables = [t for t, te in summary.tables.items() if te.splits]  # tables with rows: one config each
    empty = [t for t in summary.tables if t not in tables]
    y = ["---", f"license: {_yaml_str(summary.license)}", f"pretty_name: {_yaml_str('trajlake trajectories: ' + lake_name)}",
         "tags:", "- \"trajlake\"", "- \"agentic-rl\"", "- \"trajectories\"",
         "task_categories:", "- \"reinforcement-learning\"", "configs:"]
    for t in tables:
        y.append(f"- config_name: {_yaml_str(t)}")
        if t == "episodes":
            y.append("  default: true")
        y.append("  data_files:")
        for s in summary.tables[t].splits:
            y += [f"  - split: {_yaml_str(s.split)}", f"    path: {_yaml_str(f'{DATA_DIR}/{t}/{s.split}-*.parquet')}"]
    y.append("---")

    b: list[str] = [
        "", f"# trajlake trajectories: {lake_name}", "",
        "Agentic multi-turn RL trajectories exported from a trajlake lake with "
        f"`trajlake export hf` (trajlake {__version__}, schema v{SCHEMA_VERSION}) at {summary.exported_at}. "
        "One config per table; episodes are the unit, turns hold token ids, loss masks and behaviour log-probs.", "",
    ]
    if summary.include_hidden:
        b += ["> **WARNING: this export includes the `hidden` split** (`--include-hidden`). Hidden tasks are "
              "held out for evaluation; training on them, or publishing them, contaminates every later "
              "evaluation on those tasks.", ""]
    first = "turns" if "turns" in tables else tables[0]
    split_names = [s.split for s in summary.tables[first].splits]
    first_split = NO_SPLIT_NAME if NO_SPLIT_NAME in split_names else split_names[0]
    b += ["## Loading", "", "```python", "from datasets import load_dataset", "",
          f'ds = load_dataset("<this repo or folder>", "{first}", split="{first_split}")',
          "```", "",
          "Map columns (`reward_components`) are exported as lists of `{key, value}` structs, because `datasets` "
          "has no map feature: `dict((kv[\"key\"], kv[\"value\"]) for kv in row[\"reward_components\"])` "
          "gives the map back. Timestamps are UTC microseconds. Every other column has its lake type.", ""]

    b += ["## Versions", "", "The export read these Delta table versions of the lake (every table is pinned, "
          "since splits and the hidden filter read `episodes` and `tasks`):", "",
          "| table | version |", "| --- | --- |"]
    b += [f"| `{t}` | {v} |" for t, v in summary.versions.items()]
    flags = f" --tables {','.join(tables)}" + (" --include-hidden" if summary.include_hidden else "")
    b += ["", "Reproduce it (same rows, same order) from the same lake, as long as it keeps these versions "
          "(`trajlake compact` vacuums files removed longer ago than its retention, 7 days by default), with:",
          "", "```bash",
          f"trajlake --lake LAKE export hf --out DIR --as-of {summary.as_of}{flags} --license {summary.license}",
          "```", ""]

    b += ["## Rows", "", "| config | split | rows | shards |", "| --- | --- | ---: | ---: |"]
    for t in summary.tables:
        for s in summary.tables[t].splits:
            b.append(f"| `{t}` | `{s.split}` | {s.rows} | {len(s.files)} |")
        if not summary.tables[t].splits:
            b.append(f"| `{t}` | - | 0 | 0 |")
    b += ["", "Splits: `episodes` and `tasks` use their own `split` column; `turns` and `gateway_events` take the "
          "split of their episode (they have no split column); `runs` have no split and are all in `train`."]
    if empty:
        b.append("Tables without rows at these versions have no files and no config (`datasets` cannot load an "
                 "empty split): " + ", ".join(f"`{t}`" for t in empty) + ".")
    b.append("")

    b += ["## Contamination", ""]
    excluded = {t: te.excluded_hidden for t, te in summary.tables.items()}
    if summary.include_hidden:
        b.append("Rows of the `hidden` split **are included** in this export (`--include-hidden` was given).")
    else:
        b.append("Rows of the `hidden` split are **excluded**: an episode is hidden when its `split` is `hidden` "
                 "or its task id appears in `tasks` with split `hidden`; its turns and gateway events are excluded "
                 "with it, and so are hidden tasks (their statements). Hidden-split tasks are exported only with an "
                 "explicit `--include-hidden`. Rows left out: "
                 + ", ".join(f"`{t}` {n}" for t, n in excluded.items()) + ".")
    b += ["", "Task splits are assigned by template family and a family never spans two splits, so `dev` and "
          "`test` rows may be used to evaluate a model trained on `train`; do not train on them if you report "
          "results on those splits. `runs` are all in `train` and describe configurations only (no task content).",
          ""]
    b += contamination_card(summary, lake_name)

    b += not_checked_card(summary)

    b += ["## Schema", ""]
    for t in tables:
        td = table_def(t)
        b += [f"### `{t}`", "", td.description, "",
              f"Primary key: `{', '.join(td.primary_key)}` (rows are ordered by split, then this key).", "",
              "| column | type | nullable | allowed values | description |", "| --- | --- | --- | --- | --- |"]
        for c in td.columns:
            et = export_type_str(t, c.name)
            typ = f"`{et}`" + (f" (lake: `{c.type_str()}`)" if et != c.type_str() else "")
            enum = ", ".join(c.enum) if c.enum else ""
            b.append(f"| `{c.name}` | {_md(typ)} | {'yes' if c.nullable else 'no'} | {_md(enum)} | {_md(c.description)} |")
        b.append("")
    return "\n".join(y + b)


def not_checked_card(summary: ExportSummary) -> list[str]:
    """The card's "Not checked" section: what the exporter did not check (every layout)."""
    not_checked = [
        "No PII or secret scan of `raw_content`, `tool_args`, task statements or run configs.",
        "No license or terms-of-use check of the source trajectories, the tasks, or the models that produced "
        "the policy turns" + (" (the license field is `other`: choose one)." if summary.license == "other" else "."),
        "No content-hash verification at export time (run `trajlake verify --as-of ...` on the lake).",
        "No decontamination against public benchmarks or other datasets: the contamination scan above compares "
        "this lake's evaluation splits with its own `train` split only.",
        "No toxicity or safety filtering; observations may contain prompt-injection payloads "
        "(`episodes.injection_attempted`).",
        "Uncommitted (orphan) turns are never exported; no other completeness check was made.",
        "The Hub's dataset viewer was not tried on these files.",
    ]
    return ["## Not checked", "", "The exporter did **not** run or check the following; do it before publishing:",
            "", *(f"- {x}" for x in not_checked), ""]


def contamination_card(summary: ExportSummary, lake_name: str) -> list[str]:
    b = ["### Contamination scan", ""]
    if not summary.contamination:
        return [*b, "No evaluation split (tasks on a split other than `train`) was exported, so no scan was run.", ""]
    b += ["`trajlake contamination` (docs/contamination.md) compared each exported evaluation split with the "
          "`train` split episodes at the pinned versions: exact 13-gram overlap of task statements, gold patches "
          "and hidden tests with training turns; MinHash near duplicates with identifier normalisation; the "
          "family rule; the time split (tasks created before a run's `data_cutoff`); shared source commits "
          "(listed, not flagged); and tool-call n-grams of eval episodes replayed in training.", "",
          "| split | tasks | flagged | exact n-gram | near duplicate | family | time split | trajectory | "
          "shared commit (listed) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in summary.contamination:
        if "error" in c:
            b.append(f"| `{c['split']}` | - | not run: {_md(c['error'])} | | | | | | |")
            continue
        cells = [str(c["checks"][k]) for k in ("exact_ngram", "near_duplicate", "family", "time_split",
                                                "trajectory")]
        b.append(f"| `{c['split']}` | {c['tasks']} | {len(c['flagged_tasks'])} | " + " | ".join(cells)
                 + f" | {c['shared_commit']} |")
    b.append("")
    for c in summary.contamination:
        if c.get("flagged_tasks"):
            shown = ", ".join(f"`{t}`" for t in c["flagged_tasks"][:20])
            more = f" and {len(c['flagged_tasks']) - 20} more" if len(c["flagged_tasks"]) > 20 else ""
            b.append(f"Flagged on `{c['split']}`: {shown}{more}.")
    b += ["", f"Reproduce: `trajlake --lake {lake_name} contamination --eval-split SPLIT --as-of {summary.as_of} "
          "--format json`.", ""]
    return b


def contamination_summary(lk: Lake, versions: dict[str, int], include_hidden: bool) -> tuple[dict[str, Any], ...]:
    """Run the contamination scan on every exported evaluation split (a task split other than ``train``; the
    ``hidden`` split only with ``include_hidden``) and keep the counts the dataset card shows."""
    # evaluators sit beside io; imported here so an export without task rows never loads them
    from trajlake.evaluators.contamination import scan
    from trajlake.query import connect

    con = connect(lk, versions)
    try:
        splits = [str(s) for (s,) in con.execute(
            "SELECT DISTINCT split FROM tasks WHERE split IS NOT NULL AND split <> 'train' ORDER BY 1").fetchall()]
    finally:
        con.close()
    out: list[dict[str, Any]] = []
    for split in splits:
        if split == HIDDEN_SPLIT and not include_hidden:
            continue
        try:
            r = scan(lk, eval_split=split, as_of=versions)
        except TrajlakeError as e:
            out.append({"split": split, "error": str(e)})
            continue
        checks = {k: (v["status"] if v["status"] != "checked" else len(v["flagged"]))
                  for k, v in r["checks"].items()}
        checks = {k: ("not checkable" if v == "not_checkable" else v) for k, v in checks.items()}
        out.append({"split": split, "tasks": r["n_eval_tasks"], "flagged_tasks": r["flagged_tasks"],
                    "checks": checks, "shared_commit": len(r["checks"]["repo_commit"]["shared"])})
    return tuple(out)


# ------------------------------------------------------------------------------------------------- push
def push_to_hub(out: str | os.PathLike[str], repo_id: str, *, private: bool = True, api: Any = None,
                token: str | None = None, commit_message: str | None = None) -> tuple[str, str | None]:
    """Upload the export in ``out`` to the dataset repo ``repo_id`` (created, private by default, if missing).

    Only ``README.md`` and ``data/**`` are uploaded; remote ``data/**`` files this export does not have are
    deleted in the same commit. The token is ``token`` or ``$HF_TOKEN``; ``api`` replaces
    ``huggingface_hub.HfApi(token=...)`` (tests). Returns (dataset URL, commit URL or None)."""
    _check_repo_id(repo_id)
    if api is None:
        api = _hf_api(token)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id, folder_path=str(out), repo_type="dataset",
            allow_patterns=[CARD, f"{DATA_DIR}/**"], delete_patterns=[f"{DATA_DIR}/**"],
            commit_message=commit_message or "trajlake export hf",
        )
    except TrajlakeError:
        raise
    except Exception as e:  # huggingface_hub raises HfHubHTTPError, OfflineModeIsEnabled, OSError, ...
        msg = (str(e).strip().splitlines() or [""])[0]
        raise TrajlakeError(f"--push {repo_id}: upload failed: {type(e).__name__}: {msg}") from e
    commit_url = getattr(info, "commit_url", None)
    return f"https://huggingface.co/datasets/{repo_id}", (str(commit_url) if commit_url else None)


def _check_repo_id(repo_id: str) -> None:
    if not _REPO_RE.match(repo_id) or ".." in repo_id or repo_id.endswith(".git"):
        raise TrajlakeError(f"--push: {repo_id!r} is not a Hub repo id like 'user/name'")


def _hf_api(token: str | None) -> Any:
    """A real ``HfApi``; refuses (one line) without a token or without huggingface_hub installed."""
    token = token or os.environ.get("HF_TOKEN")
    if not token:
        raise TrajlakeError("--push needs a Hugging Face token with write access in $HF_TOKEN "
                            "(create one at https://huggingface.co/settings/tokens); nothing was exported")
    try:
        import huggingface_hub
    except ImportError as e:
        raise TrajlakeError("--push needs huggingface_hub: pip install 'trajlake[hf]'") from e
    return huggingface_hub.HfApi(token=token)


# ------------------------------------------------------------------------------------------------- export
def _parse_tables(tables: str | Sequence[str] | None) -> list[str]:
    if tables is None:
        return list(TABLES)
    items = tables.split(",") if isinstance(tables, str) else list(tables)
    names = list(dict.fromkeys(t.strip() for t in items if t.strip()))
    if not names:
        raise TrajlakeError(f"--tables: no table named; tables are {', '.join(TABLES)}")
    unknown = [t for t in names if t not in TABLES]
    if unknown:
        raise TrajlakeError(f"--tables: unknown table(s) {', '.join(unknown)}; tables are {', '.join(TABLES)}")
    return [t for t in TABLES if t in names]  # canonical order


def _check_out(out: Path, overwrite: bool, lake: Lake) -> None:
    if out.exists() and not out.is_dir():
        raise TrajlakeError(f"--out {out}: exists and is not a directory")
    root = lake.root.resolve() if lake.is_local else None  # an export is local: never inside an S3 lake
    target = out.resolve()
    if root is not None and (target == root or root in target.parents):
        raise TrajlakeError(f"--out {out}: is inside the lake {root}; export somewhere else")
    try:  # what a killed export left must neither block this one nor count as the folder's files
        recover_export(out)
    except OSError as e:
        raise TrajlakeError(f"--out {out}: cannot repair what an interrupted export left: {e.strerror or e}"
                            f"{f' ({e.filename})' if e.filename else ''}; fix it and rerun") from e
    if out.is_dir() and _own_entries(out) and not overwrite:
        raise TrajlakeError(f"--out {out}: directory is not empty; pass --overwrite to replace its "
                            f"{CARD} and {DATA_DIR}/ (other files are kept)")


LAYOUTS = ("trajectories", "sft", "rl")
"""Layouts of ``export_hf``: the lake's tables as they are, or a training dataset (:mod:`trajlake.io.hf_layouts`)."""


@dataclass(frozen=True)
class ExportTarget:
    """What every layout checks before it writes: the lake, the output folder, the pinned versions, the Hub."""

    lake: Lake
    out: Path
    versions: dict[str, int]
    api: Any
    overwrite: bool = False


def prepare_export(lake: LakeArg, out: str | os.PathLike[str], *, as_of: str | dict[str, int]
                   | None, license: str, push: str | None, overwrite: bool, api: Any,
                   shard_rows: int = 1, max_shard_bytes: int = 1) -> ExportTarget:
    """Check the options shared by every layout (one-line errors before anything is written) and pin versions."""
    if shard_rows < 1:
        raise TrajlakeError(f"--shard-rows must be at least 1, not {shard_rows}")
    if max_shard_bytes < 1:
        raise TrajlakeError(f"the shard size cap must be at least 1 byte, not {max_shard_bytes}")
    if not _LICENSE_RE.match(license):
        raise TrajlakeError(f"--license {license!r}: use a Hub license id such as apache-2.0, cc-by-4.0 or other")
    if push is not None:
        _check_repo_id(push)
        if api is None:
            api = _hf_api(None)  # fail before the (long) export when there is no token
    lk = as_lake(lake)
    out_p = Path(out)
    _check_out(out_p, overwrite, lk)
    return ExportTarget(lk, out_p, dict(lk.resolve_as_of(as_of) or lk.versions()), api, overwrite)


# ------------------------------------------------------------------------------------------------- crash safety
# An export is built in a staging folder, then swapped into place so that at every instant (a kill included) the
# output folder holds the complete old export or the complete new one. The usual way ("swap" mode) stages a
# sibling of the output folder, ``.<name>.trajlake-export-<pid>-<hex>``, moves the folder's other files into it,
# and exchanges the two folders with one rename (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames via
# ``.<name>.trajlake-old-<id>``: a kill between them leaves no folder, and the next export finishes the swap,
# as ``recover_export`` does). When the folder
# itself cannot move (a mount point, an unwritable parent, the current directory) the staging folder sits inside
# it ("in place" mode) and README.md and data/ are renamed one after the other; a kill between the two leaves a
# marker and the next export finishes the swap. A staging folder is locked (``flock`` on its directory) by the
# process that builds it, so the kernel drops the lock when that process dies, even by SIGKILL: an unlocked
# staging folder is a leftover, a locked one belongs to a running export and is never touched. Swaps and the
# recovery of leftovers run under a lock on the folder that never moves (the parent, or the folder in place).
_STAGE = "trajlake-export-"
_OLD = "trajlake-old-"
_SPILL = ".trajlake-duckdb-tmp"
_SWAP_MARK = ".trajlake-swapping"
_INTERNAL = frozenset({CARD, DATA_DIR, _SPILL, _SWAP_MARK})
"""Names inside a staging folder that belong to the export; anything else was moved there from the folder."""
_IN_PLACE_RE = re.compile(r"^\.trajlake-export-")  # this version's and older versions' staging inside ``out``


@dataclass(frozen=True)
class _Place:
    """Where the export of one output folder is staged and how it is swapped in."""

    out: Path
    """The output folder, symlinks resolved (the swap replaces the folder a link points to, not the link)."""
    in_place: bool

    @property
    def anchor(self) -> Path:
        """The folder that never moves: locked while swapping or recovering."""
        return self.out if self.in_place else self.out.parent

    @property
    def prefix(self) -> str:
        """Name prefix of this folder's staging siblings (a digest for very long names: NAME_MAX is 255)."""
        name = self.out.name
        if len(name) > 150:
            name = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
        return f".{name}."

    def sibling_re(self) -> re.Pattern[str]:
        return re.compile(rf"^{re.escape(self.prefix)}({_STAGE}|{_OLD})(\d+-[0-9a-f]{{8}})$")


def _place(out: Path) -> _Place:
    real = Path(os.path.realpath(out))
    if not real.is_dir():
        return _Place(real, in_place=False)
    cwd = Path.cwd().resolve()
    fixed = (os.path.ismount(real) or not os.access(real.parent, os.W_OK | os.X_OK)
             or cwd == real or real in cwd.parents)  # renaming the cwd would strand this process and the shell
    return _Place(real, in_place=fixed)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (``renameat2(RENAME_EXCHANGE)``); False where the OS or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:  # glibc < 2.28, musl
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _try_lock(path: Path) -> int | None:
    """A descriptor holding the lock of the folder ``path``; None if another process holds it (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextmanager
def _anchor_lock(place: _Place) -> Iterator[None]:
    """Hold the lock of the folder that does not move (waits for another export's swap to end)."""
    fd = os.open(place.anchor, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _return_entries(stage: Path, out: Path) -> None:
    """Move the folder's own files, which a killed swap left in ``stage``, back to ``out``."""
    for p in sorted(stage.iterdir()):
        if p.name in _INTERNAL:
            continue
        if os.path.lexists(out / p.name):
            raise TrajlakeError(f"--out {out}: an interrupted export left {p.name} in {stage}, and {out} has one "
                                f"too; keep one of them by hand, delete {stage} and rerun")
        os.rename(p, out / p.name)


def _finish_in_place(stage: Path, out: Path) -> None:
    """Move the finished export in ``stage`` (inside ``out``) into place, skipping steps already done."""
    if (stage / DATA_DIR).is_dir():
        if os.path.lexists(out / DATA_DIR):
            os.rename(out / DATA_DIR, stage / f".old-{DATA_DIR}-{secrets.token_hex(4)}")
        os.rename(stage / DATA_DIR, out / DATA_DIR)
    if (stage / CARD).is_file():
        os.replace(stage / CARD, out / CARD)


def _recover(place: _Place) -> None:
    """Repair what killed exports of ``place.out`` left (call with the anchor lock held): finish a swap that a
    kill cut between its two renames, return the folder's own files, and delete unlocked staging folders. A
    locked staging folder belongs to a running export and is left alone."""
    out = place.out
    held: list[int] = []
    try:
        if out.is_dir():  # staging folders inside the folder (in place mode; older trajlake versions)
            for p in sorted(out.iterdir()):
                if not (_IN_PLACE_RE.match(p.name) and p.is_dir()):
                    continue
                fd = _try_lock(p)
                if fd is None:
                    continue
                held.append(fd)
                if (p / _SWAP_MARK).exists():  # built and marked: roll the swap forward
                    _finish_in_place(p, out)
                shutil.rmtree(p)
        if place.in_place or not out.parent.is_dir():
            return
        stages: dict[str, Path] = {}
        olds: dict[str, Path] = {}
        pattern = place.sibling_re()
        for p in sorted(out.parent.iterdir()):
            m = pattern.match(p.name)
            if m is None or not p.is_dir():
                continue
            if m.group(1) == _OLD:
                olds[m.group(2)] = p  # only exists inside a swap, which holds the anchor lock we hold now
                continue
            fd = _try_lock(p)
            if fd is not None:
                held.append(fd)
                stages[m.group(2)] = p
        if not out.exists():
            # A kill between "folder -> old" and "staging -> folder": the staging is complete (with the
            # folder's own files), so finish the swap; without it, put the old folder back.
            for key, old in olds.items():
                if key in stages:
                    os.rename(stages.pop(key), out)
                else:
                    os.rename(old, out)
                    olds.pop(key)
                break
        for stage in stages.values():
            if out.is_dir():
                _return_entries(stage, out)
            shutil.rmtree(stage)
        for old in olds.values():
            shutil.rmtree(old)
    finally:
        for fd in held:
            os.close(fd)


def recover_export(out: str | os.PathLike[str]) -> None:
    """Repair what a killed ``export hf`` left in or beside ``out`` (every export does this first)."""
    place = _place(Path(out))
    if place.anchor.is_dir():
        with _anchor_lock(place):
            _recover(place)


def _own_entries(out: Path) -> list[str]:
    """Names in ``out`` other than staging folders of running in-place exports."""
    return sorted(p.name for p in out.iterdir() if not _IN_PLACE_RE.match(p.name))


def _new_stage(place: _Place) -> tuple[Path, int]:
    """Create and lock a staging folder (under the anchor lock, so no recovery sees it unlocked)."""
    parent = place.out if place.in_place else place.out.parent
    with _anchor_lock(place):
        while True:
            name = f"{os.getpid()}-{secrets.token_hex(4)}"
            stage = parent / (f".{_STAGE}{name}" if place.in_place else f"{place.prefix}{_STAGE}{name}")
            try:
                stage.mkdir()
            except FileExistsError:
                continue
            fd = _try_lock(stage)
            assert fd is not None  # just created, under the anchor lock
            return stage, fd


def _swap_in(place: _Place, stage: Path, overwrite: bool) -> None:
    """Put the finished export in ``stage`` in place of ``place.out`` (call with the anchor lock held)."""
    out = place.out
    shutil.rmtree(stage / _SPILL, ignore_errors=True)
    if out.is_dir() and not overwrite and _own_entries(out):
        raise TrajlakeError(f"--out {out}: files appeared in the folder during the export; nothing was "
                            "changed; pass --overwrite to replace its README.md and data/")
    if place.in_place:
        (stage / _SWAP_MARK).touch()  # from here on a rerun finishes this swap instead of deleting it
        _finish_in_place(stage, out)
        shutil.rmtree(stage, ignore_errors=True)
        return
    if not out.exists():
        os.rename(stage, out)  # a fresh export: one rename, nothing to keep
        return
    shutil.copymode(out, stage)  # the new folder keeps the old one's permissions
    for name in _own_entries(out):
        if name not in (CARD, DATA_DIR):
            os.rename(out / name, stage / name)  # the folder's own files (.git, notes) go with the new export
    if _exchange(stage, out):  # the commit point
        shutil.rmtree(stage, ignore_errors=True)  # now the old export (a leftover is removed by the next export)
        return
    old = stage.with_name(place.prefix + _OLD + stage.name[len(place.prefix + _STAGE):])
    os.rename(out, old)
    os.rename(stage, out)  # the commit point; a kill just before it leaves no folder, put back by _recover
    shutil.rmtree(old, ignore_errors=True)


def _cleanup_after_error(place: _Place, stage: Path, fd: int) -> None:
    """What a failed (not killed) export does: unlock its staging folder and repair as a rerun would."""
    os.close(fd)
    if place.anchor.is_dir():
        with _anchor_lock(place):
            _recover(place)
    shutil.rmtree(stage, ignore_errors=True)


def write_staged(out: Path, build: Callable[[Path], ExportSummary], *, overwrite: bool = True) -> ExportSummary:
    """Run ``build(staging)`` (which writes ``README.md`` and ``data/`` into a staging folder), then swap the
    result into ``out`` so that the folder holds the old export or the new one at every instant, even if the
    process is killed (see the crash-safety comment above). Files of ``out`` other than README.md and data/ are
    kept. On an error ``out`` is left as it was: a failed export never leaves partial data."""
    place = _place(out)
    try:
        place.anchor.mkdir(parents=True, exist_ok=True)
        stage, fd = _new_stage(place)
    except OSError as e:
        raise TrajlakeError(f"--out {out}: cannot create the folder: {e.strerror or e}") from e
    try:
        summary = build(stage)
        with _anchor_lock(place):
            _recover(place)  # an export killed meanwhile (or before) leaves nothing half done under ours
            _swap_in(place, stage, overwrite)
    except BaseException as e:
        _cleanup_after_error(place, stage, fd)
        if isinstance(e, OSError):
            raise TrajlakeError(f"--out {out}: could not write the export: {e.strerror or e}"
                                f"{f' ({e.filename})' if e.filename else ''}; the folder is as it was, "
                                "fix the cause and rerun") from e
        raise
    os.close(fd)
    return summary


def set_temp_directory(con: duckdb.DuckDBPyConnection, staging: Path) -> None:
    """Let DuckDB spill sorts into the staging folder (removed with it)."""
    tmp = staging / _SPILL
    con.execute(f"SET temp_directory = '{str(tmp).replace(chr(39), chr(39) * 2)}'")


def push_export(summary: ExportSummary, push: str | None, *, private: bool, api: Any) -> ExportSummary:
    """Upload a finished export when ``push`` names a repo; the summary with the URLs."""
    if push is None:
        return summary
    layout = "" if summary.layout == "trajectories" else f" --layout {summary.layout}"
    url, commit = push_to_hub(summary.out, push, private=private, api=api,
                              commit_message=f"trajlake export hf{layout} --as-of {summary.as_of}")
    return replace(summary, pushed_to=url, commit_url=commit)


def export_hf(lake: LakeArg, out: str | os.PathLike[str], *,
              tables: str | Sequence[str] | None = None, as_of: str | dict[str, int] | None = None,
              license: str = "other", include_hidden: bool = False, shard_rows: int = DEFAULT_SHARD_ROWS,
              max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, push: str | None = None, overwrite: bool = False,
              private: bool = True, memory_limit: str | None = None, threads: int | None = None,
              api: Any = None, contamination: bool = True, layout: str = "trajectories",
              success_only: bool | None = None, runs: str | Sequence[str] | None = None,
              system_prompt: bool | None = None) -> ExportSummary:
    """Export lake tables as a Hugging Face dataset folder in ``out`` (and upload it when ``push``).

    ``tables``: names or a comma-separated string (default: all five). ``as_of``: pin versions as
    ``connect`` takes them; every table is pinned (current versions when None) and the card records the pins.
    ``include_hidden``: also export rows of the ``hidden`` split (by default they are left out). Shards hold at
    most ``shard_rows`` rows and close once about ``max_shard_bytes`` are written. ``out`` must be empty or
    missing unless ``overwrite`` (which replaces only ``README.md`` and ``data/``). ``push``: a Hub dataset
    repo id; needs ``$HF_TOKEN`` (checked before anything is written) unless ``api`` (an ``HfApi``-like
    object) is given. ``contamination``: run the contamination scan for the card's contamination section.
    ``layout``: ``trajectories`` (the tables as they are, the default) or a training layout, ``sft`` or ``rl``
    (:func:`trajlake.io.hf_layouts.export_layout`, which takes ``success_only``, ``runs`` and
    ``system_prompt``; ``tables`` applies to ``trajectories`` only). Bad input raises :class:`TrajlakeError`
    with a one-line message."""
    from trajlake.query import connect

    if layout not in LAYOUTS:
        raise TrajlakeError(f"--layout {layout!r}: layouts are {', '.join(LAYOUTS)}")
    if layout != "trajectories":
        if tables is not None:
            raise TrajlakeError(f"--tables applies to --layout trajectories only, not --layout {layout}")
        from trajlake.io.hf_layouts import export_layout

        return export_layout(lake, out, layout=layout, as_of=as_of, license=license, include_hidden=include_hidden,
                             shard_rows=shard_rows, max_shard_bytes=max_shard_bytes, push=push,
                             overwrite=overwrite, private=private, memory_limit=memory_limit, threads=threads,
                             api=api, contamination=contamination, success_only=success_only, runs=runs,
                             system_prompt=system_prompt)
    for name, value in (("--success-only/--all-episodes", success_only), ("--runs", runs),
                        ("--system-prompt/--no-system-prompt", system_prompt)):
        if value is not None:
            raise TrajlakeError(f"{name} applies to --layout sft or rl, not --layout trajectories")
    names = _parse_tables(tables)
    target = prepare_export(lake, out, as_of=as_of, license=license, push=push, overwrite=overwrite, api=api,
                            shard_rows=shard_rows, max_shard_bytes=max_shard_bytes)
    lk, versions = target.lake, target.versions

    def build(staging: Path) -> ExportSummary:
        con = connect(lk, versions, memory_limit=memory_limit, threads=threads)
        try:
            set_temp_directory(con, staging)
            pins = ",".join(f"{t}={v}" for t, v in versions.items())
            meta = {"trajlake.as_of": pins, "trajlake.include_hidden": str(include_hidden).lower()}
            exported = {t: _export_table(con, t, staging, include_hidden=include_hidden, shard_rows=shard_rows,
                                         max_shard_bytes=max_shard_bytes, metadata=meta) for t in names}
        finally:
            con.close()
        if not any(te.splits for te in exported.values()):
            raise TrajlakeError(f"nothing to export: {', '.join(names)} have no rows at --as-of {pins}"
                                + ("" if include_hidden else " (hidden split excluded)"))
        summary = ExportSummary(out=target.out, tables=exported, versions=dict(versions),
                                include_hidden=include_hidden, license=license,
                                exported_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                                contamination=contamination_summary(lk, dict(versions), include_hidden)
                                if contamination else ())
        (staging / CARD).write_text(render_card(summary, lk.name), encoding="utf-8")
        return summary

    summary = write_staged(target.out, build, overwrite=target.overwrite)
    return push_export(summary, push, private=private, api=target.api)
