"""The trainer's config file: every shipped config parses; bad keys and values are one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.train_configs import TWO_TASKS, rollout, tiny_config, write_config
from trajlake.train.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = {"name": "x", "model": {"build_tiny": True}, "stages": [{"name": "B1", "kind": "sft"}]}


TRAINING_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.toml") if b"[[stages]]" in p.read_bytes())


def test_training_configs_are_found() -> None:
    assert ROOT / "configs" / "smoke.toml" in TRAINING_CONFIGS


@pytest.mark.parametrize("path", TRAINING_CONFIGS, ids=lambda p: p.name)
def test_shipped_training_configs_parse(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.stages and cfg.source == str(path)


def test_smoke_config_runs_b1_then_r1() -> None:
    cfg = load_config(ROOT / "configs" / "smoke.toml")
    assert [(s.name, s.kind) for s in cfg.stages] == [("B1", "sft"), ("R1", "rl")]
    r1 = cfg.stages[1]
    assert r1.algo == "rloo" and r1.rollout.attempts >= 2 and r1.max_staleness == 1
    assert cfg.model.build_tiny and cfg.model.path is None


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "c.toml"
    f.parent.mkdir()
    write_config(f, tiny_config("x", [{"name": "B1", "kind": "sft"}], out="out"))
    cfg = load_config(f)
    assert cfg.resolve(cfg.out_dir) == f.parent / "out"


def test_yaml_config(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    f = tmp_path / "c.yaml"
    f.write_text("name: x\nmodel: {build_tiny: true}\nstages:\n  - {name: R1, kind: rl, algo: grpo, "
                 "rollout: {attempts: 3, seeds: '0-1'}}\n")
    cfg = load_config(f)
    assert cfg.stages[0].algo == "grpo" and cfg.stages[0].rollout.attempts == 3


@pytest.mark.parametrize(("change", "message"), [
    ({"lr": 0.1}, "unknown key(s) lr"),
    ({"stages": [{"name": "B1", "kind": "dpo"}]}, "stages[0].kind: 'dpo' is not one of"),
    ({"stages": [{"name": "B1"}]}, "stages[0]: missing key(s) kind"),
    ({"name": 3}, "name: expected str"),
    ({"stages": [{"name": "B1", "kind": "sft", "steps": "ten"}]}, "stages[0].steps: expected int"),
    ({"stages": [{"name": "R1", "kind": "rl", "rollout": {"attempts": 1}}]}, "rloo needs groups"),
    ({"stages": [{"name": "R1", "kind": "rl", "algo": "ppo", "rollout": {"attempts": 1},
                  "process_reward": "passed_text_reward"}]}, "process_reward must be one of"),
    ({"stages": [{"name": "B1", "kind": "sft"}, {"name": "B1", "kind": "sft"}]}, "stage names repeat"),
    ({"stages": []}, "no [[stages]]"),
    ({"model": {"build_tiny": True, "path": "m"}}, "exactly one of path"),
    ({"loss_aggregation": "mean"}, "loss_aggregation: 'mean' is not one of"),
    ({"stages": [{"name": "R3", "kind": "rl", "fault_rate_schedule": [0.1, 2]}]}, "fault_rate_schedule"),
])
def test_bad_config_is_one_clear_error(change: dict, message: str) -> None:
    data = {**MINIMAL, **change}
    if "lr" in change:
        data = {**MINIMAL, "model": {"build_tiny": True, "lr": 0.1}}
        message = "c.toml: model: unknown key(s) lr"
    with pytest.raises(ConfigError) as e:
        parse_config(data, "c.toml")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        load_config(bad)


# -- renamed keys (docs/names.md) -------------------------------------------------------------------------------

def _rl_stage(**keys: object) -> dict:
    return {**MINIMAL, "stages": [{"name": "R1", "kind": "rl", "rollout": {"attempts": 2}, **keys}]}


def test_max_policy_lag_is_read_as_max_staleness_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = parse_config(_rl_stage(max_policy_lag=2), "c.toml")
    assert cfg.stages[0].max_staleness == 2
    err = capsys.readouterr().err
    assert err == "c.toml: stages[0].max_policy_lag is deprecated, read as max_staleness (rename it; " \
                  "docs/names.md)\n"
    assert parse_config(_rl_stage(max_staleness=3), "c.toml").stages[0].max_staleness == 3
    assert capsys.readouterr().err == ""  # the new name: no note
    assert parse_config(_rl_stage(), "c.toml").stages[0].max_staleness == 0  # the default is unchanged


def test_max_policy_lag_and_max_staleness_together(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_config(_rl_stage(max_policy_lag=1, max_staleness=1), "c.toml").stages[0].max_staleness == 1
    assert "deprecated" in capsys.readouterr().err
    with pytest.raises(ConfigError) as e:
        parse_config(_rl_stage(max_policy_lag=1, max_staleness=2), "c.toml")
    assert str(e.value) == ("c.toml: stages[0].max_policy_lag = 1 and stages[0].max_staleness = 2 differ: "
                            "max_policy_lag is the deprecated name of max_staleness, give only max_staleness")


def test_a_deprecated_key_in_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "old.toml"
    f.write_text((ROOT / "configs" / "smoke.toml").read_text().replace("max_staleness = 1", "max_policy_lag = 1"))
    assert "max_policy_lag" in f.read_text()
    assert load_config(f).stages[1].max_staleness == 1
    assert capsys.readouterr().err.startswith(f"{f}: stages[1].max_policy_lag is deprecated")


def test_the_tests_config_writer_round_trips(tmp_path: Path) -> None:
    """tests/train_configs.py writes what the tests' trainer configs need: tables, arrays of tables, nested and
    inline values; the file reads back as the same config."""
    data = tiny_config("w", [
        {"name": "B1", "kind": "sft", "lr": 3e-3, "data": rollout(TWO_TASKS)},
        {"name": "R1", "kind": "rl", "fault_rate_schedule": [0.0, 0.5], "success_only": False,
         "rollout": rollout(TWO_TASKS[:1], attempts=2, max_new_tokens=16, max_steps=2,
                            policy_args={"price_out": "100"})},
    ], model=tmp_path / "m \\ \"q\"", out="out", lambda_cost=1.0)
    f = write_config(tmp_path / "w.toml", data)
    assert "[[stages]]" in f.read_text() and "[stages.rollout.env_args.budget]" in f.read_text()
    cfg = load_config(f)
    assert cfg == parse_config(data, str(f))
    r1 = cfg.stages[1]
    assert r1.rollout.policy_args == {"max_new_tokens": "16", "price_out": "100"}
    assert r1.rollout.env_args == {"budget": {"max_steps": 2}} and r1.rollout.tasks == TWO_TASKS[:1]
    assert cfg.model.path == str(tmp_path / "m \\ \"q\"") and cfg.stages[0].lr == 3e-3


# -- what cannot work is refused before anything is written (issue 24, section 1) ---------------------------------

def _rl(**rollout_keys: object) -> dict:
    return {"name": "R1", "kind": "rl", "rollout": {"attempts": 2, **rollout_keys}}


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(("change", "key"), [
    ({"stages": [_rl(policy_args={"top_p": "0.9"})]}, "stages[0] (R1).rollout.policy_args.top_p = 0.9"),
    ({"stages": [_rl(policy_args={"temperature": "0.7"})]}, "stages[0] (R1).rollout.policy_args.temperature = 0.7"),
    ({"stages": [_rl(policy_args={"temperature": "nan"})]}, "stages[0] (R1).rollout.policy_args.temperature = nan"),
    ({"temperature": 0.0, "stages": [_rl()]}, "temperature = 0"),
    ({"temperature": -1.0}, "temperature = -1.0"),
    ({"temperature": NAN}, "temperature = nan"),
    ({"stages": [{"name": "B1", "kind": "sft", "lr": INF}]}, "stages[0] (B1).lr = inf"),
    ({"stages": [{"name": "B1", "kind": "sft", "lr": NAN}]}, "stages[0] (B1).lr = nan"),
    ({"stages": [{"name": "B1", "kind": "sft", "lr": 0.0}]}, "stages[0] (B1).lr = 0.0"),
    ({"clip_low": 1.5}, "clip_low = 1.5"),
    ({"clip_high": -0.1}, "clip_low = 0.2, clip_high = -0.1"),
    ({"grad_clip": NAN}, "grad_clip = nan"),
    ({"model": {"build_tiny": True, "hidden_size": 0}}, "model.hidden_size = 0"),
    ({"model": {"build_tiny": True, "layers": -1}}, "model.layers = -1"),
    ({"model": {"build_tiny": True, "heads": 0}}, "model.heads = 0"),
    ({"model": {"build_tiny": True, "heads": 3}}, "model.hidden_size = 64: must be a multiple of model.heads = 3"),
    ({"model": {"build_tiny": True, "heads": 8, "kv_heads": 3}},
     "model.heads = 8: must be a multiple of model.kv_heads = 3"),
    ({"device": "gpu"}, "device = 'gpu'"),
    ({"stages": [{"name": "B1", "kind": "sft", "warmup_steps": -1}]}, "stages[0] (B1).warmup_steps = -1"),
    ({"stages": [{"name": "B1", "kind": "sft", "min_lr_ratio": 2.0}]}, "stages[0] (B1).min_lr_ratio = 2.0"),
    ({"stages": [{"name": "B1", "kind": "sft", "eval": {"policy_args": {"top_p": "nan"}}}]},
     "stages[0] (B1).eval.policy_args.top_p = nan"),
    ({"is_max_weight": 0.0}, "is_max_weight = 0.0"),
    ({"safety_violations": "some"}, "safety_violations: 'some' is not one of"),
])
def test_settings_that_cannot_work_are_one_line_naming_the_file_and_key(change: dict, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, **change}, "c.toml")
    message = str(e.value)
    assert message.startswith(f"c.toml: {key}") and "\n" not in message, message


def test_greedy_evaluation_and_sampling_settings_outside_training_stay_allowed() -> None:
    """Greedy evaluation (temperature 0) and top-p in an evaluation are fine: nothing is re-scored there."""
    cfg = parse_config({**MINIMAL, "stages": [
        {"name": "B1", "kind": "sft", "eval": {"policy_args": {"temperature": "0", "top_p": "0.9"}}},
        _rl(policy_args={"temperature": "1.0", "top_p": "1"})]}, "c.toml")
    assert cfg.stages[0].eval is not None and cfg.stages[0].eval.policy_args["temperature"] == "0"


def test_a_bad_env_or_split_is_refused_before_the_lake_or_the_output_exists(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from trajlake.train.loop import train

    for change, key in [({"env": "mini-sve"}, "env = 'mini-sve'"),
                        ({"stages": [{"name": "B1", "kind": "sft", "data": {"split": "tran"}}]},
                         "stages[0] (B1).data.split = 'tran'"),
                        ({"stages": [{"name": "B1", "kind": "sft", "data": {"tasks": ["mini-swe/nope/0"]}}]},
                         "stages[0] (B1).data.tasks: mini-swe/nope/0"),
                        ({"stages": [{"name": "B1", "kind": "sft", "data_policy": "oracel"}]},
                         "stages[0] (B1).data_policy = 'oracel'"),
                        ({"model": {"build_tiny": True, "tokenizer_env": "tool-lokup"}},
                         "model.tokenizer_env = 'tool-lokup'")]:
        cfg = parse_config({**MINIMAL, "out_dir": str(tmp_path / "out"), **change}, "c.toml")
        with pytest.raises(ConfigError) as e:
            train(cfg, tmp_path / "lake", log=lambda _: None)
        assert str(e.value).startswith(f"c.toml: {key}") and "\n" not in str(e.value), str(e.value)
        assert not (tmp_path / "out").exists() and not (tmp_path / "lake").exists()
