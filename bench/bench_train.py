"""Trainer throughput: tokens/s of the training step against a plain transformers loop, peak memory and MFU
(issues 12 and 28).

    python bench/bench_train.py [--device auto] [--hidden-size 64] [--layers 2] [--seq 4096] [--batch 4]
                                [--steps 10] [--rounds 3] [--no-baseline] [--peak-tflops 989] [--model DIR]
                                [--threads 0] [--profile]

Times ``trajlake.train.loop.Learner`` doing what an RL step does (forward with log-probs and, at the policy tokens,
entropies; the clipped policy loss over masked tokens, backward, all-reduce-free optimizer step with the
trainer's gradient clipping and finiteness checks) on random token batches with half of the tokens masked as policy tokens, after
two warm-up steps. Unless ``--no-baseline``, the same script times a plain transformers loop on the same batches
and the same weights: ``AutoModelForCausalLM`` (``LlamaForCausalLM`` for the tiny model) forward with
``labels`` (Hugging Face's own cross-entropy over the same policy tokens, the others ``-100``), ``backward``,
``torch.optim.AdamW.step``, ``zero_grad``; nothing else. The two alternate in ``--rounds`` rounds of ``--steps``
steps (trainer first in even rounds, the plain loop first in odd ones), so a machine whose load changes during
the run weighs on both; the ratio trainer / plain is reported per round and as the median.

Reports training tokens/s, peak memory (CUDA: ``torch.cuda.max_memory_allocated`` of the trainer's rounds; CPU:
the process's peak RSS, both arms) and the model FLOPs utilisation MFU = 6 * parameters * tokens/s / peak FLOP/s
(``--peak-tflops``: 989 is an H200's dense bf16 peak; the attention FLOPs are left out, so MFU is a lower bound
at long sequences). On CUDA both loops run under bf16 autocast like the trainer. The same script runs on a lent
GPU machine (``--device cuda --hidden-size 1024 --layers 16``) and on CPU.

``--model DIR`` times a real model folder instead of a tiny random one (``--hidden-size`` and ``--layers`` are
then ignored), e.g. the pretrained SmolLM2-135M built by ``python -m trajlake.policies.pretrained DIR``
(docs/pretrained.md): ``--model DIR --device cuda --seq 4096 --batch 8``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round and arm")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of trainer and plain-loop steps")
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the plain transformers loop (default: yes)")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--model", help="a Hugging Face model folder to time instead of a tiny random model")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed rounds, print torch.profiler's top operators over 2 steps of each arm")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default; 1 is faster on a "
                    "machine whose cores are busy)")
    args = ap.parse_args(argv)

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from trajlake.policies.tiny import build_tiny_model
    from trajlake.train import math as tm
    from trajlake.train.loop import Dist, Learner, _device

    device = _device(args.device)
    cuda = device.startswith("cuda")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            path = build_tiny_model(Path(tmp) / "m", hidden_size=args.hidden_size, layers=args.layers,
                                    max_positions=max(args.seq, 4096))
        elif not (Path(args.model) / "config.json").is_file():
            ap.error(f"--model {args.model}: not a Hugging Face model folder (no config.json)")
        else:
            path = Path(args.model)
        window = json.loads((path / "config.json").read_text()).get("max_position_embeddings", args.seq)
        if args.seq > window:
            ap.error(f"--seq {args.seq} is longer than the model's window ({window} positions)")
        learner = Learner(path, device, Dist())
        config = learner.model.config
        learner.new_optimizer(1e-4)
        vocab = int(config.vocab_size)
        n_params = sum(p.numel() for p in learner.model.parameters())
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (args.batch, args.seq), generator=gen)
        mask = (torch.rand(args.batch, args.seq, generator=gen) < 0.5).float()
        # the loss mask travels with the batch as in training (the trainer computes the logged entropy there only)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": mask}
        old = torch.full((args.batch, args.seq), -6.0)
        adv = torch.randn(args.batch, generator=gen)

        def trainer_step() -> None:
            out = learner.forward(batch, 1.0)
            loss, _ = tm.ppo_clip_loss(out["logp"], old.to(device), adv.to(device), mask.to(device))
            learner.step(loss, 1.0)

        steps: dict[str, Callable[[], None]] = {"trainer": trainer_step}
        if args.baseline:
            # the same weights, batches and policy tokens, trained the way a plain transformers script does
            loaded: Any = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True,
                                                               dtype=torch.float32)
            plain = loaded.to(device)
            plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-4, weight_decay=0.0)
            labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
            autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext

            def plain_step() -> None:
                with autocast():
                    out = plain(input_ids=batch["input_ids"].to(device),
                                attention_mask=batch["attention_mask"].to(device), labels=labels.to(device))
                out.loss.backward()
                plain_opt.step()
                plain_opt.zero_grad(set_to_none=True)

            steps["plain"] = plain_step

        for fn in steps.values():
            for _ in range(2):
                fn()
        seconds: dict[str, list[float]] = {k: [] for k in steps}
        cpu: dict[str, list[float]] = {k: [] for k in steps}
        peak_cuda = 0.0
        for r in range(args.rounds):
            # alternate which arm goes first, so a load that rises or falls during the run weighs on both
            order = list(steps) if r % 2 == 0 else list(reversed(steps))
            for name in order:
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.steps):
                    steps[name]()
                if cuda:
                    torch.cuda.synchronize()
                seconds[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                if cuda and name == "trainer":
                    peak_cuda = max(peak_cuda, torch.cuda.max_memory_allocated() / 2**20)
        if args.profile:  # where each arm's step time goes (the trainer's gap to the plain loop)
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            for name, fn in steps.items():
                with profile(activities=activities) as prof:
                    for _ in range(2):
                        fn()
                    if cuda:
                        torch.cuda.synchronize()
                key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
                print(f"profile of 2 steps, {name} (sorted by {key}):")
                print(prof.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=50))
    tokens = args.batch * args.seq * args.steps
    tps = {k: [tokens / s for s in v] for k, v in seconds.items()}
    best = {k: max(v) for k, v in tps.items()}
    if cuda:
        peak, peak_what = peak_cuda, "CUDA max_memory_allocated, trainer rounds"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        peak_what = "process peak RSS" + (", both arms" if args.baseline else "")
    mfu = 6 * n_params * best["trainer"] / (args.peak_tflops * 1e12)
    what = args.model or "tiny random model"
    print(f"device {device}; {what}: {n_params / 1e6:.2f} M parameters ({config.num_hidden_layers} layers, hidden "
          f"{config.hidden_size}, vocabulary {vocab}); batch {args.batch} x {args.seq} tokens, {args.steps} timed "
          f"steps x {args.rounds} rounds; torch threads {torch.get_num_threads()}; load average "
          f"{'/'.join(f'{x:.1f}' for x in load)} at start")
    print(f"training tokens/s: {best['trainer']:,.0f} (best round; rounds "
          + ", ".join(f"{x:,.0f}" for x in tps["trainer"]) + ")")
    if args.baseline:
        ratios = [t / p for t, p in zip(tps["trainer"], tps["plain"], strict=True)]
        print(f"plain transformers loop tokens/s: {best['plain']:,.0f} (best round; rounds "
              + ", ".join(f"{x:,.0f}" for x in tps["plain"]) + ")")
        print(f"ratio trainer / plain: {statistics.median(ratios):.3f}x median of the per-round ratios ("
              + ", ".join(f"{x:.3f}" for x in ratios) + f"), {best['trainer'] / best['plain']:.3f}x best/best; "
              "target >= 0.9x")
        if not cuda:  # CPU seconds per token move less than wall time when other jobs share the cores
            cpu_ratios = [p / t for t, p in zip(cpu["trainer"], cpu["plain"], strict=True)]
            print(f"ratio by CPU time (plain CPU-s / trainer CPU-s for the same tokens): "
                  f"{statistics.median(cpu_ratios):.3f}x median (" + ", ".join(f"{x:.3f}" for x in cpu_ratios)
                  + f"); CPU-s per round trainer {min(cpu['trainer']):.2f}, plain {min(cpu['plain']):.2f} (best)")
    print(f"peak memory: {peak:,.0f} MiB ({peak_what})")
    print(f"MFU: {mfu * 100:.3g}% of {args.peak_tflops:g} TFLOP/s (6 N tokens/s; attention FLOPs not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
