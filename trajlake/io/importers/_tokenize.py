"""``--tokenizer``: per-turn token ids from a local Hugging Face ``tokenizer.json`` (the ``tokenizers`` package).

Each turn's text (``render_turn``) is tokenized on its own, without special tokens. The prefix-consistency
check then tokenizes the whole conversation (the turns' texts concatenated) and requires it to equal the
concatenation of the per-turn token lists; otherwise per-turn ids would not be what a trainer sees for the
conversation, and the episode is rejected naming the first turn where the two differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trajlake.errors import Issue, PrefixError, TrajlakeError, ValidationError
from trajlake.lake.store import file_sha256


class TurnTokenizer:
    """A loaded tokenizer with a content-derived id (``hf-tokenizers:<sha256 of tokenizer.json>[:16]``)."""

    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise TrajlakeError("--tokenizer needs the `tokenizers` package: pip install tokenizers") from e
        path = Path(path)
        if not path.is_file():
            raise ValidationError([Issue("turns", None, None, "token_ids", "tokenizer file does not exist",
                                         str(path))])
        try:
            self._tok: Any = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception subclasses for malformed files
            raise ValidationError([Issue("turns", None, None, "token_ids",
                                         f"cannot load tokenizer.json: {str(e)[:200]}", str(path))]) from None
        self.tokenizer_id = "hf-tokenizers:" + file_sha256(str(path))[:16]

    def encode_turns(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text; raises PrefixError when the whole conversation tokenizes differently."""
        if not texts:
            return []
        per: list[list[int]] = [list(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=False)]
        whole: list[int] = list(self._tok.encode("".join(texts), add_special_tokens=False).ids)
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
