"""Write a model folder with the architecture and tokenizer of ``SRC`` and random weights (seed 0) to ``DST``.

    python bench/device/random_like.py SRC DST

For throughput figures on a machine the real weights cannot reach: tokens/s, MFU and memory depend on the
architecture and the sequence lengths, not on the weights' values (a random model rarely samples end-of-turn, so
its decoded rows run to their token limit). SRC needs only config.json and the tokenizer files."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

KEEP = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
        "special_tokens_map.json")


def main(src: str, dst: str) -> None:
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(src, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(dst)
    for name in KEEP:
        if (Path(src) / name).is_file():
            shutil.copy(Path(src) / name, Path(dst) / name)
    n = sum(p.numel() for p in model.parameters())
    print(f"{dst}: {config.model_type}, {n / 1e6:.1f} M parameters, random weights (seed 0), tokenizer of {src}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
