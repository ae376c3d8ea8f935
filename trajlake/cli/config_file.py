"""``--config FILE``: a command's options from a table of a TOML file, below the command line.

Each option takes its value from the first of: the command line (or an environment variable the option reads),
the file, the option's default. Which one applies is click's parameter source, never a comparison with the
default, so an option given on the command line with its default value still beats the file. ``--lake`` has two
more sources above the file: ``--lake`` before the command and ``$TRAJLAKE_LAKE``.

A command describes its options with a dataclass whose fields are the command's parameter names (keys only a
file can give, such as rollout's ``policy_args`` table, are fields with a default). The field types say what
the file may give: a value of another type is refused naming the file and the key, then the option's own checks
(``min=``) apply as on the command line. A key is the option's name without its dashes, with ``-`` or ``_``
between words (``fault-rate`` or ``fault_rate``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import typer

from trajlake.cli.options import click_exceptions, lake_path
from trajlake.errors import TrajlakeError

__all__ = ["given", "options_from", "read_table"]

Options = TypeVar("Options")

_DEFAULT_SOURCES = frozenset({"DEFAULT", "DEFAULT_MAP"})


def given(ctx: typer.Context, name: str) -> bool:
    """Whether parameter ``name`` was given on the command line or by its environment variable (not left at its
    default)."""
    source = ctx.get_parameter_source(name)
    # By name: click and the copy of click that newer Typer versions carry each have their own enum.
    return source is not None and source.name not in _DEFAULT_SOURCES


def read_table(path: Path, table: str, *, top_level: bool) -> dict[str, Any]:
    """The ``[table]`` of the TOML file ``path``; with ``top_level``, the whole file when it has no such table."""
    import tomllib

    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TrajlakeError(f"--config {path}: {e}") from e
    section = data.get(table, data if top_level else {})
    if not isinstance(section, dict):
        raise TrajlakeError(f"--config {path}: {table} must be a table, not {_kind(section)}")
    return dict(section)


def options_from(ctx: typer.Context, options_type: type[Options], config: Path | None, *, table: str,
                 top_level: bool = True, ignored: Collection[str] = (), appended: Collection[str] = (),
                 command_line_only: Mapping[str, str] | None = None) -> tuple[Options, frozenset[str]]:
    """``options_type`` built from the command's parameters merged with the ``[table]`` of ``config``.

    ``top_level``: a file without that table gives its keys at the top level. ``ignored``: keys the file may
    hold for another command (any other unknown key is refused). ``appended``: repeatable ``KEY=VALUE`` options
    whose file entries come first and the command line's after, so the command line wins key by key.
    ``command_line_only``: options a file may not set, each with the reason the refusal gives (a shared config
    file must not switch off a safeguard).
    Returns the options and the names of those set explicitly (command line, environment or file)."""
    fields = {f.name for f in dataclasses.fields(typing.cast(Any, options_type))}
    params = {p.name: p for p in ctx.command.params if p.name in fields}
    values: dict[str, Any] = {name: ctx.params[name] for name in params}
    on_command_line = {name for name in params if given(ctx, name)}
    from_file = (_file_values(ctx, config, read_table(config, table, top_level=top_level), options_type, params,
                              ignored, command_line_only or {}) if config is not None else {})
    for name, value in from_file.items():
        if name in appended:
            values[name] = [*value, *(values.get(name) or [])]
        elif name not in on_command_line:
            values[name] = value
    if "lake" in fields:  # resolved here: --lake before the command and $TRAJLAKE_LAKE beat the file too
        own = values.get("lake") if "lake" in on_command_line else None
        values["lake"] = str(lake_path(ctx, own, fallback=from_file.get("lake")))
    return options_type(**values), frozenset(on_command_line | set(from_file))


def _file_values(ctx: typer.Context, path: Path, section: Mapping[str, Any], options_type: type[Any],
                 params: Mapping[str, Any], ignored: Collection[str],
                 command_line_only: Mapping[str, str]) -> dict[str, Any]:
    """The file's keys as option names, each value checked against the field's type and the option's checks."""
    hints = typing.get_type_hints(options_type)
    spellings: dict[str, str] = {}
    for name in hints:
        key = _option_key(params[name]) if name in params else name
        spellings[key] = spellings[key.replace("-", "_")] = name
    unknown = sorted(set(section) - set(spellings) - set(ignored))
    if unknown:
        keys = sorted({key.replace("-", "_") for key in spellings})
        raise TrajlakeError(f"--config {path}: unknown key(s) {', '.join(unknown)}; keys: {', '.join(keys)} "
                            f"(or with - for _)")
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for key, value in section.items():
        if key not in spellings:
            continue
        name = spellings[key]
        if name in command_line_only:
            raise TrajlakeError(f"--config {path}: {key} can only be given on the command line "
                                f"({command_line_only[name]})")
        if name in seen:
            raise TrajlakeError(f"--config {path}: {seen[name]} and {key} are the same option")
        seen[name] = key
        out[name] = _checked(ctx, value, hints[name], params.get(name), f"--config {path}: {key}")
    return out


