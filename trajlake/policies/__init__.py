"""Language-model policies (rollout layer): ``hf:PATH``, ``openai:MODEL`` and the ``single-turn:SPEC`` wrapper
(baseline B0); ``trajlake.policies.best_of`` selects among group attempts (baseline B2). See docs/policies.md."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trajlake.errors import TrajlakeError
from trajlake.policies.settings import LMSettings, parse_policy_args

LM_PREFIXES = ("hf:", "openai:", "single-turn:")


def is_lm_policy(spec: str) -> bool:
    return spec.startswith(LM_PREFIXES)


def check_policy_spec(env: str, spec: str, policy_args: Mapping[str, str]) -> None:
    """Fail fast on a bad ``--policy``/``--policy-arg`` without loading a model."""
    if not is_lm_policy(spec):
        from trajlake.envs import make_policy

        if policy_args:
            raise TrajlakeError(f"--policy-arg applies to language-model policies (hf:, openai:, single-turn:), "
                                f"not {spec!r}")
        make_policy(env, spec, "check")
        return
    settings = LMSettings.from_args(policy_args)
    inner = spec.removeprefix("single-turn:")
    if settings.grammar and spec.startswith("single-turn:"):
        raise TrajlakeError(f"--policy {spec}: single-turn answers with a diff, not a tool call: --policy-arg grammar "
                            f"does not apply")
    if settings.batch_episodes > 1 and not spec.startswith("hf:"):
        raise TrajlakeError(f"--policy {spec}: --policy-arg batch_episodes batches the forward passes of an hf: "
                            f"model; it does not apply here")
    if inner.startswith("hf:"):
        path = Path(inner[3:])
        if not (path / "config.json").is_file():
            raise TrajlakeError(f"--policy {spec}: {path} is not a local model folder (no config.json)")
    elif inner.startswith("openai:"):
        if not inner[7:]:
            raise TrajlakeError("--policy openai:MODEL needs a model name")
        if settings.context_strategy == "summarize" and not settings.tokenizer:
            raise TrajlakeError(f"--policy {spec}: context_strategy summarize renders the summary into the token "
                                f"context: it needs --policy-arg tokenizer=PATH (chat mode sends messages)")
        if not settings.base_url:
            raise TrajlakeError(f"--policy {spec} needs --base-url URL (or --policy-arg base_url=URL)")
    else:
        raise TrajlakeError(f"--policy {spec}: single-turn wraps an hf: or openai: policy")


def batch_episodes(spec: str, policy_args: Mapping[str, str]) -> int:
    """Episodes one rollout worker plays at once with ``spec``: an ``hf:`` policy's ``batch_episodes``, else 1."""
    return LMSettings.from_args(policy_args).batch_episodes if spec.startswith("hf:") else 1


def lm_run_config(spec: str, policy_args: Mapping[str, str], tool_docs: Mapping[str, Mapping[str, Any]]
                  ) -> dict[str, Any]:
    """What an LM policy adds to its run's ``runs.config``: ``grammar`` (``{text, sha256, library, version}``)
    for a constrained run, ``server_logprobs`` for an ``openai:`` one; nothing for scripted policies."""
    if not is_lm_policy(spec):
        return {}
    settings = LMSettings.from_args(policy_args)
    out: dict[str, Any] = {}
    grammar = settings.tool_grammar(tool_docs)
    if grammar is not None:
        out["grammar"] = grammar.to_config()
    if spec.removeprefix("single-turn:").startswith("openai:"):
        out["server_logprobs"] = settings.server_logprobs
    return out


def checkpoint_hash(spec: str) -> str | None:
    """``runs.policy_checkpoint_hash`` of an LM policy: sha256 over the weight files of an ``hf:`` folder (names
    and contents, read once per run); None for ``openai:``, whose weights the server does not expose."""
    import hashlib

    inner = spec.removeprefix("single-turn:")
    if not inner.startswith("hf:"):
        return None
    folder = Path(inner[3:])
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".gguf"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def make_lm_policy(spec: str, policy_version: str, policy_args: Mapping[str, str]) -> Any:
    settings = LMSettings.from_args(policy_args)
    if spec.startswith("single-turn:"):
        from trajlake.policies.single_turn import SingleTurnPolicy

        inner = make_lm_policy(spec.removeprefix("single-turn:"), policy_version, policy_args)
        return SingleTurnPolicy(inner, settings.n_files)
    if spec.startswith("hf:"):
        from trajlake.policies.hf import HFPolicy

        return HFPolicy(policy_version, spec[3:], settings)
    if spec.startswith("openai:"):
        from trajlake.policies.openai_policy import OpenAIPolicy

        return OpenAIPolicy(policy_version, spec[7:], settings)
    raise TrajlakeError(f"unknown language-model policy {spec!r}")


def make_rollout_policy(env: str, spec: str, policy_version: str, policy_args: Mapping[str, str] | None = None) -> Any:
    """The policy a rollout worker plays: an environment's built-in one (oracle, heuristic, random) or a
    language model (``hf:PATH``, ``openai:MODEL``, ``single-turn:SPEC``)."""
    check_policy_spec(env, spec, policy_args or {})
    if is_lm_policy(spec):
        return make_lm_policy(spec, policy_version, policy_args or {})
    from trajlake.envs import make_policy

    return make_policy(env, spec, policy_version)


__all__ = ["LMSettings", "batch_episodes", "check_policy_spec", "checkpoint_hash", "is_lm_policy", "lm_run_config", "make_lm_policy",
           "make_rollout_policy", "parse_policy_args"]
