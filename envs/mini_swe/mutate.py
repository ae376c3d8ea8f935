"""Seeded AST mutators that inject small, realistic bugs into a library's source.

A mutation is deterministic given ``(library, mutator, seed)``: the candidate sites of the mutator are
enumerated with :mod:`ast` in a fixed order, shuffled by a ``random.Random`` seeded from a hash of the
triple, and the first site whose edit is valid wins.

The mutated text is produced by splicing the original source rather than by unparsing the whole file:
only the operator token, constant or name changes where possible; otherwise the changed node is replaced
by its ``ast.unparse`` (parenthesised if precedence requires it), and statements are deleted line by line.
The rest of the file keeps its formatting and comments, so the unified diff shows only the mutation, and
materialising a task never depends on the Python version's ``ast.unparse`` output. Every edit is verified:
the spliced text must parse to exactly the AST obtained by applying the same change to the tree
(otherwise the next alternative, then the next site, is tried). The fix patch is the reverse diff.

Sites are only taken from function and method bodies (and default values); code inside ``while`` loops
and f-strings, docstrings, annotations and decorators are never touched.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .library import Library, parse_python
from .patching import make_diff, reverse_diff

__all__ = [
    "MUTATORS",
    "Mutation",
    "SourceMutation",
    "count_sites",
    "mutate_library",
    "mutate_source",
    "seeded_rng",
]


# --------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class SourceMutation:
    """A verified mutation of one source text."""

    source: str
    function: str
    line: int
    detail: str
    description: str


@dataclass(frozen=True)
class Mutation:
    """A verified mutation of one library file, with the diff that injects it and the fix that undoes it."""

    library: str
    mutator: str
    seed: int
    file: str
    function: str
    line: int
    detail: str
    description: str
    diff: str
    fix_diff: str

    @property
    def diff_hash(self) -> str:
        """sha256 of the mutation diff."""
        return hashlib.sha256(self.diff.encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------ source positions
class _Source:
    """Byte offsets of AST positions (``col_offset`` counts UTF-8 bytes)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8")
        self.line_starts = [0]
        for index, byte in enumerate(self.data):
            if byte == 0x0A:
                self.line_starts.append(index + 1)

    def offset(self, lineno: int, col: int) -> int:
        return self.line_starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        end_lineno = getattr(node, "end_lineno", None)
        end_col = getattr(node, "end_col_offset", None)
        if end_lineno is None or end_col is None:
            raise ValueError("node without end position")
        return self.offset(node.lineno, node.col_offset), self.offset(end_lineno, end_col)  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode("utf-8")

    def line(self, lineno: int) -> bytes:
        end = self.line_starts[lineno] if lineno < len(self.line_starts) else len(self.data)
        return self.data[self.line_starts[lineno - 1] : end]

    def lines_span(self, first: int, last: int) -> tuple[int, int]:
        end = self.line_starts[last] if last < len(self.line_starts) else len(self.data)
        return self.line_starts[first - 1], end

    def owns_lines(self, node: ast.stmt, last_node: ast.AST | None = None) -> bool:
        """True when ``node`` (up to ``last_node``'s end) alone occupies its lines (comments allowed after)."""
        tail = last_node or node
        before = self.line(node.lineno)[: node.col_offset]
        end_lineno = getattr(tail, "end_lineno", None)
        end_col = getattr(tail, "end_col_offset", None)
        if end_lineno is None or end_col is None:
            return False
        after = self.line(end_lineno)[end_col:].strip()
        return not before.strip() and (not after or after.startswith(b"#"))


# ------------------------------------------------------------------------------------- site collection
@dataclass
class _Located:
    node: ast.AST
    parent: ast.AST
    field: str
    index: int | None  # position in a list field, None for a plain field
    function: str  # qualified name of the enclosing top-level function or method
    func_node: ast.FunctionDef | ast.AsyncFunctionDef

    def replace(self, new: ast.AST) -> None:
        if self.index is None:
            setattr(self.parent, self.field, new)
        else:
            getattr(self.parent, self.field)[self.index] = new


def _iter_children(node: ast.AST) -> Iterator[tuple[str, int | None, ast.AST]]:
    for name, value in ast.iter_fields(node):
        if isinstance(value, ast.AST):
            yield name, None, value
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, ast.AST):
                    yield name, index, item


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(
        stmt.value.value, str
    )


