"""Grammar-constrained decoding with honest log-probs (issue 24, section 2): the tool-call grammar, the token masks,
sampling under the grammar in hf:, the learner's replay of the masks and its masked log-probs, the run's config
and eval's constrained marker.

The model is the tiny randomly initialised Llama with a tokenizer trained in the test (nothing downloaded)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("llguidance")

import torch
from conftest import make_episode
from trajlake.envs import Budget, task_view_fn
from trajlake.envs.mini_swe.env import TOOL_DOCS, MiniSWEEnv

from trajlake import LakeWriter, open_lake
from trajlake.errors import GrammarError, TrainDataError, TrajlakeError
from trajlake.policies import check_policy_spec, lm_run_config
from trajlake.policies.hf import HFPolicy, score_tokens
from trajlake.policies.settings import LMSettings
from trajlake.render.exactness import model_contexts
from trajlake.render.grammar import (
    Grammar,
    TokenMasker,
    forced_flags,
    library_version,
    replay_masks,
    tool_call_grammar,
    unpack_mask,
)
from trajlake.render.toolcall import format_call, parse_tool_call
from trajlake.rollout.runner import play_episode
from trajlake.train import math as tm
from trajlake.train.data import BatchGrammarMasks, LakeTrajectories, Selection, pack, pad_collate

TASK = "mini-swe/durations/drop_branch/0"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trajlake.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tok(tiny: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny))


def _accepts(masker: TokenMasker, tok: Any, text: str) -> bool:
    """Whether the grammar allows ``text`` token by token and then only the end-of-turn token."""
    masker.reset()
    for t in tok(text, add_special_tokens=False)["input_ids"]:
        if not masker.allowed()[t]:
            return False
        masker.consume(t)
    return bool(np.flatnonzero(masker.allowed()).tolist() == [tok.eos_token_id])


# -- the grammar --------------------------------------------------------------------------------------------------

def test_grammar_text_is_deterministic_and_names_itself() -> None:
    g = tool_call_grammar(TOOL_DOCS, 64)
    again = tool_call_grammar(dict(reversed(list(TOOL_DOCS.items()))), 64)
    assert g == again and g.text == again.text  # the tool docs' order does not matter
    assert g.sha256 == "sha256:" + hashlib.sha256(g.text.encode()).hexdigest()
    assert tool_call_grammar(TOOL_DOCS, 65).sha256 != g.sha256  # the cap is part of the grammar
    assert g.library == "llguidance" and g.version == library_version() == metadata.version("llguidance")
    cfg = g.to_config()
    assert set(cfg) == {"text", "sha256", "library", "version"} and Grammar.from_config(cfg) == g
    with pytest.raises(GrammarError, match="does not match its text"):
        Grammar.from_config({**cfg, "text": cfg["text"] + " "})
    with pytest.raises(GrammarError, match="at least one tool"):
        tool_call_grammar({})
    # every tool is an alternative with its own argument names, sorted
    for name, doc in TOOL_DOCS.items():
        line = next(x for x in g.text.splitlines() if f'\\"{name}\\"' in x)
        assert [a for a in sorted(doc["args"]) if f'\\"{a}\\"' in line] == sorted(doc["args"])


def test_grammar_accepts_exactly_format_call_then_eos(tok: Any) -> None:
    g = tool_call_grammar(TOOL_DOCS, 24)
    m = TokenMasker(g.text, tok, len(tok))
    ok = [format_call("submit", {}), format_call("list_files", {}), format_call("give_up", {}),
          format_call("read_file", {"path": "src/durations.py"}),
          format_call("edit", {"new": 'say "hi"\n\tbye \\ é', "old": "x = 1", "path": "src/a.py"}),
          format_call("search", {"path": ".", "pattern": "def " + "x" * 20})]
    for text in ok:
        assert _accepts(m, tok, text), text
        assert parse_tool_call(text).ok
    bad = ['<tool_call>{"name": "edit", "arguments": {"path": "a", "old": "b", "new": "c"}}</tool_call>',  # order
           '<tool_call>{"name": "read_file", "arguments": {}}</tool_call>',  # missing argument
           '<tool_call>{"name": "submit", "arguments": {"force": "yes"}}</tool_call>',  # extra argument
           '<tool_call>{"name": "delete", "arguments": {}}</tool_call>',  # unknown tool
           '<tool_call>{"name":"submit","arguments":{}}</tool_call>',  # other separators
           '<tool_call>{"name": "read_file", "arguments": {"path": 3}}</tool_call>',  # not a string
           format_call("read_file", {"path": "y" * 25}),  # over the cap
           'ok: ' + format_call("submit", {}),  # text before the call
           '{"tool": "submit", "args": {}}']  # the parser's synonyms are not what the grammar writes
    for text in bad:
        assert not _accepts(m, tok, text), text


def test_mini_webs_ask_user_and_give_up_are_calls_of_its_grammar(tok: Any) -> None:
    """The grammar comes from the tool docs: a constrained policy can ask the user (with a question) and end."""
    from trajlake.envs.mini_web.env import TOOL_DOCS as WEB

    m = TokenMasker(tool_call_grammar(WEB, 40).text, tok, len(tok))
    assert _accepts(m, tok, format_call("ask_user", {"question": "Which saved address is meant?"}))
    assert _accepts(m, tok, format_call("give_up", {}))
    assert not _accepts(m, tok, '<tool_call>{"name": "ask_user", "arguments": {}}</tool_call>')  # no question


def test_integer_arguments_when_the_tool_doc_declares_them(tok: Any) -> None:
    docs = {"click": {"description": "press", "args": {"id": {"type": "integer", "description": "element id"}}}}
    m = TokenMasker(tool_call_grammar(docs).text, tok, len(tok))
    assert _accepts(m, tok, format_call("click", {"id": 12}))
    assert not _accepts(m, tok, format_call("click", {"id": "12"}))


def test_a_run_with_memory_records_the_grammar_its_policy_samples_under(tok: Any) -> None:
    from trajlake.envs.tool_lookup.env import ToolLookupEnv

    env = ToolLookupEnv("dev", memory=True)
    task = env.list_tasks()[0]
    listed = env.task_view(task["task_id"], task["task_version"]).tools  # what an hf: policy builds its grammar from
    env.close()
    recorded = lm_run_config("hf:model", {"grammar": "tools"}, ToolLookupEnv.tool_docs_for({"memory": True}))
    assert recorded["grammar"] == tool_call_grammar(listed).to_config()  # what the trainer replays the masks with
    m = TokenMasker(recorded["grammar"]["text"], tok, len(tok))
    for text in (format_call("memory_write", {"key": "plan", "text": 'look up "Bofa", then its partner'}),
                 format_call("memory_read", {"key": "plan"}), format_call("memory_list", {}),
                 format_call("lookup", {"name": "Bofa"})):
        assert _accepts(m, tok, text), text
    without = TokenMasker(tool_call_grammar(ToolLookupEnv.tool_docs_for({})).text, tok, len(tok))
    assert not _accepts(without, tok, format_call("memory_list", {}))  # runs without memory: the grammar as before


def test_masks_force_the_wrapper_and_the_end_of_turn(tok: Any) -> None:
    g = tool_call_grammar(TOOL_DOCS)
    m = TokenMasker(g.text, tok, len(tok) + 5)  # logits wider than the tokenizer: the extra ids never allowed
    ids = tok(format_call("submit", {}), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    packed = replay_masks(m, ids)
    assert packed.shape == (len(ids), (len(tok) + 5 + 7) // 8)
    allowed = unpack_mask(packed, len(tok) + 5)
    assert not allowed[:, len(tok):].any()
    forced = forced_flags(packed)
    assert forced[0] and forced[-1]  # "<" of <tool_call>, then only the end-of-turn token after the call
    assert allowed[-1].nonzero()[0].tolist() == [tok.eos_token_id]
    assert 0 < int(forced.sum()) < len(ids)  # the tool name is a choice
    with pytest.raises(GrammarError, match="not allowed"):
        replay_masks(m, [tok.eos_token_id])


def test_a_tokenizer_with_the_wrapper_as_its_own_tokens_samples_under_the_grammar(tmp_path: Path) -> None:
    """The environment tokenizers (``build_tiny_model(env=...)``) have ``<tool_call>`` and ``</tool_call>`` as
    added tokens. llguidance took them for special tokens matching no text: its first mask offered the tag, then
    consuming it failed, and every episode of a Mini SWE rollout under the grammar failed at its first token.
    Now the tag tokens are in the masks wherever the grammar accepts their text, the oracle's calls as this
    tokenizer writes them are accepted token by token, and a model plays whole episodes under the grammar with
    recorded forced tokens that replaying the masks finds again."""
    from trajlake.envs.tool_lookup.env import TOOL_DOCS as LOOKUP_DOCS
    from trajlake.envs.tool_lookup.env import ToolLookupEnv
    from transformers import AutoTokenizer

    from trajlake.policies.tiny import build_tiny_model
    from trajlake.render.toolcall import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

    folder = build_tiny_model(tmp_path / "model", env="tool-lookup", corpus_tasks=8, max_positions=1024)
    tok = AutoTokenizer.from_pretrained(str(folder))
    open_id, close_id = tok.convert_tokens_to_ids([TOOL_CALL_OPEN, TOOL_CALL_CLOSE])
    ids = tok(format_call("submit", {"answer": "17"}), add_special_tokens=False)["input_ids"]
    assert (ids[0], ids[-1]) == (open_id, close_id)  # the tags as single tokens, which the mask must offer
    m = TokenMasker(tool_call_grammar(LOOKUP_DOCS).text, tok, len(tok))
    assert m.allowed()[open_id]
    for call in (format_call("lookup", {"name": "Lesi"}), format_call("submit", {"answer": "17"}),
                 format_call("submit", {"answer": "a <tool_call> in an argument"})):
        assert _accepts(m, tok, call), call
    env = ToolLookupEnv("train", budget=Budget(max_steps=3))
    policy = HFPolicy("v1", str(folder), LMSettings(temperature=1.0, max_new_tokens=48, grammar="tools",
                                                    grammar_max_chars=8, seed=0))
    try:
        task = env.list_tasks()[0]
        rec = play_episode(env, policy, run_id="t", task_id=task["task_id"], task_version=None, seed=0,
                           split="train")
    finally:
        env.close()
    assert policy.grammar is not None
    sampled = TokenMasker(policy.grammar.text, tok, len(tok))
    turns = [t for t in rec.turns if t["actor"] == "policy"]
    assert turns and all(t["token_ids"][0] in (open_id, tok.convert_tokens_to_ids("<")) for t in turns)
    for t in turns:
        assert parse_tool_call(tok.decode(t["token_ids"][:-1])).ok
        forced = forced_flags(replay_masks(sampled, t["token_ids"]))
        assert (forced == (np.asarray(t["loss_mask"]) == 0)).all()


def test_policy_args_for_the_grammar_are_checked(tiny: Path) -> None:
    assert LMSettings.from_args({"grammar": "tools", "grammar_max_chars": "32"}).grammar_max_chars == 32
    for bad in ({"grammar": "json"}, {"grammar_max_chars": "0"}, {"server_logprobs": "logits"}):
        with pytest.raises(TrajlakeError, match="--policy-arg"):
            LMSettings.from_args(bad)
    with pytest.raises(TrajlakeError, match="single-turn answers with a diff"):
        check_policy_spec("mini-swe", f"single-turn:hf:{tiny}", {"grammar": "tools"})
    cfg = lm_run_config(f"hf:{tiny}", {"grammar": "tools", "grammar_max_chars": "32"}, TOOL_DOCS)
    assert cfg == {"grammar": tool_call_grammar(TOOL_DOCS, 32).to_config()}
    assert lm_run_config(f"hf:{tiny}", {}, TOOL_DOCS) == {}
    assert lm_run_config("openai:m", {"base_url": "http://x"}, TOOL_DOCS) == {"server_logprobs": "raw"}
    assert lm_run_config("oracle", {}, TOOL_DOCS) == {}


# -- the learner's masked log-probs ---------------------------------------------------------------------------------

def test_masked_token_logprobs_is_the_masked_renormalised_distribution() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 19, generator=g, requires_grad=True)
    ids = torch.randint(0, 19, (2, 6), generator=g)
    positions = torch.tensor([[0, 2], [1, 1], [1, 5], [0, 4]])
    allowed = torch.rand(4, 19, generator=g) < 0.4
    allowed[torch.arange(4), ids[positions[:, 0], positions[:, 1]]] = True
    allowed[3] = False
    allowed[3, ids[0, 4]] = True  # a forced token: the only one allowed
    for temperature in (1.0, 0.7, 0.0):
        got = tm.masked_token_logprobs(logits, ids, temperature, positions, allowed).detach()
        free = tm.token_logprobs(logits, ids, temperature).detach()
        scale = temperature if temperature > 0 else 1.0
        for (b, t), ok in zip(positions.tolist(), allowed, strict=True):
            x = (logits[b, t - 1].detach() / scale).masked_fill(~ok, float("-inf"))
            assert float(got[b, t]) == pytest.approx(float(torch.log_softmax(x, -1)[ids[b, t]]), abs=1e-6)
        rest = torch.ones(2, 6, dtype=torch.bool)
        rest[positions[:, 0], positions[:, 1]] = False
        assert torch.equal(got[rest], free[rest])  # other positions as token_logprobs
        assert float(got[0, 4]) == 0.0  # forced: log-prob 0 ...
    packed = torch.from_numpy(np.packbits(allowed.numpy(), axis=-1, bitorder="little"))
    assert torch.equal(tm.masked_token_logprobs(logits, ids, 0.7, positions, packed),
                       tm.masked_token_logprobs(logits, ids, 0.7, positions, allowed))
    got = tm.masked_token_logprobs(logits, ids, 0.7, positions, packed)
    (grad,) = torch.autograd.grad(got[0, 4], logits, retain_graph=True)
    assert float(grad.abs().sum()) == 0.0  # ... under every parameter value: no gradient
    (grad,) = torch.autograd.grad(got[1, 1], logits)
    assert float(grad[1, 0].abs().sum()) > 0 and torch.isfinite(grad).all()
    assert not bool(grad[1, 0][~allowed[1]].any())  # tokens outside the allowed set get no gradient
    outside = allowed.clone()
    outside[1, ids[1, 1]] = False
    with pytest.raises(ValueError, match="outside its allowed set"):
        tm.masked_token_logprobs(logits, ids, 1.0, positions, outside)
    with pytest.raises(ValueError, match=">= 1"):
        tm.masked_token_logprobs(logits, ids, 1.0, torch.tensor([[0, 0]]), allowed[:1])


# -- sampling under the grammar, then the learner's path ------------------------------------------------------------

def _without_submit(env: Any) -> Any:
    """The environment's task views without ``submit``: the random model cannot end the episode early."""
    view = task_view_fn(env)

    def fn(*a: Any, **k: Any) -> Any:
        v = view(*a, **k)
        return dataclasses.replace(v, tools={n: d for n, d in v.tools.items() if n != "submit"})
    return fn


