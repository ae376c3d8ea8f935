"""Contamination benchmark (issue 14): the exact n-gram scan against ``datasketch`` MinHash LSH on the same
documents, in the same run.

    python bench/bench_contamination.py [--turns 1000000] [--eval-tasks 1000] [--planted 200]
                                        [--minhash-docs 20000] [--out bench/out/contamination] [--skip-generate]
                                        [--sql-engine]

1. Generates a lake: ``--eval-tasks`` tasks on split ``test`` (statements of 7 unique sentences, ~85 words) and
   ``--turns`` training turns on split ``train`` (100 turns per episode, each turn 6 sentences drawn from a bank of
   200,000 random sentences, ~70 words). ``--planted`` eval statements are copied verbatim into training turns
   (inside the turn's own text), all of them within the first ``--minhash-docs`` turns.
2. Times ``scan(checks=["exact_ngram"])`` over every training turn (13-grams): the default engine (DuckDB
   tokenises and hashes words, numpy hashes n-grams and semi-joins them with the eval hashes, DuckDB joins the
   hits back), and with ``--sql-engine`` also the pure-SQL engine (n-grams as list slices, a DuckDB semi join).
   Recall = planted tasks flagged / planted; any other flagged task is a false positive.
3. Times MinHash LSH on the first ``--minhash-docs`` of the same turns (word 5-gram shingles, 128
   permutations, threshold 0.7, as the scan's near-duplicate check uses it): sketch every training turn, insert
   it into a ``MinHashLSH``, sketch and query every eval statement. Its recall is measured on the planted copies,
   which all lie in that sample. Throughput = documents / second for both; the ratio is the figure of merit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from trajlake import LakeWriter, open_lake

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
TURNS_PER_EPISODE = 100
SENTENCES_PER_TURN = 6
BANK = 200_000
VOCAB = 30_000


def _words(rng: np.random.Generator, n_sentences: int, length: int) -> list[str]:
    """``n_sentences`` random sentences of ``length`` words drawn Zipf-like from a pseudo-word vocabulary."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(letters[rng.integers(0, 26, rng.integers(2, 10))]) for _ in range(VOCAB)]
    ranks = np.minimum(rng.zipf(1.2, size=(n_sentences, length)) - 1, VOCAB - 1)
    # shuffle rank -> word so frequent words are not all short
    return [" ".join(vocab[i] for i in row) + "." for row in ranks.tolist()]