def _collect(tree: ast.Module) -> list[_Located]:
    """Every mutable node inside function bodies (and defaults), in a deterministic pre-order."""
    out: list[_Located] = []

    def walk(node: ast.AST, function: str, func: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for name, index, child in _iter_children(node):
            if isinstance(child, ast.While | ast.JoinedStr):
                continue
            if name in ("annotation", "returns", "decorator_list", "type_comment"):
                continue
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                _function(child, function, func)
                continue
            if isinstance(child, ast.ClassDef):
                continue
            if isinstance(child, ast.stmt) and index == 0 and name == "body" and _is_docstring(child):
                continue
            out.append(_Located(child, node, name, index, function, func))
            walk(child, function, func)

    def _function(
        node: ast.FunctionDef | ast.AsyncFunctionDef,
        outer: str | None,
        outer_func: ast.FunctionDef | ast.AsyncFunctionDef | None,
        prefix: str = "",
    ) -> None:
        function = outer if outer is not None else prefix + node.name
        func = outer_func if outer_func is not None else node
        for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
            if isinstance(default, ast.JoinedStr):
                continue
            field_name = "defaults" if default in node.args.defaults else "kw_defaults"
            out.append(_Located(default, node.args, field_name, _index_of(node.args, field_name, default),
                                function, func))
            walk(default, function, func)
        body = node.body[1:] if node.body and _is_docstring(node.body[0]) else node.body
        offset = len(node.body) - len(body)
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.While):
                continue
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                _function(stmt, function, func)
                continue
            if isinstance(stmt, ast.ClassDef):
                continue
            out.append(_Located(stmt, node, "body", i + offset, function, func))
            walk(stmt, function, func)

    for top in tree.body:
        if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef):
            _function(top, None, None)
        elif isinstance(top, ast.ClassDef):
            for item in top.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    _function(item, None, None, prefix=f"{top.name}.")
    return out


def _index_of(parent: ast.AST, field_name: str, node: ast.AST) -> int:
    items = getattr(parent, field_name)
    for index, item in enumerate(items):
        if item is node:
            return index
    raise ValueError("node not found in parent")


# ------------------------------------------------------------------------------------------ the edits
_Splice = tuple[int, int, str]  # (start byte, end byte, replacement text)


@dataclass
class _Edit:
    """A change already applied to the tree, with alternative text splices tried in order."""

    options: list[list[_Splice]]
    detail: str
    description: str


@dataclass
class _Candidate:
    located: _Located
    make: Callable[[random.Random], _Edit | None] = field(repr=False)


_OP_TEXT: dict[type, str] = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.And: "and", ast.Or: "or",
}
_COMPARE_FLIPS: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
_BOUNDARY = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_ARITH_FLIPS: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
}
_NO_SWAP_CALLS = frozenset({
    "isinstance", "issubclass", "print", "min", "max", "hasattr", "getattr", "setattr", "super", "type",
})


def _text(op: ast.AST) -> str:
    return _OP_TEXT.get(type(op), type(op).__name__)


def _unparse_options(src: _Source, node: ast.AST, paren: bool = True) -> list[list[_Splice]]:
    """Replace ``node``'s text by the unparse of its (already mutated) self, optionally parenthesised."""
    start, end = src.span(node)
    text = ast.unparse(node)
    return [[(start, end, text)], *([[(start, end, f"({text})")]] if paren else [])]


def _op_splice(src: _Source, left: ast.AST, right: ast.AST, old: str, new: str) -> _Splice | None:
    """Replace only the operator token ``old`` between ``left`` and ``right`` (keeps the formatting)."""
    start = src.span(left)[1]
    end = src.span(right)[0]
    if end < start:
        return None
    between = src.data[start:end].decode("utf-8")
    if re.sub(r"[\s()\\]", "", between) != old.replace(" ", ""):
        return None
    pattern = r"\s+".join(re.escape(word) for word in old.split())
    match = re.search(pattern, between)
    if match is None:
        return None
    return start, end, between[: match.start()] + new + between[match.end() :]


def _prefix_removal(src: _Source, node: ast.AST, operand: ast.AST, prefix: str) -> list[list[_Splice]]:
    """Options that drop a unary prefix (``not``/``-``): the token alone, else the operand's text."""
    start, end = src.span(node)
    inner_start, inner_end = src.span(operand)
    head = src.data[start:inner_start].decode("utf-8")
    options: list[list[_Splice]] = []
    match = re.match(re.escape(prefix) + r"\s*", head)
    if match is not None:
        options.append([(start, start + len(match.group(0).encode("utf-8")), "")])
    text = src.data[inner_start:inner_end].decode("utf-8")
    options += [[(start, end, text)], [(start, end, f"({text})")]]
    return options


