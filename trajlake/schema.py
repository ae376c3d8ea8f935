"""Schema v1: load the language-neutral JSON definitions in ``schemas/`` and derive pyarrow schemas.

The JSON files are the single source of truth; ``docs/schema.md`` is generated from them
(``trajlake schema --format markdown``) and a test fails when it drifts.

Type grammar of a column's ``type``:
``"string" | "bool" | "int8" | "int32" | "int64" | "float32" | "float64" | "timestamp"`` (microseconds, UTC),
``{"list": TYPE}``, ``{"map": [KEY_TYPE, VALUE_TYPE]}`` and ``{"struct": [COLUMN, ...]}``.
A column may carry ``"enum": [...]``: a closed set of allowed string values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from typing import Any

import pyarrow as pa

from trajlake.errors import SchemaDefinitionError, SchemaVersionError

SCHEMA_VERSION = "1.1"
SCHEMA_MAJOR = 1
#: The first version of the current major: columns with a later ``since`` may be missing from older files.
BASE_SCHEMA_VERSION = f"{SCHEMA_MAJOR}.0"
TABLES: tuple[str, ...] = ("episodes", "turns", "tasks", "runs", "gateway_events")
# Parquet key-value metadata key under which every data file records its schema version.
PARQUET_SCHEMA_KEY = b"trajlake.schema_version"
PARQUET_TABLE_KEY = b"trajlake.table"

_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


@dataclass(frozen=True)
class Column:
    """One column of a table definition."""

    name: str
    type: Any
    nullable: bool
    description: str
    enum: tuple[str, ...] | None = None
    since: str = "1.0"
    """Schema version that added the column; files written before it lack it and read it as null."""

    @property
    def arrow_type(self) -> pa.DataType:
        return to_arrow_type(self.type)

    def type_str(self) -> str:
        return type_to_str(self.type)


@dataclass(frozen=True)
class TableDef:  # not slotted: cached_property needs an instance __dict__
    """A table definition loaded from ``schemas/<table>.v1.json``."""

    name: str
    schema_version: str
    description: str
    primary_key: tuple[str, ...]
    partition_by: tuple[str, ...]
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> list[str]:
        return list(self.column_set)

    @cached_property
    def column_set(self) -> dict[str, Column]:
        """Columns by name, in definition order (cached: used on every validated batch)."""
        return {c.name: c for c in self.columns}

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")

    def arrow_schema(self) -> pa.Schema:
        return arrow_schema(self.name)


def to_arrow_type(t: Any) -> pa.DataType:
    if isinstance(t, str):
        if t not in _PRIMITIVES:
            raise SchemaDefinitionError(f"unknown type {t!r}")
        return _PRIMITIVES[t]
    if isinstance(t, dict) and len(t) == 1:
        (kind, arg), = t.items()
        if kind == "list":
            return pa.list_(to_arrow_type(arg))
        if kind == "map":
            return pa.map_(to_arrow_type(arg[0]), to_arrow_type(arg[1]))
        if kind == "struct":
            return pa.struct([pa.field(c["name"], to_arrow_type(c["type"]), c.get("nullable", True)) for c in arg])
    raise SchemaDefinitionError(f"malformed type {t!r}")


def type_to_str(t: Any) -> str:
    if isinstance(t, str):
        return t
    (kind, arg), = t.items()
    if kind == "list":
        return f"list<{type_to_str(arg)}>"
    if kind == "map":
        return f"map<{type_to_str(arg[0])}, {type_to_str(arg[1])}>"
    return "struct<" + ", ".join(f"{c['name']}: {type_to_str(c['type'])}" for c in arg) + ">"


def _parse(raw: dict[str, Any], origin: str) -> TableDef:
    try:
        cols = tuple(
            Column(
                name=c["name"],
                type=c["type"],
                nullable=bool(c["nullable"]),
                description=c["description"],
                enum=tuple(c["enum"]) if "enum" in c else None,
                since=str(c.get("since", "1.0")),
            )
            for c in raw["columns"]
        )
        td = TableDef(
            name=raw["table"],
            schema_version=raw["schema_version"],
            description=raw["description"],
            primary_key=tuple(raw["primary_key"]),
            partition_by=tuple(raw["partition_by"]),
            columns=cols,
        )
    except (KeyError, TypeError) as e:
        raise SchemaDefinitionError(f"{origin}: missing or malformed key {e}") from e
    for c in cols:
        to_arrow_type(c.type)
    names = td.column_names
    for k in (*td.primary_key, *td.partition_by):
        if k not in names:
            raise SchemaDefinitionError(f"{origin}: key column {k!r} is not a column")
    return td


@cache
def table_def(name: str) -> TableDef:
    """The definition of table ``name`` (one of TABLES)."""
    if name not in TABLES:
        raise SchemaDefinitionError(f"unknown table {name!r}; tables are {', '.join(TABLES)}")
    fname = f"{name}.v{SCHEMA_MAJOR}.json"
    text = resources.files("trajlake.schemas").joinpath(fname).read_text(encoding="utf-8")
    return _parse(json.loads(text), fname)


@cache
def arrow_schema(name: str) -> pa.Schema:
    """The pyarrow schema of table ``name``, with the schema version in its metadata."""
    td = table_def(name)
    fields = [pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in td.columns]
    return pa.schema(fields, metadata={PARQUET_SCHEMA_KEY: SCHEMA_VERSION.encode(), PARQUET_TABLE_KEY: name.encode()})


def all_table_defs() -> list[TableDef]:
    return [table_def(t) for t in TABLES]


def version_tuple(version: str | bytes) -> tuple[int, ...]:
    """'1.10' -> (1, 10): schema versions compare as numbers, not text."""
    v = version.decode() if isinstance(version, bytes) else version
    return tuple(int(p) for p in v.split("."))


def added_since(name: str, file_version: str | bytes) -> list[Column]:
    """Columns of ``name`` added after ``file_version`` (a file written then lacks them)."""
    fv = version_tuple(file_version)
    return [c for c in table_def(name).columns if version_tuple(c.since) > fv]


def check_schema_version(version: str | bytes | None, where: str) -> None:
    """Refuse data whose schema major version differs from the one this code reads."""
    if version is None:
        raise SchemaVersionError(f"{where}: no trajlake schema version recorded; not a trajlake data file")
    v = version.decode() if isinstance(version, bytes) else version
    try:
        major = int(v.split(".")[0])
    except ValueError as e:
        raise SchemaVersionError(f"{where}: malformed schema version {v!r}") from e
    if major != SCHEMA_MAJOR:
        raise SchemaVersionError(
            f"{where}: written with schema major version {major}, this trajlake reads version {SCHEMA_MAJOR}; "
            f"upgrade trajlake (or migrate the lake) to read it"
        )


def schema_markdown() -> str:
    """docs/schema.md, generated from the JSON definitions."""
    out = [
        "# trajlake schema v" + SCHEMA_VERSION,
        "",
        "Generated from `schemas/*.json` by `trajlake schema --format markdown`; do not edit by hand.",
        "",
    ]
    for td in all_table_defs():
        out += [f"## `{td.name}`", "", td.description, ""]
        out.append(f"Primary key: `{', '.join(td.primary_key)}`. Partitioned by: `{', '.join(td.partition_by) or '-'}`.")
        out += ["", "| column | type | nullable | allowed values | description |", "| --- | --- | --- | --- | --- |"]
        for c in td.columns:
            enum = ", ".join(c.enum) if c.enum else ""
            out.append(
                f"| `{c.name}` | `{c.type_str()}` | {'yes' if c.nullable else 'no'} | {enum} | {c.description} |"
            )
        out.append("")
    return "\n".join(out)
