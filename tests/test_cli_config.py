"""``--config FILE`` under the command line (issue 23, "The bug"): every ``trajlake rollout`` option takes its value
from the command line, else the file, else its default, decided by click's parameter source. The commands run
through the real Typer app; the runner and the preflight are stand-ins, so nothing plays."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import pytest
import typer
from typer.testing import CliRunner

from tests.conftest import run_cli
from trajlake.cli import app
from trajlake.cli.config_file import options_from
from trajlake.errors import TrajlakeError
from trajlake.record.episode import DEFAULT_TOOL_SECOND_USD
from trajlake.rollout.faults import DEFAULT_FAULT_KINDS
from trajlake.rollout.runner import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]


class Built(Exception):
    """Raised by the stand-in runner with the configuration the command built."""

    def __init__(self, cfg: RolloutConfig) -> None:
        super().__init__("built")
        self.cfg = cfg


class Rollout(NamedTuple):
    cfg: RolloutConfig
    preflight_ran: bool


Invoke = Callable[..., Any]


@pytest.fixture
def rollout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Invoke:
    """``rollout(args, toml=None, root=(), env=None)``: run ``trajlake ROOT rollout ARGS [--config FILE with the
    TOML text]`` and return what it built, or the exception when it refused."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAJLAKE_LAKE", raising=False)
    preflights: list[str] = []

    def preflight(env: str, split: str, **env_kwargs: Any) -> list[Any]:
        preflights.append(env)
        return []

    def run_rollout(cfg: RolloutConfig, progress: Any = None) -> Any:
        raise Built(cfg)

    monkeypatch.setattr("trajlake.rollout.preflight.preflight", preflight)
    monkeypatch.setattr("trajlake.rollout.runner.run_rollout", run_rollout)

    def invoke(args: list[str], toml: str | None = None, root: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> Rollout | BaseException:
        command = [*root, "rollout", *args]
        if toml is not None:
            (tmp_path / "rollout.toml").write_text(toml, encoding="utf-8")
            command += ["--config", str(tmp_path / "rollout.toml")]
        preflights.clear()
        res = CliRunner().invoke(app, command, env=env)
        if isinstance(res.exception, Built):
            return Rollout(res.exception.cfg, bool(preflights))
        assert res.exception is not None, res.output
        return res.exception

    return invoke


def built(result: Rollout | BaseException) -> Rollout:
    assert isinstance(result, Rollout), f"refused: {result!r}"
    return result


class Case(NamedTuple):
    option: str
    cli: list[str]
    """The option on the command line: its default where it has one, else a value other than the file's."""
    file: str
    """A line of the file's [rollout] table disagreeing with ``cli``."""
    observe: Callable[[Rollout], Any]
    from_cli: Any
    from_file: Any
    default: Any
    context: tuple[str, ...] = ()
    """Other options the case needs (an LM policy for --policy-arg, --engine ray for --ray-address)."""
    file_only: str | None = None
    """The line for the file-only run, when ``file`` cannot show the file winning (a flag without an off switch)."""


LM = ("--policy", "openai:m", "--base-url", "http://server")


def _cfg(attr: str) -> Callable[[Rollout], Any]:
    return lambda r: getattr(r.cfg, attr)


CASES = [
    Case("env", ["--env", "mini-swe"], 'env = "mini-web"', _cfg("env"), "mini-swe", "mini-web", "mini-swe"),
    Case("policy", ["--policy", "heuristic"], 'policy = "oracle"', _cfg("policy"), "heuristic", "oracle", "heuristic"),
    Case("split", ["--split", "dev"], 'split = "train"', _cfg("split"), "dev", "train", "dev"),
    Case("seeds", ["--seeds", "0"], 'seeds = "3-4"', _cfg("seeds"), (0,), (3, 4), (0,)),
    Case("workers", ["--workers", "1"], "workers = 3", _cfg("workers"), 1, 3, 1),
    Case("run_id", ["--run-id", "cli-run"], 'run_id = "file-run"', _cfg("run_id"), "cli-run", "file-run",
         "heuristic-dev"),
    Case("fault_rate", ["--fault-rate", "0"], "fault_rate = 0.5", _cfg("fault_rate"), 0.0, 0.5, 0.0),
    Case("fault_seed", ["--fault-seed", "0"], "fault_seed = 7", _cfg("fault_seed"), 0, 7, 0),
    Case("fault_kinds", ["--fault-kinds", ",".join(DEFAULT_FAULT_KINDS)], 'fault_kinds = ["http_5xx"]',
         _cfg("fault_kinds"), DEFAULT_FAULT_KINDS, ("http_5xx",), DEFAULT_FAULT_KINDS),
    Case("held_out_fault_kind", ["--held-out-fault-kind", "timeout"], 'held_out_fault_kind = "http_5xx"',
         _cfg("held_out_fault_kind"), "timeout", "http_5xx", None),
    Case("policy_version", ["--policy-version", "v1"], 'policy_version = "v2"', _cfg("policy_version"), "v1", "v2",
         None),
    Case("max_policy_lag", ["--max-policy-lag", "2"], "max_policy_lag = 5", _cfg("max_policy_lag"), 2, 5, None),
    Case("engine", ["--engine", "local"], 'engine = "ray"', _cfg("engine"), "local", "ray", "local"),
    Case("ray_address", ["--ray-address", "cli:1"], 'ray_address = "file:2"', _cfg("ray_address"), "cli:1",
         "file:2", None, context=("--engine", "ray")),
    Case("commit_every", ["--commit-every", "30"], "commit_every = 5.0", _cfg("commit_every_s"), 30.0, 5.0, 30.0),
    Case("max_pending_episodes", ["--max-pending-episodes", "256"], "max_pending_episodes = 10",
         _cfg("max_pending_episodes"), 256, 10, 256),
    Case("price_in", ["--price-in", "0"], "price_in = 0.5", lambda r: r.cfg.cost_model.price_in, 0.0, 0.5, 0.0),
    Case("price_out", ["--price-out", "0"], "price_out = 0.5", lambda r: r.cfg.cost_model.price_out, 0.0, 0.5, 0.0),
    Case("price_tool_second", ["--price-tool-second", "0.001"], "price_tool_second = 0.002",
         lambda r: r.cfg.cost_model.price_tool_second, 0.001, 0.002, DEFAULT_TOOL_SECOND_USD),
    Case("env_arg", ["--env-arg", "k=1"], 'env_arg = ["k=2"]', lambda r: r.cfg.env_kwargs.get("k"), 1, 2, None),
    Case("preflight", ["--preflight"], "preflight = false", lambda r: r.preflight_ran, True, False, True),
    Case("attempts", ["--attempts", "1"], "attempts = 4", _cfg("attempts"), 1, 4, 1),
    Case("policy_arg", ["--policy-arg", "temperature=0.5"], 'policy_arg = ["temperature=0.9"]',
         lambda r: r.cfg.policy_args.get("temperature"), "0.5", "0.9", None, context=LM),
    Case("base_url", ["--base-url", "http://cli"], 'base_url = "http://file"',
         lambda r: r.cfg.policy_args.get("base_url"), "http://cli", "http://file", "http://policy-arg",
         context=("--policy", "openai:m", "--policy-arg", "base_url=http://policy-arg")),
    Case("tasks", ["--tasks", "t1"], 'tasks = ["t2", "t3"]', _cfg("task_ids"), ("t1",), ("t2", "t3"), ()),
    Case("data_cutoff", ["--data-cutoff", "2025-01-01"], "data_cutoff = 2026-06-30", _cfg("data_cutoff"),
         "2025-01-01", "2026-06-30", None),
    Case("injection", ["--injection", "important_instructions"], 'injection = "tool_knowledge"',
         lambda r: r.cfg.env_kwargs.get("injection"), "important_instructions", "tool_knowledge", None),
    Case("lake", ["--lake", "cli-lake"], 'lake = "file-lake"', _cfg("lake"), "cli-lake", "file-lake", "lake"),
]


def test_the_cases_cover_every_rollout_option() -> None:
    command = typer.main.get_command(app).commands["rollout"]  # type: ignore[attr-defined]
    # allow_unisolated is command-line only (test_the_sandbox_opt_out_is_command_line_only)
    assert {c.option for c in CASES} == {p.name for p in command.params} - {"config", "allow_unisolated"}


@pytest.mark.parametrize("line", ["allow_unisolated = true", "allow-unisolated = false",
                                  'env_arg = ["allow_unisolated=true"]'])
def test_the_sandbox_opt_out_is_command_line_only(rollout: Invoke, tmp_path: Path, line: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared config file cannot switch off Mini SWE's sandbox: only --allow-unisolated on the command line (on
    a machine with bubblewrap; without it the scripted policies fall back by themselves: test_security.py)."""
    monkeypatch.setattr("trajlake.rollout.preflight.scripted_policies_need_fallback", lambda env: False)
    err = rollout([], toml=f"[rollout]\n{line}\n")
    assert isinstance(err, TrajlakeError), err
    assert "\n" not in str(err) and (f"--config {tmp_path / 'rollout.toml'}: allow" in str(err)
                                      or "use --allow-unisolated" in str(err)), err
    assert built(rollout(["--allow-unisolated"])).cfg.env_kwargs["allow_unisolated"] is True
    assert "allow_unisolated" not in built(rollout([])).cfg.env_kwargs
    assert isinstance(rollout(["--env-arg", "allow_unisolated=true"]), TrajlakeError)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.option)
def test_the_command_line_beats_the_file(rollout: Invoke, case: Case) -> None:
    """Given on the command line (with its default value where it has one), the option wins over the file."""
    result = built(rollout([*case.context, *case.cli], toml=f"[rollout]\n{case.file}\n"))
    assert case.observe(result) == case.from_cli


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.option)
def test_the_file_beats_the_default(rollout: Invoke, case: Case) -> None:
    result = built(rollout(list(case.context), toml=f"[rollout]\n{case.file_only or case.file}\n"))
    assert case.observe(result) == case.from_file


@pytest.mark.parametrize("toml", [None, "[rollout]\n"], ids=["no-file", "empty-table"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.option)
def test_neither_is_the_default(rollout: Invoke, case: Case, toml: str | None) -> None:
    assert case.observe(built(rollout(list(case.context), toml=toml))) == case.default


def test_keys_at_the_top_level_with_either_spelling(rollout: Invoke) -> None:
    toml = 'fault-rate = 0.25\nmax_pending_episodes = 8\nseeds = [1, 2]\n[select]\nrun = "x"\n'
    cfg = built(rollout([], toml=toml)).cfg
    assert (cfg.fault_rate, cfg.max_pending_episodes, cfg.seeds) == (0.25, 8, (1, 2))


def test_the_lake_before_the_command_and_the_environment_beat_the_file(rollout: Invoke, tmp_path: Path) -> None:
    toml = '[rollout]\nlake = "file-lake"\n'
    assert built(rollout([], toml=toml, root=("--lake", "root-lake"))).cfg.lake == "root-lake"
    assert built(rollout([], toml=toml, env={"TRAJLAKE_LAKE": "env-lake"})).cfg.lake == "env-lake"
    assert built(rollout(["--lake", "own-lake"], toml=toml, root=("--lake", "root-lake"))).cfg.lake == "own-lake"


def test_settings_merge_key_by_key(rollout: Invoke) -> None:
    """The file's KEY=VALUE settings (and [policy_args] table) come first; the command line's win per key."""
    toml = ('[rollout]\nenv_arg = ["a=1", "b=2"]\npolicy_arg = ["top_p=0.5", "seed=3"]\n'
            "[rollout.policy_args]\ntemperature = 0.9\nseed = 1\nmax_new_tokens = 16\n")
    cfg = built(rollout([*LM, "--env-arg", "a=3", "--policy-arg", "temperature=0.2"], toml=toml)).cfg
    assert cfg.env_kwargs == {"a": 3, "b": 2}
    assert cfg.policy_args == {"temperature": "0.2", "seed": "3", "max_new_tokens": "16", "top_p": "0.5",
                               "base_url": "http://server"}


@pytest.mark.parametrize(("args", "price_in"), [
    (["--policy-arg", "price_in=0.2"], 0.2),
    (["--policy-arg", "price_in=0.2", "--price-in", "0.7"], 0.7),
    (["--policy-arg", "price_in=0.2", "--price-in", "0"], 0.0),  # given, even as its default, it wins
])
def test_an_explicit_price_beats_the_policy_setting(rollout: Invoke, args: list[str], price_in: float) -> None:
    assert built(rollout([*LM, *args])).cfg.cost_model.price_in == price_in


def test_a_price_in_the_file_beats_the_policy_setting(rollout: Invoke) -> None:
    cfg = built(rollout(list(LM), toml='[rollout]\nprice_in = 0\n[rollout.policy_args]\nprice_in = 0.2\n')).cfg
    assert cfg.cost_model.price_in == 0.0 and cfg.policy_args["price_in"] == "0.2"


@pytest.mark.parametrize(("line", "needle"), [
    ('workers = "3"', "workers: expected an integer, not a string '3'"),
    ("workers = 0", "workers: Invalid value for '--workers'"),
    ("commit_every = -1", "commit_every: Invalid value for '--commit-every'"),
    ('fault_rate = "0.5"', "fault_rate: expected a number, not a string"),
    ("preflight = 1", "preflight: expected true or false, not an integer 1"),
    ("seeds = true", "seeds: expected a string or a list of integers, not a boolean"),
    ('tasks = {a = 1}', "tasks: expected a string or a list of strings, not a table"),
    ('env_arg = "a=1"', "env_arg: expected a list of strings, not a string"),
    ("policy_args = 3", "policy_args: expected a table, not an integer"),
    ("colour = 1", "unknown key(s) colour; keys: allow_unisolated, attempts, base_url,"),
    ("fault-rate = 0.1\nfault_rate = 0.2", "fault-rate and fault_rate are the same option"),
    ("config = 'other.toml'", "unknown key(s) config;"),
])
def test_a_bad_key_or_value_is_one_line_naming_the_file_and_the_key(rollout: Invoke, tmp_path: Path, line: str,
                                                                     needle: str) -> None:
    err = rollout([], toml=f"[rollout]\n{line}\n")
    assert isinstance(err, TrajlakeError), err
    message = str(err)
    assert "\n" not in message and f"--config {tmp_path / 'rollout.toml'}: " in message
    assert needle in message, message


def test_main_prints_a_bad_file_as_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text('[rollout]\nattempts = "2"\n', encoding="utf-8")
    code, out, err = run_cli(capsys, "--lake", str(tmp_path / "lake"), "rollout", "--config", str(tmp_path / "r.toml"))
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [f"error: --config {tmp_path / 'r.toml'}: attempts: expected an integer, "
                                        "not a string '2'"]
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize("name", ["agent-tiny", "b2-tiny", "b0-tiny"])
def test_the_shipped_configs_still_read(rollout: Invoke, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr("trajlake.policies.check_policy_spec", lambda env, spec, args: None)  # no model built
    cfg = built(rollout([], toml=(ROOT / "configs" / f"{name}.toml").read_text(encoding="utf-8"))).cfg
    assert cfg.policy.endswith("hf:models/tiny") and cfg.seeds == (0,) and len(cfg.task_ids) == 2
    assert cfg.attempts == (4 if name == "b2-tiny" else 1) and cfg.policy_args["seed"] == "0"


@dataclasses.dataclass(frozen=True)
class LevelOptions:
    level: int


def test_an_environment_variable_beats_the_file_and_the_file_the_default(tmp_path: Path) -> None:
    """The merge on its own, for an option that reads an environment variable (no rollout option does)."""
    small = typer.Typer()

    @small.command()
    def show(ctx: typer.Context, level: Annotated[int, typer.Option(envvar="TRAJLAKE_TEST_LEVEL")] = 1,
             config: Path | None = None) -> None:
        options, explicit = options_from(ctx, LevelOptions, config, table="show")
        typer.echo(f"{options.level} {sorted(explicit)}")

    (tmp_path / "c.toml").write_text("[show]\nlevel = 5\n", encoding="utf-8")
    with_file = ["--config", str(tmp_path / "c.toml")]

    def shown(args: list[str], env: dict[str, str] | None = None) -> str:
        return CliRunner().invoke(small, args, env=env).output.strip()

    assert shown([]) == "1 []"
    assert shown(with_file) == "5 ['level']"
    assert shown(with_file, env={"TRAJLAKE_TEST_LEVEL": "3"}) == "3 ['level']"
    assert shown([*with_file, "--level", "1"], env={"TRAJLAKE_TEST_LEVEL": "3"}) == "1 ['level']"


# best-of reads the [select] table of the same kind of file with the same merge.

@pytest.fixture
def best_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Invoke:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAJLAKE_LAKE", raising=False)
    calls: list[dict[str, Any]] = []

    class Report:
        def summary(self) -> str:
            return "chosen"

    def select_best(lake: str, run: str, out_run: str, **budget: Any) -> Report:
        calls.append({"lake": lake, "run": run, "out_run": out_run, **budget})
        return Report()

    monkeypatch.setattr("trajlake.policies.best_of.select_best", select_best)

    def invoke(args: list[str], toml: str) -> dict[str, Any] | BaseException:
        (tmp_path / "b.toml").write_text(toml, encoding="utf-8")
        calls.clear()
        res = CliRunner().invoke(app, ["best-of", *args, "--config", str(tmp_path / "b.toml")])
        return calls[0] if res.exit_code == 0 and calls else (res.exception or AssertionError(res.output))

    return invoke


def test_best_of_reads_its_table_under_the_command_line(best_of: Invoke) -> None:
    toml = (ROOT / "configs" / "b2-tiny.toml").read_text(encoding="utf-8")
    assert best_of([], toml) == {"lake": "lake", "run": "b2-pool-tiny", "out_run": "b2-tiny", "budget_tokens": None,
                                 "match_run": "agent-tiny", "budget_cost": None}
    # A budget on the command line replaces the file's (it names one budget: tokens, cost or a matched run).
    assert best_of(["--budget-tokens", "100", "--run", "pool"], toml) == {
        "lake": "lake", "run": "pool", "out_run": "b2-tiny", "budget_tokens": 100.0, "match_run": None,
        "budget_cost": None}


@pytest.mark.parametrize(("toml", "needle"), [
    ('[select]\nrun = "p"\nout_run = "o"\nbudget_tokens = "many"\n', "budget_tokens: expected a number"),
    ('[select]\nrun = "p"\nout-run = "o"\nbudgets = 3\n', "unknown key(s) budgets"),
])
def test_best_of_refuses_a_bad_select_table(best_of: Invoke, toml: str, needle: str) -> None:
    err = best_of([], toml)
    assert isinstance(err, TrajlakeError) and needle in str(err), err