def _stringy(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str | bytes)
    return isinstance(node, ast.JoinedStr | ast.List | ast.ListComp | ast.Tuple)


def _flip_comparison(items: list[_Located], src: _Source) -> list[_Candidate]:
    out: list[_Candidate] = []
    for loc in items:
        node = loc.node
        if not isinstance(node, ast.Compare):
            continue
        for position, op in enumerate(node.ops):
            if type(op) not in _COMPARE_FLIPS:
                continue

            def make(rng: random.Random, node: ast.Compare = node, position: int = position) -> _Edit:
                old = node.ops[position]
                new = _COMPARE_FLIPS[type(old)]()
                left = node.left if position == 0 else node.comparators[position - 1]
                token = _op_splice(src, left, node.comparators[position], _text(old), _text(new))
                node.ops[position] = new
                detail = "boundary" if isinstance(old, _BOUNDARY) else "inverted"
                options = ([[token]] if token else []) + _unparse_options(src, node)
                return _Edit(options, detail, f"`{_text(old)}` -> `{_text(new)}`")

            out.append(_Candidate(loc, make))
    return out


def _flip_arithmetic(items: list[_Located], src: _Source) -> list[_Candidate]:
    out: list[_Candidate] = []
    for loc in items:
        node = loc.node
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_FLIPS:
            if _stringy(node.left) or _stringy(node.right):
                continue

            def make_bin(rng: random.Random, node: ast.BinOp = node) -> _Edit:
                old = node.op
                node.op = _ARITH_FLIPS[type(old)]()
                token = _op_splice(src, node.left, node.right, _text(old), _text(node.op))
                options = ([[token]] if token else []) + _unparse_options(src, node)
                return _Edit(options, "arithmetic", f"`{_text(old)}` -> `{_text(node.op)}`")

            out.append(_Candidate(loc, make_bin))
        elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITH_FLIPS:
            if _stringy(node.value):
                continue

            def make_aug(rng: random.Random, node: ast.AugAssign = node) -> _Edit:
                old = node.op
                node.op = _ARITH_FLIPS[type(old)]()
                token = _op_splice(src, node.target, node.value, _text(old) + "=", _text(node.op) + "=")
                options = ([[token]] if token else []) + _unparse_options(src, node, paren=False)
                return _Edit(options, "arithmetic", f"`{_text(old)}=` -> `{_text(node.op)}=`")

            out.append(_Candidate(loc, make_aug))
        elif (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and not isinstance(node.operand, ast.Constant)
        ):

            def make_neg(rng: random.Random, loc: _Located = loc, node: ast.UnaryOp = node) -> _Edit:
                options = _prefix_removal(src, node, node.operand, "-")
                loc.replace(node.operand)
                return _Edit(options, "sign", "dropped unary minus")

            out.append(_Candidate(loc, make_neg))
    return out


def _flip_boolean(items: list[_Located], src: _Source) -> list[_Candidate]:
    out: list[_Candidate] = []
    for loc in items:
        node = loc.node
        if isinstance(node, ast.BoolOp):

            def make_bool(rng: random.Random, node: ast.BoolOp = node) -> _Edit:
                old = node.op
                node.op = ast.Or() if isinstance(old, ast.And) else ast.And()
                tokens = [
                    _op_splice(src, a, b, _text(old), _text(node.op))
                    for a, b in zip(node.values, node.values[1:], strict=False)
                ]
                minimal = [t for t in tokens if t is not None]
                options = ([minimal] if len(minimal) == len(tokens) else []) + _unparse_options(src, node)
                return _Edit(options, "logic", f"`{_text(old)}` -> `{_text(node.op)}`")

            out.append(_Candidate(loc, make_bool))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):

            def make_not(rng: random.Random, loc: _Located = loc, node: ast.UnaryOp = node) -> _Edit:
                options = _prefix_removal(src, node, node.operand, "not")
                loc.replace(node.operand)
                return _Edit(options, "logic", "dropped `not`")

            out.append(_Candidate(loc, make_not))
    return out


def _shift_constant(items: list[_Located], src: _Source) -> list[_Candidate]:
    out: list[_Candidate] = []
    for loc in items:
        node = loc.node
        if not isinstance(node, ast.Constant) or not isinstance(node.value, int):
            continue

        def make(rng: random.Random, node: ast.Constant = node) -> _Edit | None:
            old = node.value
            if isinstance(old, bool):
                node.value = not old
                detail = "boolean"
            elif isinstance(old, int):
                node.value = old + rng.choice((1, -1))
                detail = "integer"
            else:
                return None
            start, end = src.span(node)
            return _Edit([[(start, end, repr(node.value))]], detail, f"`{old!r}` -> `{node.value!r}`")

        out.append(_Candidate(loc, make))
    return out


