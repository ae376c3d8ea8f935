"""The evaluation SQL files (``evaluators/*.sql``): loading and parameter substitution.

Each file is one documented DuckDB query over the views of :func:`trajlake.connect`. Parameters are written
``{{name}}`` in the file and substituted textually with SQL literals (strings quoted, quotes doubled), because
DuckDB prunes the ``run_id`` partitions of ``delta_scan`` only for constant filters; nothing else is ever
formatted into the text.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Iterable, Mapping

from trajlake.errors import TrajlakeError
from trajlake.query import sql_literal

__all__ = ["load", "quote", "quote_list", "render"]

_PARAM = re.compile(r"\{\{\s*([a-z_][a-z0-9_]*)\s*\}\}")


@functools.cache
def load(name: str) -> str:
    """Text of ``evaluators/<name>.sql`` (installed as package data of ``trajlake.evaluators``)."""
    res = importlib.resources.files("trajlake.evaluators").joinpath(f"{name}.sql")
    try:
        return res.read_text(encoding="utf-8")
    except FileNotFoundError as e:  # pragma: no cover - packaging error
        raise TrajlakeError(f"evaluation query {name}.sql is missing from the installation") from e


def quote(value: str) -> str:
    """A SQL string literal."""
    return sql_literal(value)


def quote_list(values: Iterable[str]) -> str:
    """A parenthesised list of SQL string literals, ``(NULL)`` when empty (matches nothing)."""
    items = [quote(v) for v in values]
    return "(" + (", ".join(items) if items else "NULL") + ")"


def render(name: str, params: Mapping[str, str]) -> str:
    """The query ``name`` with every ``{{param}}`` replaced by ``params[param]`` (already SQL literals)."""
    text = load(name)

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in params:
            raise TrajlakeError(f"{name}.sql needs parameter {key!r}")
        return params[key]

    return _PARAM.sub(sub, text)
