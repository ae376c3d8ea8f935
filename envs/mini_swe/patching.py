"""Unified diffs: make them with difflib and apply them without external tools.

Only what Mini SWE needs: text files that end with a newline, ``--- a/PATH`` / ``+++ b/PATH`` headers,
and hunks that apply at their recorded line or within a small offset of it (the file may have been edited
elsewhere). Anything that does not match exactly raises :class:`PatchError`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from trajlake.errors import PatchError

__all__ = ["FilePatch", "PatchError", "apply_diff", "apply_patch", "make_diff", "minimal_edit", "parse_patch",
           "reverse_diff"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
MAX_OFFSET = 200


@dataclass
class Hunk:
    old_start: int
    new_start: int
    lines: list[str] = field(default_factory=list)  # each starts with " ", "-" or "+", ends with "\n"

    @property
    def old_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]

    @property
    def new_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " +"]


@dataclass
class FilePatch:
    """The hunks of one file of a unified diff."""

    old_path: str
    new_path: str
    hunks: list[Hunk]

    @property
    def path(self) -> str:
        """Path of the patched file relative to the tree root (``a/``/``b/`` prefixes removed)."""
        name = self.new_path if self.new_path != "/dev/null" else self.old_path
        return name[2:] if name.startswith(("a/", "b/")) else name


def replace_once(text: str, old: str, new: str) -> str | None:
    """``text`` with ``old`` replaced by ``new`` when ``old`` is not empty and occurs exactly once in it (the edit
    tool's rule, which the oracle's edits and its copy of the files follow too); None otherwise."""
    if not old or text.count(old) != 1:
        return None
    return text.replace(old, new, 1)


def minimal_edit(content: str, old: str, new: str) -> tuple[str, str]:
    """The shortest whole-line ``(old, new)`` pair that does in ``content`` what replacing ``old`` by ``new`` does.

    ``old`` and ``new`` are a hunk's old and new text (changed lines and their context). The lines both share at
    the start and at the end are dropped, then context lines are put back one at a time (before, after, before,
    ...) until the old text occurs exactly once in ``content`` (an edit tool's rule) and replacing it by the new
    text changes the file exactly as the whole hunk does. ``(old, new)`` unchanged when ``old`` does not occur
    exactly once in ``content``."""
    target = replace_once(content, old, new)
    if target is None:
        return old, new
    o, n = old.splitlines(keepends=True), new.splitlines(keepends=True)
    lo = 0
    while lo < min(len(o), len(n)) and o[lo] == n[lo]:
        lo += 1
    shared_tail = 0
    while shared_tail < min(len(o), len(n)) - lo and o[-1 - shared_tail] == n[-1 - shared_tail]:
        shared_tail += 1
    hi = len(o) - shared_tail  # old lines [lo, hi) become new lines [lo, len(n) - (len(o) - hi))
    before = True
    while True:
        candidate, replacement = "".join(o[lo:hi]), "".join(n[lo:len(n) - (len(o) - hi)])
        # the tool's rule (one non-overlapping occurrence) and the same result: a shorter text can occur once
        # without overlap yet start before its place in the hunk ("b\nb\n" in "b\nb\nb\n")
        if replace_once(content, candidate, replacement) == target:
            return candidate, replacement
        if (before and lo > 0) or hi == len(o):
            lo -= 1
        else:
            hi += 1
        before = not before


def make_diff(old: str, new: str, path: str, context: int = 3) -> str:
    """Return the unified diff turning ``old`` into ``new`` for the file ``path`` (empty when equal)."""
    if (old and not old.endswith("\n")) or (new and not new.endswith("\n")):
        raise PatchError("make_diff needs texts that end with a newline")
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
            n=context,
        )
    )


def parse_patch(diff: str) -> list[FilePatch]:
    """Split a (possibly multi-file) unified diff into per-file hunks."""
    patches: list[FilePatch] = []
    lines = diff.splitlines(keepends=True)
    index = 0
    current: FilePatch | None = None
    while index < len(lines):
        line = lines[index]
        if line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
            old_path = line[4:].rstrip("\n").split("\t")[0].strip()
            new_path = lines[index + 1][4:].rstrip("\n").split("\t")[0].strip()
            current = FilePatch(old_path, new_path, [])
            patches.append(current)
            index += 2
            continue
        match = _HUNK.match(line)
        if match:
            if current is None:
                raise PatchError("hunk before any file header")
            old_count = int(match.group(2)) if match.group(2) is not None else 1
            new_count = int(match.group(4)) if match.group(4) is not None else 1
            hunk = Hunk(int(match.group(1)), int(match.group(3)))
            index += 1
            seen_old = seen_new = 0
            while index < len(lines) and (seen_old < old_count or seen_new < new_count):
                body = lines[index]
                if body.startswith("\\"):
                    index += 1
                    continue
                if not body or body[0] not in " -+":
                    if body.strip() == "":
                        body = " \n"
                    else:
                        raise PatchError(f"malformed hunk line {body!r}")
                if not body.endswith("\n"):
                    body += "\n"
                hunk.lines.append(body)
                seen_old += body[0] in " -"
                seen_new += body[0] in " +"
                index += 1
            if seen_old != old_count or seen_new != new_count:
                raise PatchError("truncated hunk")
            current.hunks.append(hunk)
            continue
        index += 1
    return patches


def _find(lines: list[str], needle: list[str], start: int, lower_bound: int) -> int:
    """Position of ``needle`` in ``lines`` closest to ``start`` and not before ``lower_bound``; -1 if absent."""
    if not needle:
        return max(min(start, len(lines)), lower_bound)
    for offset in range(MAX_OFFSET + 1):
        for pos in (start - offset, start + offset) if offset else (start,):
            if pos >= lower_bound and lines[pos : pos + len(needle)] == needle:
                return pos
    return -1


def apply_diff(text: str, diff: str) -> str:
    """Apply a single-file unified diff to ``text`` and return the result."""
    patches = parse_patch(diff)
    if len(patches) != 1:
        raise PatchError(f"expected a diff of exactly one file, got {len(patches)}")
    return _apply_hunks(text, patches[0].hunks)


def _apply_hunks(text: str, hunks: list[Hunk]) -> str:
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0
    for hunk in hunks:
        old = hunk.old_lines
        start = max(hunk.old_start - 1, 0) if old else hunk.old_start
        pos = _find(lines, old, start, cursor)
        if pos < 0:
            raise PatchError(f"hunk at line {hunk.old_start} does not apply")
        out.extend(lines[cursor:pos])
        out.extend(hunk.new_lines)
        cursor = pos + len(old)
    out.extend(lines[cursor:])
    return "".join(out)


def reverse_diff(diff: str) -> str:
    """Return the diff that undoes ``diff`` (swap old/new sides)."""
    out: list[str] = []
    for patch in parse_patch(diff):
        out.append(f"--- {patch.new_path}\n".replace("--- b/", "--- a/", 1))
        out.append(f"+++ {patch.old_path}\n".replace("+++ a/", "+++ b/", 1))
        for hunk in patch.hunks:
            old_n = sum(1 for line in hunk.lines if line[0] in " -")
            new_n = sum(1 for line in hunk.lines if line[0] in " +")
            out.append(f"@@ -{hunk.new_start},{new_n} +{hunk.old_start},{old_n} @@\n")
            removed: list[str] = []
            added: list[str] = []
            for line in [*hunk.lines, " "]:
                if line[0] == "+":
                    removed.append("-" + line[1:])
                elif line[0] == "-":
                    added.append("+" + line[1:])
                else:
                    out.extend(removed + added)
                    removed, added = [], []
                    if len(line) > 1:
                        out.append(line)
    return "".join(out)


def apply_patch(root: str | Path, diff: str) -> list[str]:
    """Apply a (multi-file) unified diff to the tree at ``root``; return the patched paths.

    Every file is patched in memory first, so a failing hunk leaves the tree untouched.
    """
    base = Path(root).resolve()
    results: dict[Path, str] = {}
    for patch in parse_patch(diff):
        target = (base / patch.path).resolve()
        if base not in target.parents:
            raise PatchError(f"patch path {patch.path!r} escapes the workspace")
        if patch.new_path == "/dev/null":
            raise PatchError("file deletions are not supported")
        current = "" if patch.old_path == "/dev/null" else target.read_text(encoding="utf-8")
        results[target] = _apply_hunks(results.get(target, current), patch.hunks)
    for target, content in results.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    return [str(t.relative_to(base)) for t in results]
