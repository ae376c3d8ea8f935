from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from trajlake.errors import SchemaDefinitionError, SchemaVersionError
from trajlake.schema import (
    SCHEMA_VERSION,
    TABLES,
    _parse,
    arrow_schema,
    check_schema_version,
    schema_markdown,
    table_def,
    to_arrow_type,
)

ROOT = Path(__file__).resolve().parents[1]

REQUIRED = {
    "episodes": """episode_id run_id task_id task_version split env_id env_version env_image_digest env_seed group_id
        attempt policy_version_start policy_version_end started_at ended_at n_turns n_policy_tokens terminated
        truncated termination_reason error_class success reward_total reward_components tokens_in tokens_out
        cost_usd tool_seconds wall_seconds faults_injected injection_attempted final_state_hash content_hash
        schema_version writer_version""",
    "turns": """episode_id turn_idx role actor policy_version raw_content token_ids loss_mask behavior_logprobs
        tokenizer_id action_schema tool_call_id tool_args observation_hash env_state_hash started_at ended_at
        latency_ms status tokens cost_usd tool_seconds idempotency_key fault_injected reward_components
        context_dropped_hash summary_version content_hash""",
    "tasks": "task_id task_version env_id split family difficulty created_at statement provenance has_oracle budget",
    "runs": "run_id created_at label config policy_name policy_version policy_checkpoint_hash code_version "
            "trajlake_version",
    "gateway_events": """episode_id turn_idx event_idx tool capability args_hash decision reason executed
        side_effect_class idempotency_key taint state_hash_before state_hash_after at""",
}


@pytest.mark.parametrize("name", TABLES)
def test_issue_columns_present(name: str) -> None:
    cols = set(table_def(name).column_names)
    missing = set(REQUIRED[name].split()) - cols
    assert not missing, f"{name} lacks {missing}"


def test_types_and_enums() -> None:
    s = arrow_schema("turns")
    assert s.field("token_ids").type == pa.list_(pa.int32())
    assert s.field("loss_mask").type == pa.list_(pa.int8())
    assert s.field("behavior_logprobs").type == pa.list_(pa.float32())
    assert s.field("started_at").type == pa.timestamp("us", tz="UTC")
    assert arrow_schema("episodes").field("reward_components").type == pa.map_(pa.string(), pa.float64())
    assert table_def("episodes").column("termination_reason").enum == (
        "success", "submitted", "gave_up", "budget_steps", "budget_tokens", "budget_cost", "timeout",
        "safety_stop", "env_failure")
    assert set(table_def("episodes").column("error_class").enum or ()) == {
        "MODEL_INVALID_ACTION", "MODEL_BAD_PLAN", "ENV_TRANSIENT", "ENV_BUG", "SAFETY_BLOCK", "BUDGET_EXHAUSTED"}
    assert table_def("episodes").column("error_class").nullable
    assert arrow_schema("episodes").metadata[b"trajlake.schema_version"] == SCHEMA_VERSION.encode()


def test_docs_schema_md_matches_json_definitions() -> None:
    doc = (ROOT / "docs" / "schema.md").read_text()
    assert doc == schema_markdown(), "docs/schema.md drifted: run `trajlake schema --format markdown > docs/schema.md`"


def test_malformed_definitions_are_rejected() -> None:
    with pytest.raises(SchemaDefinitionError):
        to_arrow_type("uint128")
    with pytest.raises(SchemaDefinitionError):
        _parse({"table": "x", "schema_version": "1.0", "description": "", "primary_key": ["nope"],
                "partition_by": [], "columns": [{"name": "a", "type": "string", "nullable": False,
                                                 "description": ""}]}, "x.json")
    with pytest.raises(SchemaDefinitionError):
        table_def("not_a_table")


def test_unknown_major_version_is_refused() -> None:
    check_schema_version("1.0", "f")
    check_schema_version(b"1.7", "f")
    with pytest.raises(SchemaVersionError, match="major version 2"):
        check_schema_version("2.0", "somefile.parquet")
    with pytest.raises(SchemaVersionError, match="no trajlake schema version"):
        check_schema_version(None, "x")