def _write(lake: Any, rec: Any, run_id: str, grammar: Grammar | None) -> None:
    config = {"policy": "hf:tiny", **({"grammar": grammar.to_config()} if grammar else {})}
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_runs([{"run_id": run_id, "created_at": rec.episode["started_at"], "label": run_id,
                       "config": json.dumps(config), "policy_name": "hf:tiny", "policy_version": "v1"}])
        w.write_batch([rec.episode], rec.turns).raise_if_rejected()  # validated: mask 0 inside a policy turn


def test_constrained_sampling_records_honest_logprobs_and_the_learner_rebuilds_them(tiny: Path,
                                                                                       tmp_path: Path) -> None:
    env = MiniSWEEnv("dev", workdir=tmp_path / "ws", budget=Budget(max_steps=2))
    settings = LMSettings(temperature=1.0, max_new_tokens=160, grammar="tools", grammar_max_chars=8, seed=0)
    policy = HFPolicy("v1", str(tiny), settings)
    greedy = HFPolicy("v1", str(tiny), dataclasses.replace(settings, temperature=0.0))
    try:
        rec = play_episode(env, policy, run_id="g", task_id=TASK, task_version=None, seed=0, split="dev",
                           task_view=_without_submit(env))
        rec0 = play_episode(env, greedy, run_id="g0", task_id=TASK, task_version=None, seed=0, split="dev",
                            task_view=_without_submit(env))
    finally:
        env.close()
    grammar = policy.grammar
    assert grammar is not None and grammar == tool_call_grammar({n: d for n, d in TOOL_DOCS.items() if n != "submit"}, 8)
    pol = [t for t in rec.turns if t["actor"] == "policy"]
    assert len(pol) == 2
    for t in pol + [t for t in rec0.turns if t["actor"] == "policy"]:
        assert parse_tool_call(policy.renderer.decode(t["token_ids"][:-1])).ok  # type: ignore[union-attr]
        assert t["token_ids"][-1] == policy.renderer.eos_id  # type: ignore[union-attr]
        mask, lps = np.asarray(t["loss_mask"]), np.asarray(t["behavior_logprobs"])
        assert 0 < mask.sum() < mask.size  # forced tokens are kept, with loss_mask 0 ...
        assert (lps[mask == 0] == 0.0).all() and (lps <= 0).all()  # ... and log-prob 0
    assert rec.episode["n_policy_tokens"] == sum(int(np.sum(t["loss_mask"])) for t in pol)
    # The sampler's log-probs are those of the masked, renormalised distribution: a re-score with the replayed
    # masks gives them back (temperature 1, and greedy: the unscaled masked distribution).
    for r, temperature in ((rec, 1.0), (rec0, 0.0)):
        masker = TokenMasker(grammar.text, policy.renderer.tokenizer, policy.n_vocab)  # type: ignore[union-attr]
        for c in model_contexts(r.turns):
            allowed = unpack_mask(replay_masks(masker, c.generated_ids), policy.n_vocab)
            again = score_tokens(policy.model, c.context_ids, c.generated_ids, temperature, 1.0, allowed)
            np.testing.assert_allclose(again, c.behavior_logprobs, atol=1e-5)

    # The learner's path: the lake, the reader's samples, a batch, the rebuilt masks, the masked log-probs.
    lake = open_lake(tmp_path / "lake", create=True)
    _write(lake, rec, "g", grammar)
    ds = LakeTrajectories(lake, Selection(runs=["g"]), tokenizer=tiny)
    assert ds.run_grammars == {"g": grammar.sha256} and ds.grammars == {grammar.sha256: grammar.text}
    (sample,) = list(ds)
    assert sample["grammar"] == grammar.sha256
    gen = np.concatenate([np.full(len(t["token_ids"]), k if t["actor"] == "policy" else -1) for k, t in
                          zip(np.cumsum([t["actor"] == "policy" for t in rec.turns]) - 1, rec.turns, strict=True)])
    assert sample["generated_turn"].tolist() == gen.tolist()  # forced tokens included
    batch = pad_collate([sample])
    masks = BatchGrammarMasks(ds.tokenizer, ds.grammars, policy.n_vocab)(batch)
    assert masks is not None and masks.positions.shape[0] == int(batch["loss_mask"].sum())
    with torch.no_grad():
        logits = policy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    learner = tm.masked_token_logprobs(logits, batch["input_ids"], 1.0, masks.positions, masks.allowed)
    loss = batch["loss_mask"].bool()
    behaviour = batch["behavior_logprobs"][loss]
    assert float((learner[loss] - behaviour).abs().max()) < 1e-5
    # The training loop's own path: its batches carry the replayed masks, and its learner's log-probs (and the
    # proximal copy's, decoupled PPO's pi_prox) apply them: ratio 1 before any update.
    from trajlake.train.loop import Dist, Learner, _batches

    trainer = Learner(tiny, "cpu", Dist())
    (loop_batch,) = next(_batches(ds, 1, trainer))  # one micro-batch: the whole batch
    assert loop_batch["grammar_masks"] is not None
    with torch.no_grad():
        assert float((trainer.forward(loop_batch, 1.0)["logp"][loss] - behaviour).abs().max()) < 1e-5
    trainer.freeze_proximal()
    assert float((trainer.proximal_logprobs(loop_batch, 1.0)[loss] - behaviour).abs().max()) < 1e-5
    # Against unconstrained logits the same tokens are far less likely: the ratio would saturate.
    free = tm.token_logprobs(logits, batch["input_ids"], 1.0)
    gap = float((behaviour - free[loss]).sum())
    assert gap > 20.0, gap  # nats over the episode's sampled tokens (exp(20) ~ 5e8)
    # A packed batch rebuilds the same masks.
    (row,) = list(pack([sample], max_tokens=int(sample["input_ids"].shape[0]) + 3))
    pmasks = BatchGrammarMasks(ds.tokenizer, ds.grammars, policy.n_vocab)(row)
    assert pmasks is not None and torch.equal(pmasks.allowed, masks.allowed)
    # A loss mask that disagrees with the grammar (a forced token marked as sampled) is refused.
    forced_at = int(np.flatnonzero((sample["generated_turn"] >= 0) & (sample["loss_mask"] == 0))[0])
    bad = dict(batch)
    bad["loss_mask"] = batch["loss_mask"].clone()
    bad["loss_mask"][0, forced_at] = 1
    with pytest.raises(TrainDataError, match="the masks differ from the sampler's"):
        BatchGrammarMasks(ds.tokenizer, ds.grammars, policy.n_vocab)(bad)
    # An unconstrained batch has no masks.
    assert BatchGrammarMasks(ds.tokenizer, ds.grammars, policy.n_vocab)({**batch, "grammar": [None]}) is None


