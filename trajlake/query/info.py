"""``trajlake info``: per table, the committed row count, Delta version, live files, bytes and schema version."""

from __future__ import annotations

from dataclasses import dataclass

from trajlake.lake.store import LakeArg, as_lake
from trajlake.query import connect
from trajlake.schema import SCHEMA_VERSION, TABLES


@dataclass(frozen=True)
class TableInfo:
    """One table of a lake at one version."""

    table: str
    rows: int
    """Committed rows (turns and gateway events count only once their episode row exists)."""
    version: int
    files: int
    bytes: int
    schema_version: str

    def as_row(self) -> list[object]:
        return [self.table, self.rows, self.version, self.files, self.bytes, self.schema_version]


COLUMNS = ["table", "rows", "version", "files", "bytes", "schema_version"]


def table_info(lake: LakeArg) -> list[TableInfo]:
    """Every table of the lake at its current version."""
    lk = as_lake(lake)
    versions = lk.versions()
    con = connect(lk, versions)
    out = []
    for name in TABLES:
        files = lk.files(name, versions[name])
        row = con.execute(f"SELECT count(*) FROM {name}").fetchone()
        out.append(TableInfo(name, int(row[0]) if row else 0, versions[name], len(files),
                             sum(f.size for f in files), SCHEMA_VERSION))
    return out


def pins(infos: list[TableInfo]) -> str:
    """The ``--as-of`` value that pins these versions."""
    return ",".join(f"{i.table}={i.version}" for i in infos)


__all__ = ["COLUMNS", "TableInfo", "pins", "table_info"]
