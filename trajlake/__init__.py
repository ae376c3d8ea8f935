"""trajlake: a trajectory data lake and evaluation toolkit for agentic, multi-turn reinforcement learning.

The public API::

    import trajlake
    lake = trajlake.open_lake("lake", create=True)
    with trajlake.LakeWriter(lake) as writer:
        ep = writer.start_episode(run_id="r1", task_id="t1", task_version="v1", env_id="e", env_version="1",
                                  policy_version="p1")
        ep.add_turn("user", "fix the bug", token_ids=[1, 2, 3])
        ep.add_turn("assistant", "submit", token_ids=[4, 5], behavior_logprobs=[-0.1, -0.3])
        ep.finish(terminated=True, truncated=False, termination_reason="success", success=True,
                  reward_components={"resolved": 1.0})
    con = trajlake.connect(lake)            # DuckDB with views episodes, turns, tasks, runs, gateway_events
    lf = trajlake.scan(lake, "turns")       # Polars LazyFrame
"""

from __future__ import annotations

import os

# delta-rs links its own jemalloc, whose defaults (freed pages kept 10 s, four arenas per CPU) let a long-running
# writer's RSS creep with its commits (300-330 MB after 600 small flushes); a 1 s decay and two arenas cut that to
# ~276 MB and slow the creep, at no measurable CPU cost (docs/benchmarks.md, "The lake"). jemalloc reads this once,
# when deltalake is imported: it applies when trajlake is imported first (every CLI command), never over the
# user's own setting.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:2")

from trajlake._version import __version__
from trajlake.errors import (
    ConflictError,
    IntegrityError,
    Issue,
    LakeNotFoundError,
    QueryError,
    SchemaVersionError,
    TrajlakeError,
    ValidationError,
)
from trajlake.lake.maintenance import CompactReport, VerifyReport, compact, verify
from trajlake.lake.store import Lake
from trajlake.query import connect, lake_versions, scan
from trajlake.record.recorder import EpisodeRecorder, new_episode_id
from trajlake.record.writer import LakeWriter, WriteResult
from trajlake.schema import SCHEMA_VERSION, TABLES, arrow_schema, table_def


def open_lake(path: str | os.PathLike[str], *, create: bool = False) -> Lake:
    """Open the lake at ``path`` (creating it when ``create``)."""
    return Lake.init(path) if create else Lake.open(path)


__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "CompactReport",
    "ConflictError",
    "EpisodeRecorder",
    "IntegrityError",
    "Issue",
    "Lake",
    "LakeNotFoundError",
    "LakeWriter",
    "QueryError",
    "SchemaVersionError",
    "TrajlakeError",
    "ValidationError",
    "VerifyReport",
    "WriteResult",
    "__version__",
    "arrow_schema",
    "compact",
    "connect",
    "lake_versions",
    "new_episode_id",
    "open_lake",
    "scan",
    "table_def",
    "verify",
]