def test_runner_records_the_grammar_in_runs_config(tiny: Path, tmp_path: Path) -> None:
    from trajlake.query import connect
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    cfg = RolloutConfig(lake=str(tmp_path / "lake"), run_id="c", env="mini-swe", policy=f"hf:{tiny}", split="dev",
                        seeds=(0,), task_ids=(TASK,), workers=1, env_kwargs={"budget": {"max_steps": 1}},
                        policy_args={"grammar": "tools", "grammar_max_chars": "8", "max_new_tokens": "200"})
    assert run_rollout(cfg).written == 1
    config = json.loads(connect(cfg.lake).execute("select config from runs where run_id = 'c'").fetchone()[0])
    assert config["grammar"] == tool_call_grammar(TOOL_DOCS, 8).to_config()
    status = connect(cfg.lake).execute("select status from turns where run_id = 'c' and actor = 'policy'"
                                       ).fetchone()[0]
    assert status != "MODEL_INVALID_ACTION"


# -- eval: constrained and free runs are never compared silently ---------------------------------------------------

def test_eval_marks_constrained_runs_and_warns_when_comparing_with_a_free_one(tmp_path: Path) -> None:
    from trajlake.evaluators.render import render_markdown
    from trajlake.evaluators.report import build_report

    lake = open_lake(tmp_path / "lake", create=True)
    grammar = tool_call_grammar(TOOL_DOCS, 8, version="test")
    rows, turns = [], []
    for run in ("free", "constrained", "constrained2"):
        for i in range(3):
            ep, tu = make_episode(f"{run}-{i}", run_id=run, task_id=f"task-{i}", group_id=f"task-{i}:v1:0:1")
            rows.append(ep)
            turns += tu
    runs = [{"run_id": r, "created_at": rows[0]["started_at"], "label": r, "policy_name": "p",
             "config": json.dumps({"grammar": grammar.to_config()} if r.startswith("constrained") else {})}
            for r in ("free", "constrained", "constrained2")]
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_runs(runs)
        w.write_batch(rows, turns).raise_if_rejected()
    rep = build_report(lake, baseline="free", candidate="constrained")
    assert rep["runs"]["constrained"]["constrained"] is True and rep["runs"]["free"]["constrained"] is False
    assert rep["runs"]["constrained"]["grammar_sha256"] == grammar.sha256
    cmp = rep["comparison"]
    assert cmp["constrained"] == {"baseline": False, "candidate": True}
    assert len(cmp["warnings"]) == 1 and "invalid-action rates" in cmp["warnings"][0]
    text = render_markdown(rep)
    assert "WARNING: the candidate (constrained) decoded under a tool-call grammar" in text
    assert f"constrained (grammar {grammar.sha256[:15]})" in text and "| free |" in text.replace("  ", " ")
    same = build_report(lake, baseline="constrained", candidate="constrained2")["comparison"]
    assert same["constrained"] == {"baseline": True, "candidate": True} and same["warnings"] == []
