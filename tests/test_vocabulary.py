"""One vocabulary: the enums of ``schemas/vocab.py`` mirror the table definitions, and code outside it names
their members through the enums, never by restating a list of the names (or an error class as a literal)."""

from __future__ import annotations

import ast
import re
from enum import StrEnum
from pathlib import Path

from trajlake.schemas.vocab import ENUM_COLUMNS, ErrorClass, Status, TaxonomyClass

from trajlake.schema import table_def

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("trajlake", "envs", "evaluators", "schemas")
VOCAB_FILE = ROOT / "schemas" / "vocab.py"
ENUMS: list[type[StrEnum]] = [*ENUM_COLUMNS, TaxonomyClass]


def test_enums_mirror_the_table_definitions() -> None:
    for enum, (table, column) in ENUM_COLUMNS.items():
        assert [m.value for m in enum] == list(table_def(table).column(column).enum or ()), enum.__name__
    assert [m.value for m in Status] == ["OK", *(m.value for m in ErrorClass)]


def test_taxonomy_classes_are_the_ones_taxonomy_sql_assigns() -> None:
    sql = (ROOT / "evaluators" / "taxonomy.sql").read_text()
    assigned = set(re.findall(r"(?:THEN|ELSE)\s+'([a-z_]+)\|", sql))
    assert assigned == {m.value for m in TaxonomyClass}, assigned


def _code_files() -> list[Path]:
    out = []
    for d in CODE_DIRS:
        for p in (ROOT / d).rglob("*.py"):
            if p != VOCAB_FILE and "libraries" not in p.relative_to(ROOT).parts:
                out.append(p)
    return sorted(out)


def _str_items(node: ast.AST) -> list[str] | None:
    elts: list[ast.expr]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        elts = list(node.elts)
    elif isinstance(node, ast.Dict):
        elts = [k for k in node.keys if k is not None]
    else:
        return None
    values = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return values if len(values) >= 2 else None


def restated_vocabulary(source: str, where: str) -> list[str]:
    """Literal collections of two or more names of one enum, and error classes spelled as literals."""
    bad = []
    error_names = {m.value for m in ErrorClass}
    for node in ast.walk(ast.parse(source)):
        items = _str_items(node)
        if items:
            for enum in ENUMS:
                names = {m.value for m in enum}
                hits = [v for v in items if v in names]
                # a list is a restatement when it is made of the enum's names (2+ and no other strings)
                if len(hits) >= 2 and len(hits) == len(items):
                    bad.append(f"{where}:{node.lineno}: literal list of {enum.__name__} names {hits}")
                    break
        if isinstance(node, ast.Constant) and node.value in error_names:
            bad.append(f"{where}:{node.lineno}: error class {node.value!r} as a string literal "
                       f"(use ErrorClass.{node.value} or Status.{node.value})")
    return bad


def test_code_names_the_vocabulary_through_the_enums() -> None:
    bad = []
    for p in _code_files():
        bad += restated_vocabulary(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    assert not bad, "\n".join(bad)


def test_the_check_fails_on_a_restated_list() -> None:
    src = ('ERRORS = ("MODEL_INVALID_ACTION", "ENV_BUG")\n'
           'ROLES = ["assistant", "tool"]\n'
           'ok = ("assistant", "some other text")\n'
           'def f(s):\n    return s == "ENV_TRANSIENT"\n')
    bad = restated_vocabulary(src, "x.py")
    assert any("x.py:1" in b and "ErrorClass" in b for b in bad)
    assert any("x.py:2" in b and "Role" in b for b in bad)
    assert not any("x.py:3" in b for b in bad)
    assert any("x.py:5" in b and "'ENV_TRANSIENT'" in b for b in bad)
