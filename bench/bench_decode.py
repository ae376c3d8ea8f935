"""Decoding throughput of the ``hf:`` batch engine alone: generated tokens/s of N episodes' turns decoded in shared
forward passes (``--policy-arg batch_episodes=N``, ``trajlake.policies.batched``) against the same turns decoded one
at a time (``HFPolicy.generate``), on the same model, contexts and seeds (issue 28; the GPU figure of issues 24 §4
and 28).

    python bench/bench_decode.py [--model DIR] [--device auto] [--dtype auto] [--rows 1,8,32] [--context 2048]
                                 [--new-tokens 64] [--serial-rows 8] [--grammar tools] [--threads 0]

No environment and no lake: each row is one policy turn on a context of ``--context`` tokens (a Mini SWE dev
task's rendered system prompt and statement, repeated to that length, a different task per row) followed by up to
``--new-tokens`` sampled tokens (temperature 1; a row that samples end-of-turn stops early, so the figure counts
the tokens actually generated). The one-at-a-time arm decodes ``--serial-rows`` rows in turn; each batched arm
decodes N rows at once on N threads (how a rollout worker plays N episodes); both arms count prefill and decoding
time. ``bench/bench_lm_policy.py --batch-episodes N`` measures the same engine inside whole Mini SWE rollouts (lake
writes and the environment's steps included).

``--model DIR`` times a real model folder (e.g. SmolLM2-135M, ``python -m trajlake.policies.pretrained DIR``);
without it a tiny random model. ``--grammar tools`` decodes under Mini SWE's tool-call grammar (llguidance masks
every step; a real model then ends each row with one valid call and its end-of-turn token).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def contexts(policy: Any, rows: int, length: int) -> tuple[list[Any], list[list[int]]]:
    """Per row: the task view it plays and a context of exactly ``length`` tokens."""
    from trajlake.envs import list_tasks
    from trajlake.envs.mini_swe.env import TOOL_DOCS
    from trajlake.envs.policy import TaskView

    tasks = list_tasks("mini-swe", "dev")
    views, ids = [], []
    for i in range(rows):
        t = tasks[i % len(tasks)]
        view = TaskView(t["task_id"], t["task_version"], t.get("statement") or t["task_id"], TOOL_DOCS)
        policy.reset(view, i)
        first = policy.renderer.initial(policy.system, view.statement)
        views.append(view)
        ids.append((first * (length // len(first) + 1))[-length:])
    return views, ids


def decode_rows(policies: list[Any], views: list[Any], ids: list[list[int]], new_tokens: int,
                sync: Any, first_row: int = 0) -> tuple[float, list[Any]]:
    """Wall seconds for ``len(policies)`` rows decoded on as many threads (one row each), and their generations.
    Row ``first_row + k`` samples with seed ``first_row + k`` in either arm."""
    for k, (p, v) in enumerate(zip(policies, views, strict=True)):
        p.reset(v, first_row + k)
    out: list[Any] = [None] * len(policies)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            out[i] = policies[i].generate(ids[i], new_tokens)
        except BaseException as e:  # surfaced below: a failed row must fail the benchmark, not shrink it
            errors.append(e)

    sync()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(policies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sync()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0, out


def plain_row(model: Any, context: list[int], new_tokens: int, sync: Any) -> float:
    """Seconds for a plain transformers loop to decode ``new_tokens`` after ``context`` (one row): the model's
    forward with its KV cache, the argmax on the device, no sampling, grammar or recording."""
    import torch

    from trajlake.policies.hf import forward_rows

    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        logits, cache = forward_rows(model, torch.tensor([context], device=model.device))
        for _ in range(new_tokens - 1):
            nxt = logits.argmax(-1, keepdim=True)
            logits, cache = forward_rows(model, nxt, cache)
    sync()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--model", help="a Hugging Face model folder (default: a tiny random model)")
    ap.add_argument("--device", default="auto", help="auto: cuda when available, else cpu")
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--rows", default="1,8,32", help="batch sizes N to time (comma-separated)")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--serial-rows", type=int, default=8, help="rows decoded one at a time for the baseline")
    ap.add_argument("--grammar", default="", help="tools: decode under Mini SWE's tool-call grammar")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--plain", action="store_true", help="also time a plain transformers decoding loop (one row, "
                    "the same model, cache and contexts, the argmax taken on the device): the baseline of the "
                    "one-at-a-time arm")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="print torch.profiler's top operators over one row of K tokens decoded one at a time")
    args = ap.parse_args(argv)
    rows = sorted({int(x) for x in args.rows.split(",")})
    if not rows or rows[0] < 1 or args.serial_rows < 1 or args.context < 1 or args.new_tokens < 1:
        ap.error("--rows, --serial-rows, --context and --new-tokens must be >= 1")

    import torch

    from trajlake.policies.batched import batched_policies
    from trajlake.policies.hf import HFPolicy
    from trajlake.policies.settings import LMSettings
    from trajlake.policies.tiny import build_tiny_model

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else build_tiny_model(Path(tmp) / "m")
        policy_args = {"device": device, "dtype": dtype, "max_new_tokens": str(args.new_tokens),
                       "max_context": str(args.context + args.new_tokens), "threads": str(args.threads),
                       "grammar": args.grammar}
        parent = HFPolicy("bench", str(path), LMSettings.from_args(policy_args))
        n_rows = max(max(rows), args.serial_rows)
        views, ids = contexts(parent, n_rows, args.context)
        # warm-up: one row each way (CUDA kernels, the grammar's first masks)
        decode_rows([parent], views[:1], ids[:1], 4, sync)
        decode_rows(list(batched_policies(parent, 2)), views[:2], ids[:2], 4, sync)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        serial_s, serial_tokens = 0.0, 0
        for i in range(args.serial_rows):
            s, gens = decode_rows([parent], views[i:i + 1], ids[i:i + 1], args.new_tokens, sync, first_row=i)
            serial_s += s
            serial_tokens += sum(len(g.token_ids) for g in gens)
        base = serial_tokens / serial_s
        n_params = sum(p.numel() for p in parent.model.parameters())
        print(f"device {device} ({torch.cuda.get_device_name() if cuda else f'{torch.get_num_threads()} threads'}), "
              f"dtype {dtype}; {args.model or 'tiny random model'}: {n_params / 1e6:.1f} M parameters; context "
              f"{args.context} tokens, up to {args.new_tokens} new tokens per row, temperature 1"
              f"{', grammar ' + args.grammar if args.grammar else ''}; load average {os.getloadavg()[0]:.1f}")
        print(f"one at a time: {serial_tokens} tokens over {args.serial_rows} rows in {serial_s:.2f} s: "
              f"{base:,.0f} tokens/s ({serial_s / args.serial_rows * 1e3:.0f} ms per row)")
        if args.plain:
            plain_s = 0.0
            for i in range(args.serial_rows):
                plain_s += plain_row(parent.model, ids[i], args.new_tokens, sync)
            plain_tps = args.serial_rows * args.new_tokens / plain_s
            print(f"plain transformers loop, one row at a time: {plain_tps:,.0f} tokens/s "
                  f"({plain_s / args.serial_rows / args.new_tokens * 1e3:.1f} ms per token); one at a time / plain "
                  f"= {base / plain_tps:.2f}x")
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            parent.reset(views[0], 0)
            with profile(activities=activities) as prof:  # in this thread: the profiler records the caller's ops
                parent.generate(ids[0], args.profile)
                sync()
            print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
        for n in rows:
            pols = list(batched_policies(parent, n))
            s, gens = decode_rows(pols, views[:n], ids[:n], args.new_tokens, sync)
            tokens = sum(len(g.token_ids) for g in gens)
            engine = pols[0].engine
            mean_batch = engine.row_steps / engine.steps if engine.steps else float("nan")
            ended = sum(1 for g in gens if g.ended_with_eos)
            print(f"batched N = {n}: {tokens} tokens in {s:.2f} s: {tokens / s:,.0f} tokens/s = "
                  f"{tokens / s / base:.2f}x one at a time; {engine.steps} decoding steps, mean batch "
                  f"{mean_batch:.1f}; {ended}/{n} rows ended with end-of-turn; median row "
                  f"{statistics.median(len(g.token_ids) for g in gens):.0f} tokens")
        if cuda:
            print(f"peak CUDA memory (timed arms): {torch.cuda.max_memory_allocated() / 2**20:,.0f} MiB")
        if args.grammar:
            print("first row's reply:", repr(gens[0].text[:300]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
