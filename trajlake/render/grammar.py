"""Grammar-constrained decoding of tool calls: the grammar, and the token masks a matcher gives over it.

``tool_call_grammar(tool_docs)`` builds a Lark grammar from an environment's ``tool_docs`` that accepts exactly
one call in the Hermes format as ``trajlake.render.toolcall.format_call`` writes it::

    <tool_call>{"name": "edit", "arguments": {"new": "...", "old": "...", "path": "..."}}</tool_call>

with ``json.dumps``'s separators (``", "``, ``": "``), the tool names as alternatives (sorted), each tool's argument
names in sorted order (what ``parse_tool_call`` + ``format_call`` give back), every value a JSON string (JSON
escapes allowed, at most ``max_arg_chars`` characters; an escape counts as one) or, where the tool doc declares
``{"type": "integer"}`` for the argument, a JSON integer. After the closing tag the only allowed token is the
tokenizer's end-of-turn token (eos). The text is deterministic for the same tool docs, so its sha256 names it.

``TokenMasker`` runs a matcher (llguidance) over one grammar with one tokenizer: ``allowed()`` is the set of
tokens the grammar allows next, ``consume(token)`` advances it. The ``hf:`` sampler masks with it at each step;
the trainer's reader replays it over the stored tokens (``replay_masks``) to rebuild the same masks, so that
behaviour and learner log-probs are of the same (masked, renormalised) distribution. This module is below the
policies (the trainer's reader imports it); llguidance is imported only when a masker is built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np
import numpy.typing as npt

from trajlake.errors import GrammarError
from trajlake.render.toolcall import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

GRAMMAR_LIBRARY = "llguidance"
GRAMMAR_MODES = ("tools",)
"""Values of ``--policy-arg grammar`` (empty: unconstrained)."""
DEFAULT_MAX_ARG_CHARS = 1024
"""Default cap on the characters of one argument value."""
_MAX_INT_DIGITS = 18

# A JSON string body: any character but '"', '\' and control characters, or a JSON escape.
_JSON_CHAR = r'([^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4})'


@dataclass(frozen=True)
class Grammar:
    """A grammar and the library that enforces it (``runs.config.grammar`` of a constrained run)."""

    text: str
    library: str = GRAMMAR_LIBRARY
    version: str = ""

    @property
    def sha256(self) -> str:
        return "sha256:" + hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def to_config(self) -> dict[str, str]:
        """``{text, sha256, library, version}``, as recorded in ``runs.config.grammar``."""
        return {"text": self.text, "sha256": self.sha256, "library": self.library, "version": self.version}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Grammar:
        """The grammar of a run's ``config["grammar"]``; its sha256 must match its text."""
        g = cls(str(config["text"]), str(config.get("library") or GRAMMAR_LIBRARY), str(config.get("version") or ""))
        if config.get("sha256") not in (None, g.sha256):
            raise GrammarError(f"runs.config.grammar: sha256 {config.get('sha256')} does not match its text "
                               f"({g.sha256})")
        return g


def library_version() -> str:
    """The installed llguidance's version; a clear error when it is missing."""
    try:
        return metadata.version(GRAMMAR_LIBRARY)
    except metadata.PackageNotFoundError:
        raise GrammarError("grammar-constrained decoding needs llguidance: pip install 'trajlake[lm]'") from None


def _literal(text: str) -> str:
    """A Lark string literal (JSON string syntax is Lark's, for the characters tool names and JSON use)."""
    return json.dumps(text, ensure_ascii=False)


def _arg_kind(doc: Any) -> str:
    """``integer`` when the argument's doc declares it (``{"type": "integer", ...}``), else ``string``."""
    if isinstance(doc, Mapping) and doc.get("type") == "integer":
        return "integer"
    return "string"