def _drop_guard(items: list[_Located], src: _Source) -> list[_Candidate]:
    out: list[_Candidate] = []
    for loc in items:
        node = loc.node
        if not isinstance(node, ast.If) or node.orelse or loc.index is None:
            continue
        if not isinstance(node.body[-1], ast.Return | ast.Raise | ast.Continue | ast.Break):
            continue
        siblings = getattr(loc.parent, loc.field)
        if len(siblings) < 2 or not src.owns_lines(node):
            continue

        def make(rng: random.Random, loc: _Located = loc, node: ast.If = node) -> _Edit:
            start, end = src.lines_span(node.lineno, node.end_lineno or node.lineno)
            header = src.line(node.lineno).decode("utf-8").strip()
            del getattr(loc.parent, loc.field)[loc.index or 0]
            return _Edit([[(start, end, "")]], "guard", f"removed guard `{header}`")

        out.append(_Candidate(loc, make))
    return out


def _drop_branch(items: list[_Located], src: _Source) -> list[_Candidate]:
    out: list[_Candidate] = []
    for loc in items:
        node = loc.node
        if not isinstance(node, ast.If) or len(node.orelse) != 1 or not isinstance(node.orelse[0], ast.If):
            continue
        branch = node.orelse[0]
        if not src.line(branch.lineno)[branch.col_offset :].startswith(b"elif"):
            continue
        if not src.owns_lines(branch, branch.body[-1]):
            continue

        def make(rng: random.Random, node: ast.If = node, branch: ast.If = branch) -> _Edit:
            last = branch.body[-1].end_lineno or branch.body[-1].lineno
            start, end = src.lines_span(branch.lineno, last)
            header = src.line(branch.lineno).decode("utf-8").strip()
            node.orelse = branch.orelse
            return _Edit([[(start, end, "")]], "branch", f"removed branch `{header}`")

        out.append(_Candidate(loc, make))
    return out


def _call_name(node: ast.Call) -> str:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return ""


def _swap_arguments(items: list[_Located], src: _Source) -> list[_Candidate]:
    out: list[_Candidate] = []
    for loc in items:
        node = loc.node
        if not isinstance(node, ast.Call) or len(node.args) < 2 or _call_name(node) in _NO_SWAP_CALLS:
            continue
        if any(isinstance(a, ast.Starred) for a in node.args):
            continue
        pairs = [i for i in range(len(node.args) - 1) if ast.dump(node.args[i]) != ast.dump(node.args[i + 1])]
        if not pairs:
            continue

        def make(rng: random.Random, node: ast.Call = node, pairs: list[int] = pairs) -> _Edit:
            i = rng.choice(pairs)
            first, second = node.args[i], node.args[i + 1]
            (s1, e1), (s2, e2) = src.span(first), src.span(second)
            t1, t2 = src.segment(first), src.segment(second)
            node.args[i], node.args[i + 1] = second, first
            name = _call_name(node) or "call"
            return _Edit([[(s1, e1, t2), (s2, e2, t1)]], "order",
                         f"swapped arguments {i + 1} and {i + 2} of `{name}(...)`")

        out.append(_Candidate(loc, make))
    return out


