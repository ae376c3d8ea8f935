"""``--policy hf:PATH``: a Hugging Face ``transformers`` causal LM and its tokenizer from a local folder.

Sampling is this module's own loop over the model's KV cache (not ``generate``), so that the recorded behaviour
log-probability of each token is exactly the log-probability it was sampled with: log-softmax of the logits
divided by the temperature, after the top-p filter. ``score_tokens`` recomputes them from stored turns.

Under ``--policy-arg grammar=tools`` each step first masks the logits to the tokens the grammar allows
(``trajlake.render.grammar``): mask, then temperature, then top-p, then sample; the recorded log-prob is that of
the masked, renormalised distribution. A token the grammar forced (the only one allowed) has log-prob 0 under
every parameter value: it stays in the episode with loss_mask 0, so it is out of the loss and of its
token-mean denominator.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trajlake.envs.policy import Policy
from trajlake.errors import TrajlakeError
from trajlake.policies.lm import Generation, LMPolicy
from trajlake.policies.settings import LMSettings
from trajlake.render.chat import ChatRenderer
from trajlake.render.grammar import GrammarError, TokenMasker


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


def process_logits(logits: Any, temperature: float, top_p: float, allowed: Any = None) -> Any:
    """Log-probabilities of the sampling distribution: the grammar's mask (``allowed``, a bool tensor like the
    logits; None: no grammar), then temperature, then top-p (nucleus) filtering."""
    torch = _torch()
    x = logits.float()
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
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


def draw_token(logp: Any, generator: Any) -> int:
    """One draw from ``exp(logp)`` (a ``[V]`` distribution on any device) with a CPU ``generator``: the token
    ``torch.multinomial(logp.exp().cpu(), 1, generator=generator)`` draws, bit for bit, and the generator left in the
    same state. For one sample torch's multinomial takes ``argmax(p / q)`` with ``q ~ Exp(1)`` drawn on the
    generator (the exponential form of the Gumbel-max trick); here ``q`` is drawn the same way on the CPU and the
    division and argmax run where the logits are, so no ``[V]`` probability vector crosses to the host each token
    (on a GPU that copy, and multinomial's CPU-side checks, cost milliseconds a token). Division and argmax are
    exact IEEE operations on both devices, and argmax takes the first of equal maxima on both. A distribution with
    a NaN (which multinomial refuses) raises here too."""
    torch = _torch()
    p = logp.exp()
    q = torch.empty(p.shape, dtype=p.dtype).exponential_(1, generator=generator)
    tok = int(torch.argmax(p / q.to(p.device)))
    if not bool(torch.isfinite(p[tok])):
        raise TrajlakeError(f"cannot sample: the distribution holds a non-finite probability ({float(p[tok])})")
    return tok


def forward_step(model: Any, input_ids: Any, cache: Any = None) -> tuple[Any, Any]:
    """One forward pass with the KV cache; returns (logits of the last position, cache)."""
    logits, cache = forward_rows(model, input_ids, cache)
    return logits[0], cache


def forward_rows(model: Any, input_ids: Any, cache: Any = None, **kwargs: Any) -> tuple[Any, Any]:
    """One forward pass of a batch of rows with the KV cache; returns (``[rows, vocab]`` logits of the last
    position, cache). ``kwargs`` (``attention_mask``, ``position_ids`` of a padded batch) go to the model.
    transformers 5 names the cache argument ``cache``, earlier versions ``past_key_values``."""
    kw = getattr(model, "_trajlake_cache_kw", None)
    if kw is None:
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model._trajlake_cache_kw = kw
    out = model(input_ids=input_ids, use_cache=True, **({kw: cache} if cache is not None else {}), **kwargs)
    return out.logits[:, -1], getattr(out, "cache", None) or out.past_key_values


def score_tokens(model: Any, context_ids: Sequence[int], generated_ids: Sequence[int], temperature: float = 1.0,
                 top_p: float = 1.0, allowed: Any = None) -> list[float]:
    """Re-score ``generated_ids`` after ``context_ids`` in one forward pass (the trainer's view); ``allowed``:
    the grammar's masks before each generated token (``[n, V]`` booleans, e.g. ``unpack_mask(replay_masks(...))``)
    for a constrained turn."""
    torch = _torch()
    ids = torch.tensor([list(context_ids) + list(generated_ids)], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0]
    n = len(context_ids)
    mask = None if allowed is None else torch.as_tensor(allowed, dtype=torch.bool, device=logits.device)
    lp = process_logits(logits[n - 1:n - 1 + len(generated_ids)], temperature, top_p, mask)
    gen = torch.tensor(list(generated_ids), device=lp.device)
    return [float(v) for v in lp.gather(-1, gen.view(-1, 1)).view(-1)]


class HFPolicy(LMPolicy):
    """A local causal LM, sampled with temperature, top-p, max_new_tokens and a per-episode seed."""

    name = "hf"

    def __init__(self, policy_version: str, path: str, settings: LMSettings, *, shared: HFPolicy | None = None):
        """``shared``: a policy whose model and renderer this one uses (an episode of a batched worker)."""
        if shared is not None:
            model, renderer = shared.model, shared.renderer
        else:
            if settings.threads > 0:
                _torch().set_num_threads(settings.threads)
            model, tok = load_model(path, settings.device, settings.dtype)
            renderer = ChatRenderer(tok, f"hf:{Path(path).name}")
        window = getattr(model.config, "max_position_embeddings", None)
        super().__init__(policy_version, settings, renderer, window)
        self.path = path
        self.model: Any = model
        self.batch_episodes = settings.batch_episodes
        self._generator: Any = None
        self._maskers: dict[str, TokenMasker] = {}
        head = model.get_output_embeddings()
        self.n_vocab = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)
        """Width of the model's logits (the masks' width)."""

    def load_checkpoint(self, policy_version: str, path: str) -> None:
        """Play on with the weights in ``path`` as ``policy_version`` (a turn-boundary upgrade,
        ``RolloutConfig.turn_upgrades``): the next turn is decoded by them. The tokenizer and chat template must
        be this policy's (a trainer's checkpoints carry the same files), else the episode's tokens would mix two
        vocabularies."""
        model, tok = load_model(path, self.settings.device, self.settings.dtype)
        assert self.renderer is not None
        if tok.get_vocab() != self.renderer.tokenizer.get_vocab():
            raise TrajlakeError(f"hf:{path}: another tokenizer than hf:{self.path}'s; a version switch within an "
                                f"episode needs the same one")
        self.model, self.path, self.policy_version = model, path, policy_version

    def reset(self, task: Any, seed: int) -> None:
        super().reset(task, seed)
        torch = _torch()
        self._generator = torch.Generator(device="cpu").manual_seed(self.seed)

    def concurrent(self, n: int) -> list[Policy]:
        """``n`` policies over this model whose episodes are decoded together (``trajlake.policies.batched``)."""
        from trajlake.policies.batched import batched_policies

        return list(batched_policies(self, n))

    def masker(self) -> TokenMasker | None:
        """The matcher of the episode's grammar (one per distinct grammar, reused across episodes)."""
        if self.grammar is None:
            return None
        m = self._maskers.get(self.grammar.sha256)
        if m is None:
            assert self.renderer is not None
            m = self._maskers[self.grammar.sha256] = TokenMasker(self.grammar.text, self.renderer.tokenizer,
                                                                 self.n_vocab)
        return m

    def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        torch = _torch()
        assert self.renderer is not None
        turn = TurnDecoder(self.settings, self.renderer.eos_id, self._generator, self.masker(), max_new_tokens)
        with torch.inference_mode():
            logits, cache = forward_step(self.model, torch.tensor([context_ids], device=self.model.device))
            while True:
                tok = turn.sample(logits)
                if turn.done:
                    break
                logits, cache = forward_step(self.model, torch.tensor([[tok]], device=self.model.device), cache)
        return turn.generation(self.renderer, len(context_ids))


