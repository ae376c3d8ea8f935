"""``--policy single-turn:SPEC`` (baseline B0): one model answer, no tools.

The model sees the task statement and the files it names, and answers with one unified diff; the diff's hunks are
then applied with the environment's ``edit`` tool and the episode submits, so the grader judges the patched
workspace. Mini SWE gives file contents only through its tools, so the wrapper first reads the named files with
mechanical ``read_file`` turns. Those turns and the edits after the answer are not the model's: they carry no
token ids and no loss. The model's one turn records its prompt (on the observation turn just before it) and its
sampled tokens; its ``context_strategy`` is ``single_turn`` and ``context_dropped_hash`` names the earlier turns,
which are not in its context.

In an environment without ``edit`` whose tools include a finishing call with one text argument (Mini Web's
``answer``, tool-lookup's ``submit``), B0 is the same single answer without tools: the model sees the statement
only, and its reply (the first line, stripped) becomes that call's argument, the episode's one action.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from trajlake.envs.policy import Policy, PolicyOutput, TaskView
from trajlake.policies.lm import LMPolicy, dropped_hash

B0_SYSTEM = ("You fix bugs. Answer with one unified diff (--- a/PATH, +++ b/PATH, @@ hunks) inside a ```diff "
             "block, and nothing else.")
B0_ANSWER_SYSTEM = "Answer the task with the answer only, on one line, and nothing else."
# Finishing calls that take the answer as their one text argument, in order of preference.
_ANSWER_TOOLS = ("answer", "submit")
_FILE = re.compile(r"`([^`\s]+\.py)`")
_LINE = re.compile(r"^\s*\d+\| ?(.*)$")
_FENCE = re.compile(r"```(?:diff|patch)?\n(.*?)```", re.DOTALL)


def _act(tool: str, **args: Any) -> str:
    return json.dumps({"tool": tool, "args": args}, sort_keys=True)


def extract_diff(text: str) -> str:
    """The diff of a model answer: the first fenced block, else everything from the first ``--- `` line."""
    m = _FENCE.search(text)
    if m is not None:
        return m.group(1)
    i = text.find("--- ")
    return text[i:] if i >= 0 else ""


def diff_to_edits(diff: str) -> list[str]:
    """``edit`` actions applying a unified diff hunk by hunk; [] when nothing parses."""
    from trajlake.envs.mini_swe.patching import PatchError, parse_patch

    try:
        patches = parse_patch(diff if diff.endswith("\n") else diff + "\n")
    except (PatchError, ValueError, IndexError):
        return []
    return [_act("edit", path=fp.path, old="".join(h.old_lines), new="".join(h.new_lines))
            for fp in patches for h in fp.hunks if h.old_lines]


def answer_call(tools: Mapping[str, Mapping[str, Any]]) -> tuple[str, str] | None:
    """(tool, argument) of the finishing call that takes an answer as its one argument, if the tools have one."""
    for name in _ANSWER_TOOLS:
        args = (tools.get(name) or {}).get("args") or {}
        if len(args) == 1:
            return name, next(iter(args))
    return None


class SingleTurnPolicy(Policy):
    """Wraps an LM policy: reads the named files, asks once, applies the answer, submits."""

    name = "single-turn"

    def __init__(self, inner: LMPolicy, n_files: int = 4):
        super().__init__(inner.policy_version)
        self.inner = inner
        self.n_files = n_files

    def reset(self, task: TaskView, seed: int) -> None:
        self.inner.attempt = self.attempt
        self.inner.reset(task, seed)
        self.inner.policy_version = self.policy_version
        self.task = task
        self.answer_call = None if "edit" in task.tools else answer_call(task.tools)
        # an answer-mode B0 sees the statement only: nothing to read
        self.to_read = [] if self.answer_call is not None else \
            list(dict.fromkeys(_FILE.findall(task.statement)))[:self.n_files]
        self.files: dict[str, str] = {}
        self.reading: str | None = None
        self.after: list[str] | None = None
        self.history: list[tuple[int, str]] = []

    def _mechanical(self, action: str) -> PolicyOutput:
        self.history.append((len(self.history), action))
        return PolicyOutput(action=action, policy_version=self.policy_version)

    def act(self, observation: str) -> PolicyOutput:
        self.history.append((len(self.history), observation))
        if self.reading is not None:
            self.files[self.reading] = "\n".join(m.group(1) if (m := _LINE.match(ln)) else ln
                                                 for ln in observation.splitlines()) + "\n"
            self.reading = None
        if self.to_read:
            self.reading = self.to_read.pop(0)
            return self._mechanical(_act("read_file", path=self.reading))
        if self.after is not None:
            return self._mechanical(self.after.pop(0) if self.after else _act("submit"))
        return self._answer()

    def _answer(self) -> PolicyOutput:
        inner = self.inner
        assert inner.renderer is not None, "single-turn needs an LM policy that renders its own context"
        if self.answer_call is not None:
            ids = inner.renderer.initial(B0_ANSWER_SYSTEM, self.task.statement)
        else:
            prompt = self.task.statement + "".join(f"\n\n--- {p}\n{text}" for p, text in self.files.items())
            ids = inner.renderer.initial(B0_SYSTEM, prompt)
        gen = inner.generate(ids, inner.settings.max_new_tokens)
        assert gen.token_ids is not None
        if self.answer_call is not None:
            tool, arg = self.answer_call
            text = next((ln.strip() for ln in gen.text.splitlines() if ln.strip()), "")
            first, self.after, parsed = _act(tool, **{arg: text}), [], bool(text)
        else:
            edits = diff_to_edits(extract_diff(gen.text))
            first, self.after = (edits[0], edits[1:]) if edits else (_act("submit"), [])
            parsed = bool(edits)
        dropped = dropped_hash(self.history[:-1]) if len(self.history) > 1 else None
        self.history.append((len(self.history), first))
        out = np.asarray(gen.token_ids, dtype=np.int32)
        return PolicyOutput(
            action=first, policy_version=self.policy_version, token_ids=out,
            loss_mask=np.ones(out.shape[0], dtype=np.int8),
            behavior_logprobs=None if gen.logprobs is None else np.asarray(gen.logprobs, dtype=np.float32),
            tokenizer_id=inner.renderer.tokenizer_id, prompt_tokens=gen.prompt_tokens,
            context_token_ids=np.asarray(ids, dtype=np.int32), context_tokenizer_id=inner.renderer.tokenizer_id,
            status=inner.status_of(parsed, gen.retries), context_dropped_hash=dropped,
            context_strategy="single_turn")


__all__ = ["B0_ANSWER_SYSTEM", "B0_SYSTEM", "SingleTurnPolicy", "answer_call", "diff_to_edits", "extract_diff"]
