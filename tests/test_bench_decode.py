"""``bench/bench_decode.py`` (the batch engine's decoding throughput, no environment or lake) and the lake stand-ins
of ``bench/device`` that let the GPU benchmarks import trajlake on a machine without deltalake, duckdb or polars."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.conftest import load_bench

ROOT = Path(__file__).resolve().parent.parent


def _figure(out: str, after: str) -> float:
    return float(out.split(after)[1].split()[0].replace(",", ""))


def test_bench_decode_counts_the_tokens_of_each_arm(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench("bench_decode")
    assert bench.main(["--device", "cpu", "--rows", "1,3", "--context", "48", "--new-tokens", "5",
                       "--serial-rows", "2", "--threads", "1", "--plain"]) == 0
    out = capsys.readouterr().out
    assert "device cpu (1 threads), dtype float32; tiny random model" in out
    # each row stops at its token limit or at end-of-turn: never more than rows x new tokens
    serial = out.split("one at a time: ")[1]
    assert 2 <= int(serial.split()[0]) <= 10 and " over 2 rows in " in serial
    assert _figure(out, "plain transformers loop, one row at a time: ") > 0
    for n in (1, 3):
        line = out.split(f"batched N = {n}: ")[1].split("\n")[0]
        tokens = int(line.split()[0])
        assert n <= tokens <= 5 * n and "x one at a time" in line and f"/{n} rows ended with end-of-turn" in line
    with pytest.raises(SystemExit):
        bench.main(["--rows", "0"])
    assert "must be >= 1" in capsys.readouterr().err


def _import_in_child(code: str, force: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench" / "device")}
    env.pop("TRAJLAKE_FORCE_LAKE_STUBS", None)
    if force:
        env["TRAJLAKE_FORCE_LAKE_STUBS"] = "1"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_lake_stand_ins_only_replace_what_is_missing() -> None:
    code = ("import duckdb, deltalake.exceptions as e; print(type(duckdb).__name__, "
            "issubclass(e.CommitFailedError, Exception))")
    real = _import_in_child(code, force=False)  # installed here: the finder, last on sys.meta_path, never answers
    assert real.returncode == 0 and real.stdout.split() == ["module", "True"] and "stand-in" not in real.stderr
    stub = _import_in_child(code + "; import trajlake.policies.batched, trajlake.train.loop", force=True)
    assert stub.returncode == 0, stub.stderr
    assert stub.stdout.split() == ["_StubModule", "True"]
    assert "[lake stand-in] duckdb: not installed; imported as a stand-in" in stub.stderr
    # anything beyond import fails at once instead of pretending to be a lake
    used = _import_in_child("import duckdb; duckdb.connect(':memory:').execute('select 1')", force=True)
    assert used.returncode != 0 and "AttributeError" in used.stderr
