"""Tiny trainer configs for the tests: built as data and written as TOML by one writer, instead of a hand-written
template in each test file (tests/test_train_loop.py, tests/test_s3_quickstart_train.py, tests/test_train_config.py)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Two quick Mini SWE train tasks.
TWO_TASKS = ("mini-swe/durations/drop_guard/0", "mini-swe/rangeset/drop_guard/0")


def rollout(tasks: Sequence[str], *, max_new_tokens: int | None = None, max_steps: int | None = None,
            **keys: Any) -> dict[str, Any]:
    """A rollout table (``[stages.rollout]``, ``.data``, ``.eval``) on the train split, seed 0: ``max_new_tokens``
    goes into ``policy_args`` (with any given ``policy_args``), ``max_steps`` is the environment's step budget."""
    table: dict[str, Any] = {"split": "train", "seeds": "0", "tasks": list(tasks), **keys}
    if max_new_tokens is not None:
        table["policy_args"] = {"max_new_tokens": str(max_new_tokens), **keys.get("policy_args", {})}
    if max_steps is not None:
        table["env_args"] = {"budget": {"max_steps": max_steps}}
    return table


def tiny_config(name: str, stages: Sequence[Mapping[str, Any]], *, model: str | Path | None = None,
                out: str | Path | None = None, **top: Any) -> dict[str, Any]:
    """A config on the CPU: ``model`` is a model folder (None: ``build_tiny``), ``out`` the out_dir, ``top`` more
    top-level keys."""
    return {"name": name, "device": "cpu", **({"out_dir": str(out)} if out is not None else {}), **top,
            "model": {"path": str(model)} if model is not None else {"build_tiny": True},
            "stages": [dict(s) for s in stages]}


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write ``config`` as TOML to ``path`` (checked: it reads back as ``config``) and return ``path``."""
    lines: list[str] = []
    _table(lines, [], config)
    text = "\n".join(lines) + "\n"
    assert tomllib.loads(text) == json.loads(json.dumps(config, default=str)), text
    path.write_text(text, encoding="utf-8")
    return path


def _table(lines: list[str], at: list[str], table: Mapping[str, Any]) -> None:
    """A table's keys, then its subtables (``[a.b]``) and arrays of tables (``[[a.b]]``)."""
    def is_table(v: Any) -> bool:
        return isinstance(v, Mapping)

    def is_tables(v: Any) -> bool:
        return isinstance(v, list | tuple) and bool(v) and all(isinstance(x, Mapping) for x in v)

    lines += [f"{k} = {_value(v)}" for k, v in table.items() if not is_table(v) and not is_tables(v)]
    for k, v in table.items():
        if is_table(v):
            lines.append(f"[{'.'.join([*at, k])}]")
            _table(lines, [*at, k], v)
        elif is_tables(v):
            for item in v:
                lines.append(f"[[{'.'.join([*at, k])}]]")
                _table(lines, [*at, k], item)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a TOML basic string: JSON's escapes are TOML's