def _option_key(param: Any) -> str:
    """The option's long name without its dashes: ``--fault-rate`` -> ``fault-rate``."""
    long = [o for o in param.opts if o.startswith("--")]
    return str((long or param.opts)[0]).lstrip("-")


def _checked(ctx: typer.Context, value: Any, hint: Any, param: Any, where: str) -> Any:
    kinds = _members(hint)
    for kind in kinds:
        ok, converted = _accept(value, kind)
        if ok:
            break
    else:
        expected = " or ".join(_describe(k) for k in kinds)
        raise TrajlakeError(f"{where}: expected {expected}, not {_kind(value)} {value!r}")
    if param is not None and isinstance(converted, int | float) and not isinstance(converted, bool):
        try:  # the option's own checks (min=, max=), as on the command line
            converted = param.process_value(ctx, converted)
        except click_exceptions() as e:
            raise TrajlakeError(f"{where}: {e.format_message()}") from e  # type: ignore[attr-defined]
    return converted


def _members(hint: Any) -> list[Any]:
    """The types of a hint without None: ``str | list[str] | None`` -> [str, list[str]]."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(hint) if a is not type(None)]
    return [hint]


def _accept(value: Any, kind: Any) -> tuple[bool, Any]:
    """(True, the value as ``kind``) when a TOML value may stand for ``kind``, else (False, None). Numbers and
    dates may stand for text (``seeds = 3``, ``data_cutoff = 2026-06-30``); nothing else is converted."""
    if kind is bool or isinstance(value, bool):  # true/false is neither a number nor text
        return (kind is bool and isinstance(value, bool)), value
    if kind is int:
        return isinstance(value, int), value
    if kind is float:
        return isinstance(value, int | float), float(value) if isinstance(value, int | float) else None
    if kind is str:
        if isinstance(value, str | int):
            return True, str(value)
        if isinstance(value, dt.date | dt.time):  # TOML dates and times (datetime is a date)
            return True, value.isoformat()
        return False, None
    if kind is Path:
        return isinstance(value, str), Path(value) if isinstance(value, str) else None
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return True, kind(value)
        except ValueError:
            return False, None
    if typing.get_origin(kind) is list and isinstance(value, list):
        (item,) = typing.get_args(kind)
        accepted = [_accept(v, item) for v in value]
        return all(ok for ok, _ in accepted), [v for _, v in accepted]
    if kind is dict or typing.get_origin(kind) is dict:
        return isinstance(value, dict), value
    return False, None


def _describe(kind: Any) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in kind)
    if typing.get_origin(kind) is list:
        item = typing.get_args(kind)[0]
        return "a list of " + {str: "strings", int: "integers", float: "numbers"}.get(item, _describe(item))
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path (string)"
            }.get(kind, "a table")


def _kind(value: Any) -> str:
    """What a TOML value is, in TOML's words."""
    for cls, word in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
                      (list, "an array"), (dict, "a table"), (dt.datetime, "a date-time"), (dt.date, "a date"),
                      (dt.time, "a time")):
        if isinstance(value, cls):
            return word
    return type(value).__name__