def tool_call_grammar(tool_docs: Mapping[str, Mapping[str, Any]], max_arg_chars: int = DEFAULT_MAX_ARG_CHARS,
                      version: str | None = None) -> Grammar:
    """The grammar of one tool call of ``tool_docs`` (``{name: {"description", "args": {arg: doc}}}``).

    ``version``: the library version to record (default: the installed one; tests give it to stay offline)."""
    if not tool_docs:
        raise GrammarError("a tool-call grammar needs at least one tool (the environment's tool_docs is empty)")
    if max_arg_chars < 1:
        raise GrammarError(f"grammar_max_chars must be >= 1, not {max_arg_chars}")
    lines = ["start: " + _literal(TOOL_CALL_OPEN + '{"name": ') + " call " + _literal("}" + TOOL_CALL_CLOSE)]
    names = sorted(tool_docs)
    lines.append("call: " + " | ".join(f"tool_{i}" for i in range(len(names))))
    used: set[str] = set()
    for i, name in enumerate(names):
        args = dict(tool_docs[name].get("args") or {})
        # literal text and value terminals in order; adjacent literals are merged into one
        seq: list[tuple[bool, str]] = [(True, json.dumps(name, ensure_ascii=False) + ', "arguments": {')]
        for j, arg in enumerate(sorted(args)):
            seq.append((True, (", " if j else "") + json.dumps(arg, ensure_ascii=False) + ": "))
            seq.append((False, "INT" if _arg_kind(args[arg]) == "integer" else "STR"))
        seq.append((True, "}"))
        merged: list[tuple[bool, str]] = []
        for is_lit, part in seq:
            if is_lit and merged and merged[-1][0]:
                merged[-1] = (True, merged[-1][1] + part)
            else:
                merged.append((is_lit, part))
        used.update(part for is_lit, part in merged if not is_lit)
        lines.append(f"tool_{i}: " + " ".join(_literal(p) if is_lit else p for is_lit, p in merged))
    if "STR" in used:
        lines.append(f'STR: /"{_JSON_CHAR}{{0,{int(max_arg_chars)}}}"/')
    if "INT" in used:
        lines.append(f"INT: /-?(0|[1-9][0-9]{{0,{_MAX_INT_DIGITS - 1}}})/")
    return Grammar("\n".join(lines) + "\n", GRAMMAR_LIBRARY, library_version() if version is None else version)


# -- masks ------------------------------------------------------------------------------------------------------

def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.hf
    except ImportError:
        raise GrammarError("grammar-constrained decoding needs llguidance: pip install 'trajlake[lm]'") from None
    return llguidance


_LL_TOKENIZERS: dict[int, tuple[Any, Any]] = {}
"""id(tokenizer) -> (tokenizer, llguidance tokenizer); the tokenizer is held so that its id stays its own. Kept
beside the tokenizer, not on it, so a tokenizer pickled into a dataloader worker carries nothing of llguidance."""


