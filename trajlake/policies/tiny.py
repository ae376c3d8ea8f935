"""Build a tiny, randomly initialised chat model and tokenizer into a folder (tests, benchmarks, configs).

``python -m trajlake.policies.tiny OUT_DIR`` writes a 2-layer Llama (hidden size 64) and a byte-level BPE
tokenizer trained with ``tokenizers`` on local text (Mini SWE's bundled library sources and the agent prompt),
with a ChatML chat template. Nothing is downloaded. The weights are random: the model's replies are noise, which
is what the recording machinery is tested on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> Iterator[str]:
    from trajlake.envs.mini_swe.env import TOOL_DOCS
    from trajlake.render.chat import system_prompt

    yield system_prompt(TOOL_DOCS)
    import trajlake.envs.mini_swe as mini_swe

    libraries = Path(mini_swe.__file__).parent / "libraries"
    for p in sorted(libraries.rglob("*.py")):
        yield p.read_text(encoding="utf-8")


def build_tiny_model(out: str | Path, *, vocab_size: int = 512, hidden_size: int = 64, layers: int = 2,
                     max_positions: int = 4096, seed: int = 0) -> Path:
    """Write the tiny model and its tokenizer to ``out``; returns the folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML_TEMPLATE
    tok.save_pretrained(str(out))

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", help="folder to write the model and tokenizer to")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args(argv)
    path = build_tiny_model(args.out, hidden_size=args.hidden_size, layers=args.layers, seed=args.seed)
    print(f"wrote a tiny model and tokenizer to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
