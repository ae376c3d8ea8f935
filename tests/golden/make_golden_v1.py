"""Build the schema v1 golden files (run once; the output is committed and must stay readable forever).

    python tests/golden/make_golden_v1.py

Writes tests/golden/v1/lake (a small lake: 2 runs, 4 tasks, 8 episodes with gateway events) and
tests/golden/v1/episodes.jsonl (the same episodes in the trajlake-jsonl interchange format).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trajlake import LakeWriter, connect, open_lake
from trajlake.demo import RUNS, demo_tasks, generate, write_demo
from trajlake.io.jsonl import episode_to_json

HERE = Path(__file__).resolve().parent / "v1"


def main() -> None:
    lake_dir = HERE / "lake"
    shutil.rmtree(lake_dir, ignore_errors=True)
    lake = open_lake(lake_dir, create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        write_demo(w, seeds=2, n_tasks=2)
    shutil.rmtree(lake_dir / "_trajlake" / "duckdb_extensions", ignore_errors=True)
    lines = []
    for t in demo_tasks(2):
        lines.append(json.dumps({"type": "task", **{k: (v.isoformat() if hasattr(v, "isoformat") else v)
                                                     for k, v in t.items()}}))
    for ep, turns, events in generate(seeds=2, n_tasks=2, runs=RUNS[:2]):
        lines.append(episode_to_json(ep, turns, events))
    (HERE / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    con = connect(lake)
    expected = {
        "episodes": con.execute("select count(*) from episodes").fetchone()[0],  # type: ignore[index]
        "turns": con.execute("select count(*) from turns").fetchone()[0],  # type: ignore[index]
        "gateway_events": con.execute("select count(*) from gateway_events").fetchone()[0],  # type: ignore[index]
        "episode_hashes": dict(con.execute("select episode_id, content_hash from episodes order by 1").fetchall()),
    }
    shutil.rmtree(lake_dir / "_trajlake" / "duckdb_extensions", ignore_errors=True)
    (lake_dir / "_trajlake" / "commit.lock").unlink(missing_ok=True)
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
