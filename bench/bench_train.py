"""Trainer throughput: tokens/s of the training step, peak memory and MFU (issue 12, "Device").

    python bench/bench_train.py [--device auto] [--hidden-size 64] [--layers 2] [--seq 4096] [--batch 4]
                                [--steps 10] [--peak-tflops 989] [--model DIR] [--threads 0]

Times ``trajlake.train.loop.Learner`` doing what an RL step does (forward with log-probs and entropies, the
clipped policy loss over masked tokens, backward, all-reduce-free optimizer step) on random token batches with
half of the tokens masked as policy tokens, after two warm-up steps. Reports training tokens/s, peak memory
(CUDA: ``torch.cuda.max_memory_allocated``; CPU: the process's peak RSS) and the model FLOPs utilisation
MFU = 6 * parameters * tokens/s / peak FLOP/s (``--peak-tflops``: 989 is an H200's dense bf16 peak; the
attention FLOPs are left out, so MFU is a lower bound at long sequences). On CUDA the step runs under bf16
autocast like the trainer. The same script runs on a lent GPU machine (``--device cuda --hidden-size 1024
--layers 16``) and on CPU, where it is a smoke run.

``--model DIR`` times a real model folder instead of a tiny random one (``--hidden-size`` and ``--layers`` are
then ignored), e.g. the pretrained SmolLM2-135M built by ``python -m trajlake.policies.pretrained DIR``
(docs/pretrained.md): ``--model DIR --device cuda --seq 4096 --batch 8``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--model", help="a Hugging Face model folder to time instead of a tiny random model")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default; 1 is faster on a "
                    "machine whose cores are busy)")
    args = ap.parse_args(argv)

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from trajlake.policies.tiny import build_tiny_model
    from trajlake.train import math as tm
    from trajlake.train.loop import Dist, Learner, _device

    device = _device(args.device)
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
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        old = torch.full((args.batch, args.seq), -6.0)
        adv = torch.randn(args.batch, generator=gen)

        def step() -> None:
            out = learner.forward(batch, 1.0)
            loss, _ = tm.ppo_clip_loss(out["logp"], old.to(device), adv.to(device), mask.to(device))
            learner.step(loss, 1.0)

        for _ in range(2):
            step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    tokens = args.batch * args.seq * args.steps
    tps = tokens / dt
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() / 2**20
        peak_what = "CUDA max_memory_allocated"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        peak_what = "process peak RSS"
    mfu = 6 * n_params * tps / (args.peak_tflops * 1e12)
    what = args.model or "tiny random model"
    print(f"device {device}; {what}: {n_params / 1e6:.2f} M parameters ({config.num_hidden_layers} layers, hidden "
          f"{config.hidden_size}, vocabulary {vocab}); batch {args.batch} x {args.seq} tokens, {args.steps} timed "
          f"steps")
    print(f"training tokens/s: {tps:,.0f}")
    print(f"peak memory: {peak:,.0f} MiB ({peak_what})")
    print(f"MFU: {mfu * 100:.3g}% of {args.peak_tflops:g} TFLOP/s (6 N tokens/s; attention FLOPs not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
