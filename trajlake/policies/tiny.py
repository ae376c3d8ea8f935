"""Build a tiny, randomly initialised chat model and tokenizer into a folder (tests, benchmarks, configs).

``python -m trajlake.policies.tiny OUT_DIR`` writes a 2-layer Llama (hidden size 64) and a byte-level BPE
tokenizer trained with ``tokenizers`` on local text (Mini SWE's bundled library sources and the agent prompt),
with a ChatML chat template whose assistant turns (text, tool calls as ``format_call`` writes them, end token) are
marked with ``{% generation %}``, so ``return_assistant_tokens_mask`` and TRL's ``SFTTrainer(assistant_only_loss=True)``
train on exactly them. Nothing is downloaded. The weights are random: the model's replies are noise, which
is what the recording machinery is tested on.

``--env NAME`` trains the tokenizer on that environment's rendered trajectories instead: the oracle played on a
sample of its train-split tasks through the environment contract (registry ``make``, the environment's
``oracle`` policy, ``task_view(..., oracle=True)``), each episode rendered in the ChatML layout exactly as an
``hf:`` policy (and the trainer's re-rendering) sees it: the system prompt with the environment's tools, the
observations as ``<tool_response>`` messages and the calls as ``format_call`` text. ``<tool_call>`` and
``</tool_call>`` are then added tokens (one token each), and the pre-tokenizer lets merges cross spaces and
punctuation (so a call's fixed JSON wrapper becomes a few tokens) while capitalised words, digit runs and
newlines stay pieces of their own (a name or a number is split the same way wherever it occurs; a piece that
starts after a newline never merges with it). The command prints the oracle's token counts under the new
tokenizer (per tool, and per whole episode with the system prompt).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from trajlake.errors import TrajlakeError
from trajlake.render.chat import TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN, ChatRenderer, system_prompt
from trajlake.render.toolcall import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, format_call, parse_tool_call

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    # {% generation %} marks what the model produces (its text, its calls, its end token): transformers'
    # return_assistant_tokens_mask and so TRL's SFTTrainer(assistant_only_loss=True) train on exactly that
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] or '' }}"
    "{% for call in message.tool_calls or [] %}"
    "{% set args = call.function.arguments %}"
    # a call as format_call writes it (Hermes <tool_call> JSON); arguments as the OpenAI API's JSON text or an object
    "{{ '<tool_call>{\"name\": ' + (call.function.name | tojson) + ', \"arguments\": ' "
    "+ (args if args is string else (args | tojson)) + '}</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ENV_SPECIAL_TOKENS = [*SPECIAL_TOKENS, TOOL_CALL_OPEN, TOOL_CALL_CLOSE]
"""The special tokens of a tokenizer trained on an environment's trajectories: the tool-call wrapper is one token
each."""
ENV_PIECES = r"\p{Lu}\p{Ll}*|\p{N}+|\n"
"""What the environment tokenizer's pre-tokenizer isolates (capitalised words, digit runs, newlines); the text
between them is one piece, in which merges may cross spaces and punctuation."""
CORPUS_TASKS = 64
"""Train tasks whose oracle episodes make an environment tokenizer's corpus by default."""
VOCAB_SIZE = 512
"""The tiny tokenizer's vocabulary size by default, special tokens included."""
HEADS = 4
"""The tiny model's attention heads by default."""
KV_HEADS = 2
"""Its key/value heads by default (grouped-query attention: ``HEADS / KV_HEADS`` query heads share one)."""

Message = dict[str, str]


def _corpus() -> Iterator[str]:
    from trajlake.envs.mini_swe.env import TOOL_DOCS

    yield system_prompt(TOOL_DOCS)
    import trajlake.envs.mini_swe as mini_swe

    libraries = Path(mini_swe.__file__).parent / "libraries"
    for p in sorted(libraries.rglob("*.py")):
        yield p.read_text(encoding="utf-8")


