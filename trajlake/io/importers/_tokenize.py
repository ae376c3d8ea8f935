"""``--tokenizer``: per-turn token ids from a local Hugging Face ``tokenizer.json`` (the ``tokenizers`` package).

Each turn's text (``render_turn``) is tokenized on its own, without special tokens; in a turn that is not the
policy's (tool results, pages, user and environment text: untrusted), text that spells one of the tokenizer's
special or added tokens is encoded as ordinary text, never as that token (``trajlake.render.chat.untrusted_cuts``).
The prefix-consistency
check then tokenizes the whole conversation (the turns' texts concatenated) and requires it to equal the
concatenation of the per-turn token lists; otherwise per-turn ids would not be what a trainer sees for the
conversation, and the episode is rejected naming the first turn where the two differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trajlake.errors import Issue, PrefixError, TrajlakeError, ValidationError
from trajlake.lake.store import file_sha256
from trajlake.lake.values import max_token_bytes, vocab_suffix
from trajlake.render.chat import encode_between, joined_cuts, longest_first, untrusted_cuts


def resolve_tokenizer_path(path: Path) -> Path:
    """``--tokenizer PATH``: a ``tokenizer.json`` file, or a folder holding one (a Hugging Face model or tokenizer
    folder, as ``hf:`` and ``openai: tokenizer=`` take). Anything else is one ValidationError saying what was
    expected."""
    if path.is_dir():
        inside = path / "tokenizer.json"
        if inside.is_file():
            return inside
        # a folder with only a slow tokenizer (vocab.json + merges.txt, tokenizer.model) cannot be read by the
        # `tokenizers` package: say what the folder lacks rather than that it does not exist
        raise ValidationError([Issue("turns", None, None, "token_ids",
                                     "--tokenizer: the folder has no tokenizer.json (expected a tokenizer.json file, "
                                     "or a Hugging Face model or tokenizer folder holding one)", str(path))])
    if not path.exists():
        raise ValidationError([Issue("turns", None, None, "token_ids",
                                     "--tokenizer: no such file or folder (expected a tokenizer.json file, or a "
                                     "folder holding one)", str(path))])
    if not path.is_file():
        raise ValidationError([Issue("turns", None, None, "token_ids",
                                     "--tokenizer: not a regular file (expected a tokenizer.json file, or a folder "
                                     "holding one)", str(path))])
    return path


class TurnTokenizer:
    """A loaded tokenizer with a content-derived id (``hf-tokenizers:<sha256 of tokenizer.json>[:16]``, then its
    vocabulary size and longest token, ``trajlake.lake.values.vocab_suffix``)."""

    def __init__(self, path: Path):
        """``path``: a ``tokenizer.json``, or a folder holding one."""
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise TrajlakeError("--tokenizer needs the `tokenizers` package: pip install tokenizers") from e
        path = resolve_tokenizer_path(Path(path))
        try:
            self._tok: Any = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception subclasses for malformed files
            raise ValidationError([Issue("turns", None, None, "token_ids",
                                         f"cannot load tokenizer.json: {str(e)[:200]}", str(path))]) from None
        n = self._tok.get_vocab_size(with_added_tokens=True)
        decoded = self._tok.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
        self.tokenizer_id = "hf-tokenizers:" + file_sha256(str(path))[:16] + vocab_suffix(n, max_token_bytes(decoded))
        self.reserved = longest_first(str(t.content) for t in self._tok.get_added_tokens_decoder().values())
        """The texts of the tokenizer's special and added tokens: untrusted turns never encode to them."""

    def _encode(self, text: str, cuts: Sequence[int]) -> list[int]:
        return encode_between(lambda piece: list(self._tok.encode(piece, add_special_tokens=False).ids), text, cuts)

    def encode_turns(self, texts: list[str], untrusted: Sequence[bool] | None = None) -> list[list[int]]:
        """Token ids of each text; raises PrefixError when the whole conversation tokenizes differently.
        ``untrusted[i]``: turn i's text yields no special or added token (default: every turn trusted)."""
        if not texts:
            return []
        flags = list(untrusted) if untrusted is not None else [False] * len(texts)
        cuts = [untrusted_cuts(t, 0, len(t), self.reserved) if flag else [] for t, flag in zip(texts, flags,
                                                                                              strict=True)]
        # one batch for the turns (the Rust core encodes it in parallel); a turn with cuts is encoded piece by piece
        per: list[list[int]] = [self._encode(t, c) if c else list(e.ids) for t, c, e in
                                zip(texts, cuts, self._tok.encode_batch(texts, add_special_tokens=False), strict=True)]
        whole: list[int] = self._encode("".join(texts), joined_cuts(texts, cuts))
        flat = [i for ids in per for i in ids]
        if whole == flat:
            return per
        k = next((i for i, (a, b) in enumerate(zip(whole, flat, strict=False)) if a != b), min(len(whole), len(flat)))
        acc = 0
        turn = len(per) - 1
        for j, ids in enumerate(per):
            if k < acc + len(ids):
                turn = j
                break
            acc += len(ids)
        got = whole[k] if k < len(whole) else "end"
        want = flat[k] if k < len(flat) else "end"
        raise PrefixError(turn, f"prefix-consistency check failed: tokenizing the whole conversation gives token "
                                f"{got} at position {k} but the per-turn tokenization gives {want} (turn {turn} "
                                f"merges with its neighbour); use a tokenizer whose pre-tokenizer splits at turn "
                                f"boundaries, or import without --tokenizer")
