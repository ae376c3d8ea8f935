"""``--policy hf:PATH``: a Hugging Face ``transformers`` causal LM and its tokenizer from a local folder.

Sampling is this module's own loop over the model's KV cache (not ``generate``), so that the recorded behaviour
log-probability of each token is exactly the log-probability it was sampled with: log-softmax of the logits
divided by the temperature, after the top-p filter. ``score_tokens`` recomputes them from stored turns.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trajlake.errors import TrajlakeError
from trajlake.policies.lm import Generation, LMPolicy
from trajlake.policies.settings import LMSettings
from trajlake.render.chat import ChatRenderer


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise TrajlakeError("the hf: policy needs torch and transformers: pip install 'trajlake[train]'") from e
    return torch


def load_model(path: str | Path, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """Model and tokenizer from a local folder; nothing is downloaded."""
    torch = _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    if not (p / "config.json").is_file():
        raise TrajlakeError(f"hf:{path}: no config.json there (a local model folder is needed; nothing is "
                            f"downloaded)")
    tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True, dtype=getattr(torch, dtype))
    model.to(device)
    model.eval()
    return model, tok


def process_logits(logits: Any, temperature: float, top_p: float) -> Any:
    """Log-probabilities of the sampling distribution: temperature, then top-p (nucleus) filtering."""
    torch = _torch()
    x = logits.float()
    if temperature > 0:
        x = x / temperature
    logp = torch.log_softmax(x, dim=-1)
    if top_p < 1.0:
        sorted_lp, order = torch.sort(logp, descending=True, dim=-1)
        cum = torch.cumsum(sorted_lp.exp(), dim=-1)
        drop_sorted = (cum - sorted_lp.exp()) >= top_p  # keep the smallest prefix whose mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(x.masked_fill(drop, float("-inf")), dim=-1)
    return logp


def forward_step(model: Any, input_ids: Any, cache: Any = None) -> tuple[Any, Any]:
    """One forward pass with the KV cache; returns (logits of the last position, cache). transformers 5 names
    the cache argument ``cache``, earlier versions ``past_key_values``."""
    kw = getattr(model, "_trajlake_cache_kw", None)
    if kw is None:
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model._trajlake_cache_kw = kw
    out = model(input_ids=input_ids, use_cache=True, **({kw: cache} if cache is not None else {}))
    return out.logits[0, -1], getattr(out, "cache", None) or out.past_key_values


def score_tokens(model: Any, context_ids: Sequence[int], generated_ids: Sequence[int], temperature: float = 1.0,
                 top_p: float = 1.0) -> list[float]:
    """Re-score ``generated_ids`` after ``context_ids`` in one forward pass (the trainer's view)."""
    torch = _torch()
    ids = torch.tensor([list(context_ids) + list(generated_ids)], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0]
    n = len(context_ids)
    lp = process_logits(logits[n - 1:n - 1 + len(generated_ids)], temperature, top_p)
    gen = torch.tensor(list(generated_ids), device=lp.device)
    return [float(v) for v in lp.gather(-1, gen.view(-1, 1)).view(-1)]


class HFPolicy(LMPolicy):
    """A local causal LM, sampled with temperature, top-p, max_new_tokens and a per-episode seed."""

    name = "hf"

    def __init__(self, policy_version: str, path: str, settings: LMSettings):
        if settings.threads > 0:
            _torch().set_num_threads(settings.threads)
        model, tok = load_model(path, settings.device, settings.dtype)
        renderer = ChatRenderer(tok, f"hf:{Path(path).name}")
        window = getattr(model.config, "max_position_embeddings", None)
        super().__init__(policy_version, settings, renderer, window)
        self.model = model
        self._generator: Any = None

    def reset(self, task: Any, seed: int) -> None:
        super().reset(task, seed)
        torch = _torch()
        self._generator = torch.Generator(device="cpu").manual_seed(self.seed)

    def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        torch = _torch()
        s = self.settings
        assert self.renderer is not None
        eos = self.renderer.eos_id
        out_ids: list[int] = []
        logprobs: list[float] = []
        with torch.inference_mode():
            logits, cache = forward_step(self.model, torch.tensor([context_ids], device=self.model.device))
            for _ in range(max_new_tokens):
                logp = process_logits(logits, s.temperature, s.top_p)
                if s.temperature == 0:
                    tok = int(torch.argmax(logp))
                else:
                    tok = int(torch.multinomial(logp.exp().cpu(), 1, generator=self._generator))
                out_ids.append(tok)
                logprobs.append(float(logp[tok]))
                if tok == eos:
                    break
                logits, cache = forward_step(self.model, torch.tensor([[tok]], device=self.model.device), cache)
        text = self.renderer.decode(out_ids[:-1] if out_ids and out_ids[-1] == eos else out_ids)
        return Generation(out_ids, logprobs, text, len(context_ids), len(out_ids),
                          ended_with_eos=bool(out_ids) and out_ids[-1] == eos)


__all__ = ["HFPolicy", "forward_step", "load_model", "process_logits", "score_tokens"]
