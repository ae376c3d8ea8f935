"""Grammar-constrained decoding: masking cost per token against a model step, and parseable calls (issue 24).

    python bench/bench_grammar.py [--calls 30] [--max-chars 16] [--model DIR]

Samples ``--calls`` tool calls from the tiny random-init model (built by the script unless ``--model`` is given)
under Mini SWE's tool-call grammar (``--policy-arg grammar=tools``), each from the agent's first prompt with its
own sampling seed, at temperature 1. Reports: the matcher's time per generated token (mask computation and
advance, ``TokenMasker.allowed`` + ``consume``) beside the model's forward step per token, the share of tokens the
grammar forced, how many calls parse as a tool call of the environment with exactly its arguments (N/N), and the
learner's replay cost per token (``replay_masks``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from trajlake.envs.mini_swe.env import TOOL_DOCS
from trajlake.envs.policy import TaskView

from trajlake.policies import hf as hf_module
from trajlake.policies.hf import HFPolicy
from trajlake.policies.settings import LMSettings
from trajlake.policies.tiny import build_tiny_model
from trajlake.render.grammar import TokenMasker, replay_masks
from trajlake.render.toolcall import parse_tool_call

STATEMENT = "Fix the bug in `src/durations.py`: parse('1h30m') returns the wrong number of seconds."


class _Timed:
    """Accumulates the seconds spent in wrapped calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1
        return timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--max-chars", type=int, default=16, help="grammar_max_chars (characters per argument value)")
    ap.add_argument("--model", default=None, help="a model folder (default: build the tiny model)")
    args = ap.parse_args(argv)
    model_dir = Path(args.model) if args.model else build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    # the longest call: wrapper and keys, plus each value at the cap with 6-byte escapes; one token >= 1 byte
    budget = 128 + 3 * (2 + 6 * args.max_chars)
    policy = HFPolicy("bench", str(model_dir), LMSettings(temperature=1.0, max_new_tokens=budget, grammar="tools",
                                                         grammar_max_chars=args.max_chars, threads=1))
    view = TaskView("bench/task", "v", STATEMENT, TOOL_DOCS)
    mask_time, model_time = _Timed(), _Timed()
    hf_module.forward_step = model_time.wrap(hf_module.forward_step)  # type: ignore[assignment]
    n_tokens = n_forced = n_ok = 0
    generated: list[list[int]] = []
    t0 = time.perf_counter()
    for i in range(args.calls):
        policy.reset(view, seed=i)  # its own sampling seed per call
        masker = policy.masker()
        assert masker is not None
        if not hasattr(masker, "_bench_wrapped"):
            masker.allowed = mask_time.wrap(masker.allowed)  # type: ignore[method-assign]
            masker.consume = mask_time.wrap(masker.consume)  # type: ignore[method-assign]
            masker._bench_wrapped = True  # type: ignore[attr-defined]
        assert policy.renderer is not None
        context = policy.renderer.initial(policy.system, STATEMENT)
        gen = policy.generate(context, budget)
        assert gen.token_ids is not None and gen.loss_mask is not None
        generated.append(list(gen.token_ids))
        n_tokens += len(gen.token_ids)
        n_forced += gen.loss_mask.count(0)
        parsed = parse_tool_call(gen.text)
        if parsed.ok and parsed.tool in TOOL_DOCS:
            call_args = json.loads(parsed.action)["args"]
            n_ok += set(call_args) == set(TOOL_DOCS[parsed.tool]["args"]) and gen.ended_with_eos
    wall = time.perf_counter() - t0
    assert policy.grammar is not None and policy.renderer is not None
    replayer = TokenMasker(policy.grammar.text, policy.renderer.tokenizer, policy.n_vocab)
    t = time.perf_counter()
    for ids in generated:
        replay_masks(replayer, ids)
    replay_s = time.perf_counter() - t
    print(f"{args.calls} calls, {n_tokens} tokens ({n_tokens / args.calls:.1f} per call), grammar_max_chars "
          f"{args.max_chars}, {wall:.1f} s")
    print(f"parseable calls of the environment's tools with exactly their arguments: {n_ok}/{args.calls}")
    print(f"forced tokens (one allowed, loss_mask 0): {n_forced}/{n_tokens} ({n_forced / n_tokens:.0%})")
    print(f"masking (allowed + consume) per token: {1000 * mask_time.seconds / n_tokens:.3f} ms; model forward per "
          f"token: {1000 * model_time.seconds / max(1, model_time.calls):.2f} ms "
          f"({mask_time.seconds / max(model_time.seconds, 1e-9):.1%} of model time)")
    print(f"learner replay (replay_masks) per token: {1000 * replay_s / n_tokens:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