def _ll_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of a Hugging Face fast tokenizer, built once per tokenizer object (~ms to 1 s).

    The tool-call wrapper's tags, where the tokenizer has them as added tokens (the tiny environment tokenizers
    do: ``trajlake.policies.tiny.ENV_SPECIAL_TOKENS``), become ordinary tokens of the text they stand for: the
    grammar's literal ``<tool_call>`` is that text, and llguidance (1.9) takes any added token for a special
    token that matches no text (its mask offered it, then consuming it failed: a Mini SWE rollout under the
    grammar failed on every episode at its first token). :class:`TokenMasker` offers them in its masks."""
    cached = _LL_TOKENIZERS.get(id(tokenizer))
    if cached is None:
        llg = _llguidance()
        try:
            backend = tokenizer.backend_tokenizer
        except AttributeError:
            raise GrammarError("grammar-constrained decoding needs a fast tokenizer") from None
        spec = json.loads(backend.to_str())
        vocab = (spec.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):  # BPE / WordPiece: a wrapper tag becomes an ordinary token of its text
            tags = [a for a in spec.get("added_tokens") or [] if a.get("content") in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)]
            for tag in tags:
                vocab[tag["content"]] = tag["id"]  # ASCII: its byte-level form is itself
            spec["added_tokens"] = [a for a in spec.get("added_tokens") or [] if a not in tags]
        spec["padding"] = spec["truncation"] = None
        try:
            ll = llg.LLTokenizer(json.dumps(spec), eos_token=tokenizer.eos_token_id)
        except ValueError as e:
            raise GrammarError(f"grammar-constrained decoding cannot use this tokenizer: {e}") from None
        cached = _LL_TOKENIZERS[id(tokenizer)] = (tokenizer, ll)
    return cached[1]


class TokenMasker:
    """A matcher over one grammar with one tokenizer: the allowed next tokens, step by step.

    ``vocab_size``: the width of the model's logits; ids the tokenizer does not have are never allowed."""

    def __init__(self, grammar_text: str, tokenizer: Any, vocab_size: int):
        llg = _llguidance()
        self.vocab_size = int(vocab_size)
        self._tok = _ll_tokenizer(tokenizer)
        self._matcher = llg.LLMatcher(self._tok, llg.LLMatcher.grammar_from_lark(grammar_text), log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {self._matcher.get_error()}")
        # the wrapper tags a tokenizer has as single tokens: llguidance's mask, which follows the canonical
        # tokenization of forced text, leaves them out (it spells the tag); offered here wherever it accepts them
        added = {t.content: i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()}
        self._tags = [added[t] for t in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE) if added.get(t, vocab_size) < vocab_size]

    def reset(self) -> None:
        """Back to the start of the grammar (a new policy turn)."""
        self._matcher.reset()

    def packed(self) -> npt.NDArray[np.uint8]:
        """The allowed next tokens as little-endian bits, ``ceil(vocab_size / 8)`` bytes."""
        if self._matcher.is_error():
            raise GrammarError(f"grammar matcher error: {self._matcher.get_error()}")
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        n = (self.vocab_size + 7) // 8
        out = np.zeros(n, np.uint8)
        m = min(n, bits.shape[0])
        out[:m] = bits[:m]
        if self.vocab_size % 8:  # ids past the logits' width: never allowed
            out[-1] &= np.uint8((1 << (self.vocab_size % 8)) - 1)
        for tag in self._tags:
            if self._matcher.validate_tokens([tag]) == 1:
                out[tag // 8] |= np.uint8(1 << (tag % 8))
        return out

    def allowed(self) -> npt.NDArray[np.bool_]:
        """The allowed next tokens as a boolean vector of ``vocab_size``."""
        return unpack_mask(self.packed(), self.vocab_size)

    def consume(self, token: int) -> None:
        """Advance by ``token``; a token the grammar does not allow is an error."""
        if not self._matcher.consume_token(int(token)):
            raise GrammarError(f"token {token} is not allowed by the grammar: {self._matcher.get_error()}")


def unpack_mask(packed: npt.NDArray[np.uint8], vocab_size: int) -> npt.NDArray[np.bool_]:
    """Little-endian packed bits (``[..., ceil(V / 8)]``) -> booleans ``[..., V]``."""
    return np.unpackbits(packed, axis=-1, bitorder="little")[..., :vocab_size].astype(bool)


def replay_masks(masker: TokenMasker, tokens: Sequence[int]) -> npt.NDArray[np.uint8]:
    """The masks a sampler saw before each of ``tokens`` (one policy turn, from the grammar's start):
    ``[len(tokens), ceil(V / 8)]`` packed bits. Raises ``GrammarError`` naming the first token the grammar
    rejects."""
    masker.reset()
    out = np.zeros((len(tokens), (masker.vocab_size + 7) // 8), np.uint8)
    for i, t in enumerate(tokens):
        out[i] = masker.packed()
        if not (out[i, int(t) >> 3] >> (int(t) & 7)) & 1:
            raise GrammarError(f"token {i} of the turn (id {t}) is not allowed by the grammar")
        masker.consume(int(t))
    return out


def forced_flags(packed: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
    """Per row of packed masks: exactly one token allowed (the grammar forced it)."""
    counts = np.unpackbits(packed, axis=-1).sum(axis=-1)
    return np.asarray(counts == 1)


__all__ = ["DEFAULT_MAX_ARG_CHARS", "GRAMMAR_LIBRARY", "GRAMMAR_MODES", "Grammar", "GrammarError", "TokenMasker",
           "forced_flags", "library_version", "replay_masks", "tool_call_grammar", "unpack_mask"]
