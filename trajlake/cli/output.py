"""Output formats of every CLI command that prints data: ``table`` (rich), ``json`` (an array with one object per
row) and ``csv`` (a header line, then rows). Nested values become JSON in CSV cells."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import enum
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


class Format(enum.StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def plain(v: Any) -> Any:
    """A JSON-compatible version of a value returned by DuckDB or pyarrow."""
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.UTC)
            return v.isoformat().replace("+00:00", "Z")
        return v.isoformat()
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        # DuckDB returns MAPs as {"key": [...], "value": [...]}
        if set(v) == {"key", "value"} and isinstance(v["key"], list):
            return {str(k): plain(x) for k, x in zip(v["key"], v["value"], strict=False)}
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    return v


def emit(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: Format, title: str | None = None) -> None:
    if fmt == Format.json:
        json.dump([{c: plain(v) for c, v in zip(columns, r, strict=True)} for r in rows], sys.stdout, indent=None)
        sys.stdout.write("\n")
    elif fmt == Format.csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([json.dumps(plain(v)) if isinstance(v, dict | list | tuple) else
                        ("" if v is None else plain(v)) for v in r])
    else:
        t = Table(title=title, show_lines=False)
        for c in columns:
            t.add_column(str(c), overflow="fold")
        for r in rows:
            t.add_row(*["" if v is None else escape(_short(plain(v))) for v in r])  # text, never markup
        Console(width=max(100, Console().width)).print(t)


def _short(v: Any, limit: int = 120) -> str:
    s = json.dumps(v) if isinstance(v, dict | list) else str(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def write_report(text: str, out: Path | None, what: str) -> None:
    """Print ``text``, or write it to ``out`` (its folder created) and say so on stderr; a file that cannot be
    written is one clear error line."""

    import typer

    from trajlake.errors import TrajlakeError

    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise TrajlakeError(f"cannot write {out}: {e.strerror or e}") from e
    typer.echo(f"wrote {what} to {out}", err=True)
