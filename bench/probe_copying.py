"""When does the tiny model learn to copy on tool-lookup? (docs/tool_lookup.md, "Fourth probe")

    python bench/probe_copying.py --seed 0 [--heads 8 --kv 8] [--rl-phrasings 2] [--steps 1500]

A direct supervised loop (outside the trainer, same data shape: the oracle's episodes of B1's tasks in the positive
control, rendered as an hf: policy sees them, loss on the policy's tokens only; AdamW, batches of 16 drawn at
random, linear warm-up, gradient clip 1) on a fresh tiny Llama, printing the mean loss every 50 steps and, every
``--eval-every`` steps, per kind the share of hidden-split oracle episodes whose every policy token is the model's
top-1 (teacher-forced). The copying transition shows as the loss leaving its ~0.45-0.75-nat plateau. The tokenizer
folder is built once (``--model``); the rendered data is cached beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import experiment_positive_control as pc

Sample = tuple[str, Any, Any]  # task id, input ids, loss mask (torch tensors)


def oracle_episodes(env_id: str, split: str, task_ids: list[str] | None = None) -> list[tuple[str, str, list[str]]]:
    """(task id, system prompt, [statement, call, observation, call, observation, ...]) of the oracle's episodes."""
    from trajlake.envs import make

    from trajlake.render.chat import system_prompt
    from trajlake.render.toolcall import format_call, parse_tool_call

    env = make(env_id, split=split)
    oracle = env.policies()["oracle"]("probe")
    tasks = env.list_tasks()
    if task_ids is not None:
        by_id = {t["task_id"]: t for t in tasks}
        tasks = [by_id[t] for t in task_ids]
    system = system_prompt(type(env).tool_docs)
    out = []
    for task in tasks:
        oracle.reset(env.task_view(task["task_id"], task["task_version"], oracle=True), 0)
        r = env.reset(0, task_id=task["task_id"], task_version=task["task_version"])
        texts, observation, done = [r.observation], r.observation, False
        while not done:
            action = oracle.act(observation).action
            parsed = parse_tool_call(action)
            call = format_call(str(parsed.tool), json.loads(parsed.action)["args"])
            res = env.step(action)
            observation, done = res.observation, res.done
            texts += [call, observation]
        out.append((task["task_id"], system, texts))
    env.close()
    return out


def tokenize(tok: Any, episodes: list[tuple[str, str, list[str]]]) -> list[Sample]:
    import torch

    from trajlake.render.chat import ChatRenderer

    r = ChatRenderer(tok, "probe")
    data = []
    for task_id, system, texts in episodes:
        ids = r.initial(system, texts[0])
        mask = [0] * len(ids)
        for call, observation in zip(texts[1::2], texts[2::2], strict=True):
            c = [*r.encode(call), r.eos_id]
            o = r.observation(observation, True)
            ids += c + o
            mask += [1] * len(c) + [0] * len(o)
        data.append((task_id, torch.tensor(ids), torch.tensor(mask)))
    return data


def batchify(items: list[Sample]) -> tuple[Any, Any, Any]:
    import torch

    length = max(len(x[1]) for x in items)
    ids = torch.zeros(len(items), length, dtype=torch.long)
    mask = torch.zeros(len(items), length)
    attention = torch.zeros(len(items), length, dtype=torch.long)
    for i, (_, a, b) in enumerate(items):
        ids[i, :len(a)] = a
        mask[i, :len(b)] = b.float()
        attention[i, :len(a)] = 1
    return ids, mask, attention


def token_nll(model: Any, ids: Any, attention: Any) -> tuple[Any, Any]:
    """Per next-token position: the negative log-likelihood and whether the model's top-1 is the token."""
    import torch

    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    target = ids[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                                            reduction="none").view_as(target)
    return nll, logits.argmax(-1) == target


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv", type=int, default=2, help="key/value heads")
    ap.add_argument("--rl-phrasings", type=int, default=2, help="train phrasings per kind kept out of B1's data")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--tag", default="")
    ap.add_argument("--model", default="bench/out/probe_copying/base",
                    help="tokenizer folder (built with the experiment's tokenizer settings when missing)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    setup = pc.Setup(rl_phrasings=a.rl_phrasings)
    model_dir = Path(a.model)
    if not (model_dir / "tokenizer.json").is_file():
        from trajlake.policies.tiny import build_tiny_model

        build_tiny_model(model_dir, vocab_size=setup.vocab_size, max_positions=setup.max_positions, env=setup.env,
                         corpus_tasks=setup.corpus_tasks)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    cache = model_dir.parent / f"data_rp{a.rl_phrasings}.pt"
    if cache.exists():
        train, hidden = torch.load(cache)
    else:
        b1_tasks = pc.task_pools(setup)[0][:setup.sft_tasks]
        train = tokenize(tok, oracle_episodes(setup.env, "train", b1_tasks))
        hidden = tokenize(tok, oracle_episodes(setup.env, "hidden"))
        torch.save((train, hidden), cache)
    torch.manual_seed(a.seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=a.hidden, intermediate_size=2 * a.hidden,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv,
                         max_position_embeddings=setup.max_positions, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    rng = random.Random(a.seed)
    start, losses = time.time(), []
    for step in range(1, a.steps + 1):
        for group in opt.param_groups:
            group["lr"] = a.lr * min(1.0, step / (a.warmup + 1))
        ids, mask, attention = batchify(rng.sample(train, a.batch))
        nll, _ = token_nll(model, ids, attention)
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            print(f"{a.tag} seed {a.seed} step {step} loss {sum(losses[-50:]) / 50:.3f} t {time.time() - start:.0f}s",
                  flush=True)
        if step % a.eval_every == 0 or step == a.steps:
            model.eval()
            exact: dict[str, list[bool]] = {}
            with torch.no_grad():
                for i in range(0, len(hidden), 40):
                    chunk = hidden[i:i + 40]
                    ids, mask, attention = batchify(chunk)
                    _, top1 = token_nll(model, ids, attention)
                    for j, (task_id, _, _) in enumerate(chunk):
                        exact.setdefault(task_id.split("/")[1], []).append(bool((top1[j] | (mask[j, 1:] == 0)).all()))
            model.train()
            print(f"{a.tag} seed {a.seed} step {step} EVAL hidden exact "
                  + " ".join(f"{k} {sum(v) / len(v):.2f}" for k, v in sorted(exact.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
