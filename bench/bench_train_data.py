"""The trainer's lake reader: tokens per second from the lake into padded batches (issue 12, "Reading the lake").

    python bench/bench_train_data.py [--episodes 1000] [--turns 8] [--tokens 300] [--batch 8] [--repeats 3]

Writes a synthetic lake of LM-like episodes (token ids recorded with one tokenizer fingerprint, loss mask 1 and
behaviour log-probs on the policy turns, ``--turns`` turns of about ``--tokens`` tokens each; the defaults give
2.4M tokens), then measures, on this machine's cores (2 in the reference runs):

- baseline: pyarrow reading the ``token_ids`` column of the same turns files (the floor of any reader);
- ``LakeTrajectories`` + ``pad_collate`` in batches of ``--batch`` samples, in the main process;
- the same through a ``torch.utils.data.DataLoader`` with 2 worker processes (worker start-up included).

Target: >= 1M tokens/s for the reader. Figures are the best of ``--repeats`` runs; tokens count every input token
(policy and observation tokens alike, as the trainer's forward pass sees them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from trajlake import Lake, LakeWriter, open_lake
from trajlake.train.data import LakeTrajectories, pad_collate

FP = "bench-model|tok:0123456789abcdef|tmpl:fedcba9876543210"


def build_lake(root: Path, episodes: int, turns: int, tokens: int, seed: int = 0) -> tuple[Lake, int]:
    """A lake of ``episodes`` LM-like episodes; returns it and the total number of tokens."""
    rng = np.random.default_rng(seed)
    lake = open_lake(root, create=True)
    total = 0
    start = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    with LakeWriter(lake, handle_signals=False) as w:
        for chunk in range(0, episodes, 250):
            ep_rows, turn_rows = [], []
            for e in range(chunk, min(episodes, chunk + 250)):
                eid = f"bench/{e:06d}"
                n_policy = 0
                for k in range(turns):
                    policy = k % 2 == 1
                    n = int(rng.integers(tokens // 2, tokens * 3 // 2))
                    ids = rng.integers(3, 32_000, n, dtype=np.int32)
                    total += n
                    n_policy += n if policy else 0
                    turn_rows.append({
                        "episode_id": eid, "turn_idx": k, "role": "assistant" if policy else ("user" if k == 0
                                                                                               else "tool"),
                        "actor": "policy" if policy else ("user" if k == 0 else "env"),
                        "policy_version": "p1" if policy else None, "raw_content": None, "token_ids": ids,
                        "loss_mask": np.full(n, 1 if policy else 0, np.int8),
                        "behavior_logprobs": -rng.random(n, dtype=np.float32) if policy else None,
                        "tokenizer_id": FP, "started_at": start, "ended_at": start, "latency_ms": 1.0,
                        "status": "OK", "tokens": n, "cost_usd": 0.0, "tool_seconds": 0.0})
                ep_rows.append({
                    "episode_id": eid, "run_id": f"run-{e % 4}", "task_id": f"task-{e % 50}", "task_version": "v1",
                    "split": "train", "env_id": "bench", "env_version": "1", "env_seed": e % 5,
                    "group_id": f"task-{e % 50}:v1:{e % 5}:1", "attempt": e // 250, "policy_version_start": "p1",
                    "policy_version_end": "p1", "started_at": start, "ended_at": start, "n_turns": turns,
                    "n_policy_tokens": n_policy, "terminated": True, "truncated": False,
                    "termination_reason": "submitted", "error_class": None, "success": bool(e % 2),
                    "reward_total": float(e % 2), "reward_components": {"resolved": float(e % 2)},
                    "tokens_in": 0, "tokens_out": n_policy, "cost_usd": 0.0, "tool_seconds": 0.0,
                    "wall_seconds": 1.0, "faults_injected": 0, "injection_attempted": False})
            w.write_batch(ep_rows, turn_rows, check_existing=False).raise_if_rejected()
    return lake, total


def baseline(lake: Lake) -> tuple[int, float]:
    """pyarrow reading the token_ids column of every turns file."""
    t = time.perf_counter()
    n = 0
    for f in lake.files("turns"):
        pf = pq.ParquetFile(lake.abs_path("turns", f.path))
        for batch in pf.iter_batches(batch_size=8192, columns=["token_ids"]):
            n += len(batch.column(0).values)
    return n, time.perf_counter() - t


def reader(lake: Lake, batch: int) -> tuple[int, float, float]:
    """LakeTrajectories + pad_collate in this process: (tokens, seconds, of which building the dataset)."""
    t = time.perf_counter()
    ds = LakeTrajectories(lake)
    built = time.perf_counter() - t
    n = 0
    buf = []
    for s in ds:
        buf.append(s)
        if len(buf) == batch:
            n += int(pad_collate(buf)["attention_mask"].sum())
            buf = []
    if buf:
        n += int(pad_collate(buf)["attention_mask"].sum())
    return n, time.perf_counter() - t, built


def loader(lake: Lake, batch: int, workers: int) -> tuple[int, float, float]:
    """Through a DataLoader: (tokens, seconds, seconds until the first batch arrived)."""
    t = time.perf_counter()
    dl = torch.utils.data.DataLoader(LakeTrajectories(lake), batch_size=batch, collate_fn=pad_collate,
                                     num_workers=workers)
    n = 0
    first = 0.0
    for b in dl:
        first = first or time.perf_counter() - t
        n += int(b["attention_mask"].sum())
    return n, time.perf_counter() - t, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-train-data-"))
    try:
        t = time.perf_counter()
        lake, total = build_lake(root / "lake", args.episodes, args.turns, args.tokens)
        print(f"lake: {args.episodes} episodes x {args.turns} turns, {total:,} tokens, "
              f"{len(lake.files('turns'))} turns files, written in {time.perf_counter() - t:.1f} s; "
              f"{os.cpu_count()} cores")
        best_b = best_r = best_l = best_steady = 0.0
        build = first = 0.0
        for _ in range(args.repeats):
            n, s = baseline(lake)
            assert n == total, (n, total)
            best_b = max(best_b, n / s)
            n, s, build = reader(lake, args.batch)
            assert n == total, (n, total)
            best_r = max(best_r, n / s)
            n, s, first = loader(lake, args.batch, 2)
            assert n == total, (n, total)
            best_l = max(best_l, n / s)
            best_steady = max(best_steady, n / (s - first))
        print(f"baseline (pyarrow, token_ids column only): {best_b / 1e6:8.2f} M tokens/s")
        print(f"LakeTrajectories + pad_collate, 1 process: {best_r / 1e6:8.2f} M tokens/s "
              f"({best_r / best_b:.2f}x baseline; building the dataset {build * 1000:.0f} ms)")
        print(f"DataLoader, 2 workers (start-up included): {best_l / 1e6:8.2f} M tokens/s "
              f"({best_l / best_b:.2f}x baseline; first batch after {first * 1000:.0f} ms, "
              f"{best_steady / 1e6:.2f} M tokens/s after it)")
        ok = min(best_r, best_l) >= 1e6
        print(f"target >= 1M tokens/s: {'met' if ok else 'NOT met'}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
