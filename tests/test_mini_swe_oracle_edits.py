"""Mini SWE's oracle writes minimal-span edits (issue 24, "Mini SWE, honestly"): each ``edit`` carries the hunk's
changed lines and only as much context as makes its ``old`` unique in the file, so that a language-model policy
imitating the oracle writes calls its ``max_new_tokens`` can hold. ``minimal_edit`` is checked as a property (it
changes the file exactly as the whole hunk does); the oracle's edits on every shipped task in
tests/test_mini_swe_tasks.py::test_every_task_fails_mutated_and_resolves_with_oracle (which plays them all)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from trajlake.envs import make_env, make_policy, task_view_fn
from trajlake.envs.mini_swe.grading import load_tasks
from trajlake.envs.mini_swe.patching import minimal_edit, parse_patch

# a few distinct short lines, so that repeated lines (the case that needs context) are common
_LINE = st.sampled_from(["a\n", "b\n", "c\n", "return x\n", "    return x\n", "\n", "x = 1\n"])


@st.composite
def _file_and_hunk(draw: st.DrawFn) -> tuple[str, str, str]:
    """A file, and a hunk in it (old: some of its lines, with context; new: old with its middle replaced); its old
    text may occur more than once in the file (then no edit can be made shorter)."""
    lines = draw(st.lists(_LINE, min_size=1, max_size=30))
    start = draw(st.integers(0, len(lines) - 1))
    stop = draw(st.integers(start + 1, len(lines)))
    old_lines = lines[start:stop]
    cut_lo = draw(st.integers(0, len(old_lines)))
    cut_hi = draw(st.integers(cut_lo, len(old_lines)))
    middle = draw(st.lists(_LINE, max_size=4))
    new_lines = old_lines[:cut_lo] + middle + old_lines[cut_hi:]
    return "".join(lines), "".join(old_lines), "".join(new_lines)


@settings(max_examples=400, deadline=None)
@given(_file_and_hunk())
def test_minimal_edit_changes_the_file_as_the_whole_hunk_does(case: tuple[str, str, str]) -> None:
    content, old, new = case
    small_old, small_new = minimal_edit(content, old, new)
    if content.count(old) != 1:  # not an edit the tool would take: left as it is
        assert (small_old, small_new) == (old, new)
        return
    assert small_old and content.count(small_old) == 1  # the edit tool takes it
    assert small_old in old and small_new in new  # a part of the hunk, never more
    assert content.replace(small_old, small_new, 1) == content.replace(old, new, 1)
    assert len(small_old) <= len(old)


def test_minimal_edit_drops_unneeded_context_and_keeps_what_makes_old_unique() -> None:
    content = "def f():\n    return x\n\ndef g():\n    y = 2\n    return x\n"
    # the hunk of a diff with its context: `y = 2` becomes `y = 3`; the changed line is unique on its own
    old = "def g():\n    y = 2\n    return x\n"
    assert minimal_edit(content, old, old.replace("2", "3")) == ("    y = 2\n", "    y = 3\n")
    # `return x` occurs twice: the line before (`y = 2`) is put back to make it unique
    assert minimal_edit(content, old, "def g():\n    y = 2\n    return -x\n") == \
        ("    y = 2\n    return x\n", "    y = 2\n    return -x\n")
    # a pure insertion keeps one line of context as its anchor
    assert minimal_edit(content, old, "def g():\n    y = 2\n    z = 0\n    return x\n") == \
        ("    y = 2\n", "    y = 2\n    z = 0\n")


def test_oracle_falls_back_to_the_whole_hunk_without_a_whole_listing() -> None:
    """When what followed its read is not the file's whole numbered listing (an error, a truncated file), the
    oracle edits with the whole hunk, as it always did."""
    task = load_tasks()[0]
    env = make_env("mini-swe")
    try:
        oracle = make_policy("mini-swe", "oracle", "oracle-v1")
        oracle.reset(task_view_fn(env, oracle=True)(task["task_id"], task["task_version"]), 0)
        assert json.loads(oracle.act("the task").action)["tool"] == "read_file"
        edit = json.loads(oracle.act("    1| x = 1\n... (500 more lines)").action)
    finally:
        env.close()
    (fp,) = parse_patch(task["fix_diff"])
    assert edit["tool"] == "edit" and edit["args"]["old"] == "".join(fp.hunks[0].old_lines)


def test_replace_once_is_the_edit_tools_rule() -> None:
    """One rule for the edit tool, minimal_edit and the oracle's copy of the files: ``old`` non-empty and found
    exactly once, replaced once; anything else changes nothing (None)."""
    from trajlake.envs.mini_swe.patching import replace_once

    assert replace_once("a = 1\nb = 2\n", "b = 2", "b = 3") == "a = 1\nb = 3\n"
    assert replace_once("x\nx\n", "x", "y") is None
    assert replace_once("abc", "", "z") is None and replace_once("", "", "z") is None
    assert replace_once("abc", "d", "z") is None