class TurnDecoder:
    """One policy turn, token by token: the grammar's mask, the draw from the episode's own generator, the
    recorded log-prob and loss mask. ``HFPolicy.generate`` and the batched engine (``trajlake.policies.batched``)
    both sample through it, so a turn draws the same stream whether or not other episodes share its forward
    passes."""

    def __init__(self, settings: LMSettings, eos: int, generator: Any, masker: TokenMasker | None,
                 max_new_tokens: int):
        self.settings, self.eos, self.generator, self.masker = settings, eos, generator, masker
        self.max_new_tokens = max_new_tokens
        if masker is not None:
            masker.reset()  # each policy turn is one call, from the grammar's start
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.loss_mask: list[int] = []
        self.done = False

    def allowed(self, device: Any) -> Any:
        """The grammar's mask of the next token (a bool tensor; None: unconstrained)."""
        if self.masker is None:
            return None
        allowed = _torch().from_numpy(self.masker.allowed()).to(device)
        if not bool(allowed.any()):
            raise GrammarError(f"the grammar allows no token after {len(self.ids)} generated token(s)")
        return allowed

    def sample(self, logits: Any) -> int:
        """Draw the next token from the last position's logits (one row) and record it."""
        allowed = self.allowed(logits.device)
        return self.take(process_logits(logits, self.settings.temperature, self.settings.top_p, allowed), allowed)

    def take(self, logp: Any, allowed: Any) -> int:
        """Draw the next token from ``logp`` (``process_logits`` of one row, under ``allowed``) and record it."""
        torch = _torch()
        tok = int(torch.argmax(logp)) if self.settings.temperature == 0 else draw_token(logp, self.generator)
        forced = allowed is not None and int(allowed.sum()) == 1
        self.ids.append(tok)
        self.logprobs.append(0.0 if forced else float(logp[tok]))
        self.loss_mask.append(0 if forced else 1)
        if self.masker is not None:
            self.masker.consume(tok)
        self.done = tok == self.eos or len(self.ids) >= self.max_new_tokens
        return tok

    def generation(self, renderer: ChatRenderer, prompt_tokens: int) -> Generation:
        out = self.ids
        eos = bool(out) and out[-1] == self.eos
        return Generation(out, self.logprobs, renderer.decode(out[:-1] if eos else out), prompt_tokens, len(out),
                          ended_with_eos=eos, loss_mask=self.loss_mask if self.masker is not None else None)


__all__ = ["HFPolicy", "TurnDecoder", "draw_token", "forward_rows", "forward_step", "load_model", "process_logits", "score_tokens"]