def chatml(messages: Sequence[Mapping[str, str]]) -> str:
    """``messages`` rendered with :data:`CHATML_TEMPLATE` (no generation prompt), without a tokenizer."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def oracle_episodes(env: str, n_tasks: int = CORPUS_TASKS, **env_args: Any) -> list[list[Message]]:
    """The oracle's episodes on up to ``n_tasks`` train-split tasks of ``env`` (spread evenly over the
    environment's ``tokenizer_corpus_tasks``), each as the chat messages an ``hf:`` policy sees: system prompt,
    first observation, then per step the call (``format_call`` of the parsed action) and the observation
    (``<tool_response>`` message)."""
    from trajlake.envs import make

    environment = make(env, split="train", **env_args)
    try:
        oracle = environment.policies().get("oracle")
        if oracle is None:
            raise TrajlakeError(f"environment {env!r} has no oracle policy: it cannot give a tokenizer corpus")
        policy = oracle("tokenizer-corpus")
        tasks = environment.tokenizer_corpus_tasks()
        picked = tasks[::max(1, len(tasks) // max(1, n_tasks))][:n_tasks]
        system = system_prompt(type(environment).tool_docs_for(env_args))
        episodes: list[list[Message]] = []
        for task in picked:
            policy.reset(environment.task_view(task["task_id"], task["task_version"], oracle=True), 0)
            r = environment.reset(0, task_id=task["task_id"], task_version=task["task_version"])
            messages = [{"role": "system", "content": system}, {"role": "user", "content": r.observation}]
            observation, done = r.observation, False
            while not done:
                action = policy.act(observation).action
                parsed = parse_tool_call(action)
                call = format_call(parsed.tool, json.loads(parsed.action)["args"]) if parsed.ok and parsed.tool \
                    else action
                res = environment.step(action)
                observation, done = res.observation, res.done
                messages += [{"role": "assistant", "content": call},
                             {"role": "user", "content": TOOL_RESPONSE_OPEN + observation + TOOL_RESPONSE_CLOSE}]
            episodes.append(messages)
        return episodes
    finally:
        environment.close()


def _env_corpus(episodes: Sequence[Sequence[Message]]) -> Iterator[str]:
    """The rendered episodes as the texts between special tokens (the BPE trainer never sees those)."""
    specials = re.compile("|".join(re.escape(s) for s in ENV_SPECIAL_TOKENS))
    for messages in episodes:
        yield from (part for part in specials.split(chatml(messages)) if part)


def build_tiny_model(out: str | Path, *, vocab_size: int = VOCAB_SIZE, hidden_size: int = 64, layers: int = 2,
                     heads: int = HEADS, kv_heads: int = KV_HEADS, max_positions: int = 4096, seed: int = 0,
                     env: str | None = None,
                     corpus_tasks: int = CORPUS_TASKS, episodes: Sequence[Sequence[Message]] | None = None) -> Path:
    """Write the tiny model and its tokenizer to ``out``; returns the folder. ``env``: train the tokenizer on that
    environment's rendered oracle episodes (``corpus_tasks`` train tasks, or ``episodes`` when already played by
    :func:`oracle_episodes`) instead of Mini SWE's sources. ``heads`` attention heads share ``kv_heads`` key/value
    heads (``hidden_size`` divisible by ``heads``, ``heads`` by ``kv_heads``)."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if hidden_size % heads or heads % kv_heads:
        raise TrajlakeError(f"tiny model: hidden_size {hidden_size} must be divisible by heads {heads}, and heads "
                            f"by kv_heads {kv_heads}")
    out = Path(out)
    bpe = Tokenizer(models.BPE())
    if env is None:
        specials, corpus = SPECIAL_TOKENS, _corpus()
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        played = episodes if episodes is not None else oracle_episodes(env, corpus_tasks)
        specials, corpus = ENV_SPECIAL_TOKENS, _env_corpus(played)
        bpe.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(ENV_PIECES), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    out.mkdir(parents=True, exist_ok=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML_TEMPLATE
    tok.save_pretrained(str(out))

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out))
    return out


def oracle_token_counts(tokenizer: Any, episodes: Sequence[Sequence[Message]]) -> dict[str, list[int]]:
    """Tokens of the oracle's episodes as an ``hf:`` policy's context holds them (``ChatRenderer`` pieces): per
    tool, the tokens of each call including its end-of-turn token; ``episode``, the whole episode with the
    system prompt."""
    renderer = ChatRenderer(tokenizer, "tiny")
    counts: dict[str, list[int]] = {}
    for messages in episodes:
        total = len(renderer.initial(messages[0]["content"], messages[1]["content"]))
        for call, response in zip(messages[2::2], messages[3::2], strict=True):
            parsed = parse_tool_call(call["content"])
            n = len(renderer.encode(call["content"])) + 1
            counts.setdefault(parsed.tool or "<unparsed>", []).append(n)
            observation = response["content"].removeprefix(TOOL_RESPONSE_OPEN).removesuffix(TOOL_RESPONSE_CLOSE)
            total += n + len(renderer.observation(observation, True))
        counts.setdefault("episode", []).append(total)
    return counts


def _summary(counts: Mapping[str, Sequence[int]]) -> str:
    return "\n".join(f"  {k}: min {min(v)}, mean {sum(v) / len(v):.1f}, max {max(v)} tokens ({len(v)})"
                     for k, v in sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", help="folder to write the model and tokenizer to")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=HEADS, help=f"attention heads (default {HEADS})")
    ap.add_argument("--kv-heads", type=int, default=KV_HEADS, help=f"key/value heads (default {KV_HEADS})")
    ap.add_argument("--max-positions", type=int, default=4096)
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="BPE vocabulary size, special tokens included")
    ap.add_argument("--env", help="train the tokenizer on this registered environment's rendered oracle episodes")
    ap.add_argument("--corpus-tasks", type=int, default=CORPUS_TASKS,
                    help=f"train-split tasks the oracle plays for --env's corpus (default {CORPUS_TASKS})")
    args = ap.parse_args(argv)
    episodes = oracle_episodes(args.env, args.corpus_tasks) if args.env is not None else None
    path = build_tiny_model(args.out, vocab_size=args.vocab_size, hidden_size=args.hidden_size, layers=args.layers,
                            heads=args.heads, kv_heads=args.kv_heads, max_positions=args.max_positions, seed=args.seed, env=args.env, episodes=episodes)
    print(f"wrote a tiny model and tokenizer to {path}")
    if args.env is not None and episodes is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        counts = oracle_token_counts(tok, episodes)
        print(f"the oracle's {args.env} episodes under this tokenizer (calls include the end-of-turn token):\n"
              + _summary(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