def generate(root: Path, n_turns: int, n_eval: int, planted: int, sample: int, seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    t = time.perf_counter()
    bank = _words(rng, BANK, 12)
    uniq = _words(rng, n_eval * 7, 12)
    statements = [" ".join(uniq[i * 7:(i + 1) * 7]) for i in range(n_eval)]
    lake = open_lake(root, create=True)
    ts = pa.timestamp("us", tz="UTC")
    plant_tasks = rng.choice(n_eval, size=planted, replace=False)
    plant_turns = rng.choice(min(sample, n_turns), size=planted, replace=False)
    plants = dict(zip(plant_turns.tolist(), plant_tasks.tolist(), strict=True))
    with LakeWriter(lake) as w:
        w.write_tasks([{"task_id": f"eval-{i:05d}", "task_version": "v1", "env_id": "bench-env", "split": "test",
                        "family": f"fam-{i:05d}", "difficulty": None, "created_at": T0, "statement": statements[i],
                        "provenance": {"generator": "bench", "source": None, "commit": None, "mutator": None,
                                       "seed": None, "diff_hash": None},
                        "has_oracle": False, "budget": {"max_steps": None, "max_tokens": None, "max_cost": None}}
                       for i in range(n_eval)])
        w.write_runs([{"run_id": "train-run", "created_at": T0, "label": "train", "config": "{}",
                       "policy_name": "bench", "policy_version": "p1"}])
        batch_eps = 1000
        n_eps = -(-n_turns // TURNS_PER_EPISODE)
        for first in range(0, n_eps, batch_eps):
            eps = range(first, min(first + batch_eps, n_eps))
            n = len(eps) * TURNS_PER_EPISODE
            pick = rng.integers(0, BANK, size=(n, SENTENCES_PER_TURN))
            texts = [" ".join(bank[j] for j in row) for row in pick.tolist()]
            base = first * TURNS_PER_EPISODE
            for k in range(n):
                if base + k in plants:  # a verbatim copy inside the turn's own text
                    texts[k] = texts[k][:200] + " " + statements[plants[base + k]] + " " + texts[k][200:]
            ep_ids = [f"train-{e:07d}" for e in eps]
            idx = np.tile(np.arange(TURNS_PER_EPISODE, dtype=np.int32), len(eps))
            is_pol = idx % 2 == 1
            base_s = np.datetime64("2026-01-01T00:00:00", "us")
            starts = base_s + (np.arange(n) + first * TURNS_PER_EPISODE).astype("timedelta64[s]")
            turns = pa.table({
                "episode_id": pa.array(np.repeat(ep_ids, TURNS_PER_EPISODE)), "run_id": ["train-run"] * n,
                "turn_idx": pa.array(idx), "role": np.where(is_pol, "assistant", "user").tolist(),
                "actor": np.where(is_pol, "policy", "user").tolist(),
                "policy_version": pa.array(["p1" if p else None for p in is_pol.tolist()], pa.string()),
                "raw_content": texts, "started_at": pa.array(starts, ts), "ended_at": pa.array(starts, ts),
                "latency_ms": np.zeros(n), "status": ["OK"] * n, "tokens": pa.array(np.zeros(n, np.int32)),
                "cost_usd": np.zeros(n), "tool_seconds": np.zeros(n)})
            m = len(eps)
            starts_e = np.datetime64("2026-01-01T00:00:00", "us") + (np.asarray(eps) * TURNS_PER_EPISODE
                                                                     ).astype("timedelta64[s]")
            episodes = pa.table({
                "episode_id": ep_ids, "run_id": ["train-run"] * m, "task_id": [f"train-{e % 500}" for e in eps],
                "task_version": ["v1"] * m, "split": ["train"] * m, "env_id": ["bench-env"] * m,
                "env_version": ["1"] * m, "env_seed": pa.array(np.zeros(m, np.int64)),
                "group_id": [f"g{e}" for e in eps], "attempt": pa.array(np.zeros(m, np.int32)),
                "policy_version_start": ["p1"] * m, "policy_version_end": ["p1"] * m,
                "started_at": pa.array(starts_e, ts),
                "ended_at": pa.array(starts_e + np.timedelta64(TURNS_PER_EPISODE, "s"), ts),
                "n_turns": pa.array(np.full(m, TURNS_PER_EPISODE, np.int32)),
                "n_policy_tokens": pa.array(np.zeros(m, np.int64)), "terminated": [True] * m,
                "truncated": [False] * m, "termination_reason": ["submitted"] * m, "error_class": [None] * m,
                "success": [True] * m, "reward_total": np.ones(m),
                "reward_components": pa.array([[("resolved", 1.0)]] * m, pa.map_(pa.string(), pa.float64())), "tokens_in": pa.array(np.zeros(m, np.int64)),
                "tokens_out": pa.array(np.zeros(m, np.int64)), "cost_usd": np.zeros(m), "tool_seconds": np.zeros(m),
                "wall_seconds": np.full(m, float(TURNS_PER_EPISODE)), "faults_injected": pa.array(np.zeros(m, np.int32)),
                "injection_attempted": [False] * m})
            res = w.write_batch(episodes, turns, check_existing=False)
            if res.rejected:
                eid, issues = next(iter(res.rejected.items()))
                raise SystemExit(f"generator bug: {eid}: {issues[0]}")
            w.flush()
    return {"turns": n_turns, "eval_tasks": n_eval, "planted": sorted(f"eval-{i:05d}" for i in plant_tasks),
            "generate_s": round(time.perf_counter() - t, 1)}


def bench_exact(root: Path, planted: list[str], memory_limit: str | None, engine: str) -> dict[str, Any]:
    from trajlake.evaluators.contamination import ScanSettings, scan

    t, cpu = time.perf_counter(), time.process_time()
    r = scan(root, eval_split="test", settings=ScanSettings(engine=engine), checks=["exact_ngram"],
             memory_limit=memory_limit)
    dt_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
    flagged = set(r["checks"]["exact_ngram"]["flagged"])
    n = r["checks"]["exact_ngram"]["training_documents"]
    return {"docs": n, "seconds": round(dt_s, 2), "cpu_seconds": round(cpu_s, 2), "docs_per_s": round(n / dt_s),
            "docs_per_cpu_s": round(n / cpu_s),
            "recall": len(flagged & set(planted)) / len(planted), "false_positives": len(flagged - set(planted)),
            "training_ngram_hits": r["checks"]["exact_ngram"]["training_ngram_hits"]}


def bench_minhash(root: Path, planted: list[str], n_docs: int) -> dict[str, Any]:
    from datasketch import MinHash, MinHashLSH
    from trajlake.evaluators.contamination import normalise_words, shingles

    from trajlake.query import connect

    con = connect(root)
    texts = [x for (x,) in con.execute("SELECT raw_content FROM turns ORDER BY episode_id, turn_idx LIMIT ?",
                                       [n_docs]).fetchall()]
    evals = con.execute("SELECT task_id, statement FROM tasks ORDER BY task_id").fetchall()
    con.close()

    def sketch(text: str) -> MinHash:
        m = MinHash(num_perm=128, seed=1)
        m.update_batch(shingles(normalise_words(text), 5))
        return m

    t, cpu = time.perf_counter(), time.process_time()
    lsh = MinHashLSH(threshold=0.7, num_perm=128)
    for i, text in enumerate(texts):
        lsh.insert(str(i), sketch(text))
    found = {tid for tid, s in evals if lsh.query(sketch(s))}
    dt_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
    return {"docs": len(texts), "seconds": round(dt_s, 2), "cpu_seconds": round(cpu_s, 2),
            "docs_per_s": round(len(texts) / dt_s), "docs_per_cpu_s": round(len(texts) / cpu_s),
            "recall": len(found & set(planted)) / len(planted), "false_positives": len(found - set(planted))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=1_000_000)
    ap.add_argument("--eval-tasks", type=int, default=1000)
    ap.add_argument("--planted", type=int, default=200)
    ap.add_argument("--minhash-docs", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=Path("bench/out/contamination"))
    ap.add_argument("--memory-limit", default=None)
    ap.add_argument("--skip-generate", action="store_true")
    ap.add_argument("--sql-engine", action="store_true", help="also time the pure-SQL (duckdb) n-gram engine")
    a = ap.parse_args()
    root = a.out / "lake"
    meta_path = a.out / "generated.json"
    if not a.skip_generate:
        shutil.rmtree(a.out, ignore_errors=True)
        a.out.mkdir(parents=True)
        gen = generate(root, a.turns, a.eval_tasks, a.planted, a.minhash_docs)
        meta_path.write_text(json.dumps(gen))
    gen = json.loads(meta_path.read_text())
    planted = list(gen["planted"])
    exact = bench_exact(root, planted, a.memory_limit, "numpy")
    exact_sql = bench_exact(root, planted, a.memory_limit, "duckdb") if a.sql_engine else None
    mh = bench_minhash(root, planted, a.minhash_docs)
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, python {sys.version.split()[0]}",
           "generated": {k: v for k, v in gen.items() if k != "planted"}, "exact_ngram": exact,
           "exact_ngram_duckdb_engine": exact_sql, "minhash_lsh": mh,
           "throughput_ratio": round(exact["docs_per_s"] / mh["docs_per_s"], 1),
           "throughput_ratio_cpu": round(exact["docs_per_cpu_s"] / mh["docs_per_cpu_s"], 1),
           "throughput_ratio_cpu_duckdb_engine": round(exact_sql["docs_per_cpu_s"] / mh["docs_per_cpu_s"], 1)
           if exact_sql else None,
           "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
