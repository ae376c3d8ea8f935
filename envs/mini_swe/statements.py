"""Problem statements for Mini SWE tasks, written from templates.

A statement names the misbehaving function (or, for a private helper, a public function that uses it),
quotes its documented contract and describes the symptom in words chosen by the mutator kind. It may add
which exception type shows up. It never contains test names, test code or the patch.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .library import parse_python

__all__ = ["TargetInfo", "describe_target", "exception_hints", "make_statement"]

_DUNDER_PHRASES: dict[str, str] = {
    "__init__": "Creating a `{cls}`",
    "__post_init__": "Creating a `{cls}`",
    "__eq__": "Equality comparison of `{cls}` objects",
    "__lt__": "The `<` comparison of `{cls}` objects",
    "__le__": "The `<=` comparison of `{cls}` objects",
    "__gt__": "The `>` comparison of `{cls}` objects",
    "__ge__": "The `>=` comparison of `{cls}` objects",
    "__add__": "Addition of `{cls}` objects",
    "__radd__": "Adding a `{cls}` to a plain number",
    "__sub__": "Subtraction of `{cls}` objects",
    "__rsub__": "Subtracting a `{cls}` from a plain number",
    "__mul__": "Multiplication of `{cls}` objects",
    "__rmul__": "Multiplying a plain number by a `{cls}`",
    "__truediv__": "Division of `{cls}` objects",
    "__rtruediv__": "Dividing a plain number by a `{cls}`",
    "__pow__": "Raising a `{cls}` to a power",
    "__neg__": "Negating a `{cls}`",
    "__abs__": "Taking `abs()` of a `{cls}`",
    "__float__": "Converting a `{cls}` to `float`",
    "__contains__": "The `in` operator on `{cls}`",
    "__len__": "Taking `len()` of a `{cls}`",
    "__iter__": "Iterating over a `{cls}`",
    "__bool__": "Truth testing of a `{cls}`",
    "__hash__": "Hashing a `{cls}`",
    "__repr__": "`repr()` of a `{cls}`",
    "__str__": "`str()` of a `{cls}`",
}

_SYMPTOMS: dict[str, list[str]] = {
    "boundary": [
        "gives the wrong answer for values that sit exactly on a boundary (equal to a limit or an endpoint), "
        "while values clearly inside or outside are handled correctly.",
        "treats edge cases inconsistently: when two compared values are equal, the result is as if one of "
        "them were strictly larger than the other.",
        "mishandles inputs that lie exactly at a limit; the boundary case ends up on the wrong side.",
    ],
    "inverted": [
        "behaves as if one of its checks were inverted: cases that should match are treated as not "
        "matching, and the other way round.",
        "takes the wrong path for some inputs, as though one of its conditions had the opposite meaning.",
    ],
    "arithmetic": [
        "computes wrong numeric results: the quantities it derives (sizes, offsets, totals or positions) "
        "do not add up.",
        "returns values that are numerically off, as if one arithmetic step combined its operands the wrong "
        "way.",
        "produces incorrect amounts for ordinary inputs; a calculation inside it is wrong.",
    ],
    "sign": [
        "gets a sign wrong: some results have the opposite sign or are mirrored around zero.",
        "produces results that are off in a way that looks like a missing negation.",
    ],
    "logic": [
        "evaluates a combined condition wrongly: it accepts inputs that should be rejected (or rejects "
        "valid ones) when only some of the conditions hold.",
        "gets a logical check wrong, so some inputs take the wrong branch.",
        "makes the wrong decision for some inputs, as if a condition were negated or its parts combined "
        "incorrectly.",
    ],
    "integer": [
        "is slightly off: results differ from the documented behaviour by a small amount (one element, "
        "character, unit or position too many or too few).",
        "has an off-by-one style problem; results are close to correct but not exact.",
        "uses a wrong numeric value somewhere, so some results are off by a little.",
    ],
    "boolean": [
        "behaves as if a flag or a default had the opposite value.",
        "uses the wrong boolean setting somewhere, so an option behaves the opposite way from what is "
        "documented.",
    ],
    "guard": [
        "no longer handles a special case: input that should be rejected or short-circuited now falls "
        "through to the general code path.",
        "is missing an edge-case check, so unusual input is processed as if it were ordinary (there is no "
        "early exit or error where one is expected).",
    ],
    "branch": [
        "no longer recognises one of the cases it is supposed to distinguish; that case is handled like a "
        "different one.",
        "lumps two different kinds of input together; one branch of its case analysis seems to be missing.",
    ],
    "order": [
        "mixes up the order of values somewhere: results come out with parts swapped or reversed.",
        "passes values in the wrong order internally, so results are wrong whenever the order matters.",
    ],
    "variable": [
        "uses the wrong value in a computation: the result looks as if a different variable (an input or "
        "an intermediate value) had been used.",
        "returns or uses a value that belongs to another variable, so results do not reflect the intended "
        "computation.",
    ],
}

_OPENINGS = [
    "Bug report for `{library}` (`{file}`):",
    "Something is wrong in `{library}` (`{file}`).",
    "We are seeing incorrect behaviour from `{library}` (`{file}`).",
    "Since a recent change to `{file}`, `{library}` misbehaves.",
]

_CLOSINGS = [
    "Please fix the library so that it behaves as documented, without changing its public API. The tests "
    "in `tests/` (run them with `python -m pytest -q`) describe part of the expected behaviour, but they do "
    "not necessarily reproduce this bug.",
    "Fix the bug in `{file}`; keep function names and signatures unchanged. Some of the existing tests "
    "(`python -m pytest -q`) exercise this module, but they may not catch the problem.",
    "Find and fix the cause. The public API must stay the same; you can run the visible tests with "
    "`python -m pytest -q`, though they may not cover this case.",
]


@dataclass(frozen=True)
class TargetInfo:
    """How a statement refers to the mutated function."""

    subject: str
    contract: str | None
    helper_note: str | None


def _summary(doc: str | None) -> str | None:
    """The first paragraph of a docstring, on one line."""
    if not doc:
        return None
    return " ".join(doc.strip().split("\n\n")[0].split()) or None


def _functions(tree: ast.Module) -> dict[str, tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.ClassDef | None]]:
    out: dict[str, tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.ClassDef | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = (node, None)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    out[f"{node.name}.{item.name}"] = (item, node)
    return out


def _is_private(short: str) -> bool:
    return short.startswith("_") and not (short.startswith("__") and short.endswith("__"))


def _references(func: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return names


def _public_callers(functions: dict[str, tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.ClassDef | None]],
                    qualname: str) -> list[str]:
    """Public functions that reach ``qualname`` through calls (breadth first, in source order)."""
    refs = {name: _references(node) for name, (node, _) in functions.items()}
    frontier = [qualname]
    seen = {qualname}
    public: list[str] = []
    for _ in range(4):
        nxt: list[str] = []
        for target in frontier:
            short = target.rsplit(".", 1)[-1]
            for name in functions:
                if name not in seen and short in refs[name]:
                    seen.add(name)
                    nxt.append(name)
                    if not _is_private(name.rsplit(".", 1)[-1]):
                        public.append(name)
        if public:
            break
        frontier = nxt
    plain = [p for p in public if not p.rsplit(".", 1)[-1].startswith("__")]
    return plain or public


def _subject(qualname: str) -> str:
    cls, _, short = qualname.rpartition(".")
    if cls and short in _DUNDER_PHRASES:
        return _DUNDER_PHRASES[short].format(cls=cls) + f" (`{qualname}`)"
    return f"`{qualname}`"


def describe_target(source: str, qualname: str) -> TargetInfo:
    """Subject phrase, documented contract and helper note for the function ``qualname`` in ``source``."""
    tree = parse_python(source)
    functions = _functions(tree)
    helper_note = None
    target = qualname
    if qualname in functions and _is_private(qualname.rsplit(".", 1)[-1]):
        callers = _public_callers(functions, qualname)
        if callers:
            target = callers[0]
            helper_note = f"The cause seems to be in internal code that `{target}` relies on."
    contract = None
    if target in functions:
        node, cls = functions[target]
        contract = _summary(ast.get_docstring(node))
        if contract is None and cls is not None:
            class_doc = _summary(ast.get_docstring(cls))
            if class_doc:
                contract = f"`{cls.name}`: {class_doc}"
    return TargetInfo(_subject(target), contract, helper_note)


def exception_hints(messages: Iterable[str]) -> tuple[list[str], list[str]]:
    """Exception names seen in failure messages: (raised unexpectedly, expected but not raised)."""
    raised: set[str] = set()
    missing: set[str] = set()
    for message in messages:
        not_raised = re.search(r"DID NOT RAISE <class '(?:[\w.]+\.)?(\w+)'>", message)
        if not_raised:
            missing.add(not_raised.group(1))
            continue
        match = re.match(r"(?:[\w.]+\.)?(\w+(?:Error|Exception)): ", message)
        if match and match.group(1) != "AssertionError":
            raised.add(match.group(1))
    return sorted(raised), sorted(missing)


def make_statement(
    *,
    library: str,
    file: str,
    target: TargetInfo,
    detail: str,
    raised: list[str],
    not_raised: list[str],
    rng: random.Random,
) -> str:
    """Render the problem statement of one task (``detail`` is the mutation's symptom class)."""
    opening = rng.choice(_OPENINGS).format(library=library, file=file)
    symptom = rng.choice(_SYMPTOMS[detail])
    parts = [f"{opening} {target.subject} {symptom}"]
    if target.contract:
        parts.append(f'The documentation says: "{target.contract}"')
    if raised:
        names = " or ".join(f"`{name}`" for name in raised[:2])
        parts.append(f"For some inputs it even raises {names} instead of returning a result.")
    if not_raised:
        names = " or ".join(f"`{name}`" for name in not_raised[:2])
        parts.append(f"In at least one case it no longer raises {names} where it should.")
    if target.helper_note:
        parts.append(target.helper_note)
    closing = rng.choice(_CLOSINGS).format(file=file)
    return " ".join(parts) + "\n\n" + closing