def _scope_walk(node: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function body without descending into nested scopes."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
                      | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            continue
        yield child
        yield from _scope_walk(child)


def _local_names(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, int]:
    """Parameters (line 0) and locally assigned names (first assignment line) of ``func``."""
    names: dict[str, int] = {}
    args = func.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None and arg.arg not in ("self", "cls"):
            names[arg.arg] = 0
    for node in _scope_walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id != "_":
            names.setdefault(node.id, node.lineno)
            names[node.id] = min(names[node.id], node.lineno)
    return names


def _wrong_variable(items: list[_Located], src: _Source) -> list[_Candidate]:
    out: list[_Candidate] = []
    cache: dict[int, dict[str, int]] = {}
    for loc in items:
        node = loc.node
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        if isinstance(loc.parent, ast.Call) and loc.field == "func":
            continue
        local = cache.setdefault(id(loc.func_node), _local_names(loc.func_node))
        if node.id not in local:
            continue
        options = sorted(n for n, line in local.items() if n != node.id and line < node.lineno)
        if not options:
            continue

        def make(rng: random.Random, node: ast.Name = node, options: list[str] = options) -> _Edit:
            old = node.id
            node.id = rng.choice(options)
            start, end = src.span(node)
            return _Edit([[(start, end, node.id)]], "variable", f"`{old}` -> `{node.id}`")

        out.append(_Candidate(loc, make))
    return out


@dataclass(frozen=True)
class MutatorSpec:
    """A mutator: its name, a one-line summary and the site enumerator."""

    name: str
    summary: str
    sites: Callable[[list[_Located], _Source], list[_Candidate]]


MUTATORS: dict[str, MutatorSpec] = {
    spec.name: spec
    for spec in (
        MutatorSpec("flip_comparison", "flip a comparison operator (< to <=, == to !=, in to not in)",
                    _flip_comparison),
        MutatorSpec("flip_arithmetic", "flip an arithmetic operator (+ to -, * to //) or drop a unary minus",
                    _flip_arithmetic),
        MutatorSpec("flip_boolean", "flip and/or or drop a `not`", _flip_boolean),
        MutatorSpec("shift_constant", "change an integer constant by one or flip a boolean constant",
                    _shift_constant),
        MutatorSpec("drop_guard", "remove an `if` guard that returns, raises, continues or breaks",
                    _drop_guard),
        MutatorSpec("drop_branch", "remove an `elif` branch", _drop_branch),
        MutatorSpec("swap_arguments", "swap two adjacent positional arguments of a call", _swap_arguments),
        MutatorSpec("wrong_variable", "use another local variable in place of the right one",
                    _wrong_variable),
    )
}


# ------------------------------------------------------------------------------------------ the driver
def _candidates(source: str, mutator: str) -> tuple[ast.Module, _Source, list[_Candidate]]:
    tree = parse_python(source)
    src = _Source(source)
    return tree, src, MUTATORS[mutator].sites(_collect(tree), src)


def count_sites(source: str, mutator: str) -> int:
    """Number of candidate sites of ``mutator`` in ``source`` (before validity checks)."""
    return len(_candidates(source, mutator)[2])


def _splice(data: bytes, splices: list[_Splice]) -> str:
    out = data
    for start, end, text in sorted(splices, key=lambda s: s[0], reverse=True):
        out = out[:start] + text.encode("utf-8") + out[end:]
    return out.decode("utf-8")


def mutate_source(source: str, mutator: str, rng: random.Random) -> SourceMutation | None:
    """Apply one verified ``mutator`` edit to ``source`` at a site chosen by ``rng`` (None: no valid site)."""
    if mutator not in MUTATORS:
        raise KeyError(f"unknown mutator {mutator!r}; known: {sorted(MUTATORS)}")
    order = list(range(count_sites(source, mutator)))
    rng.shuffle(order)
    for index in order:
        tree, src, candidates = _candidates(source, mutator)
        candidate = candidates[index]
        edit = candidate.make(rng)
        if edit is None:
            continue
        expected = ast.dump(tree)
        for splices in edit.options:
            text = _splice(src.data, splices)
            try:
                if ast.dump(parse_python(text)) != expected:
                    continue
            except SyntaxError:
                continue
            line = getattr(candidate.located.node, "lineno", 0)
            return SourceMutation(text, candidate.located.function, line, edit.detail, edit.description)
    return None


def seeded_rng(library: str, mutator: str, seed: int, purpose: str = "site") -> random.Random:
    """The random generator for one ``(library, mutator, seed)`` triple (and purpose)."""
    key = f"trajlake/mini-swe/{purpose}/{library}/{mutator}/{seed}".encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


def mutate_library(library: Library, mutator: str, seed: int) -> Mutation | None:
    """Mutate one of ``library``'s source files; None when the mutator has no valid site there."""
    rng = seeded_rng(library.name, mutator, seed)
    files = library.source_files()
    sites = [(path, i) for path in files for i in range(count_sites(library.read(path), mutator))]
    if not sites:
        return None
    order = list(range(len(sites)))
    rng.shuffle(order)
    tried: set[str] = set()
    for pick in order:
        path = sites[pick][0]
        if path in tried:
            continue
        tried.add(path)
        original = library.read(path)
        # each file's own site order is shuffled by a generator derived from the same seed
        result = mutate_source(original, mutator, copy.deepcopy(rng))
        if result is None:
            continue
        diff = make_diff(original, result.source, path)
        return Mutation(
            library=library.name,
            mutator=mutator,
            seed=seed,
            file=path,
            function=result.function,
            line=result.line,
            detail=result.detail,
            description=result.description,
            diff=diff,
            fix_diff=reverse_diff(diff),
        )
    return None
