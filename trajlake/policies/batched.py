"""Batched decoding across episodes: one ``hf:`` model advances the turns of several concurrent episodes in one
forward pass (``--policy-arg batch_episodes=N``).

A rollout worker plays N episodes at once on N threads (``trajlake.rollout.runner``), each with its own
environment and its own :class:`BatchedEpisodePolicy`: an ``HFPolicy`` episode (context pieces, trimming, seed,
generator, grammar matcher) whose model calls go to one shared :class:`BatchEngine`. While some episodes wait for
their environment's step, the engine decodes the others; an episode whose turn ends leaves the batch and the next
request joins it at the next step (continuous batching).

The engine keeps one KV cache per episode. A new turn's context is the previous one plus the generated tokens
plus the new observation, so only the tokens the cache does not hold yet are run (alone: rows of different
lengths); a context that is not an extension of the cached one (``drop_oldest`` trimming) is run whole
(``--policy-arg trim_headroom=T`` trims T tokens deeper, so the turns after a trim extend the cache again). The
decoding steps then run all rows together: their caches left-padded to one length, an attention mask over the
padding, each row's own positions.

Recording stays token-exact: each turn samples through ``hf.TurnDecoder`` exactly as the unbatched loop does:
the same grammar mask, the same ``process_logits`` (mask, temperature, top-p), one draw per token from the
episode's own ``torch.Generator`` seeded with its ``sampling_seed`` (task, env seed, attempt): no generator is
shared, so which episodes share a step never changes what an episode draws. Batched matmuls round differently
from single-row ones (~1e-7 on the tiny model's logits), so the recorded log-probs equal the unbatched ones to
float32 rounding, and the ids are the same unless two candidates are that close.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from trajlake.policies.hf import HFPolicy, TurnDecoder, _torch, forward_rows, forward_step, process_logits
from trajlake.policies.lm import Generation

IDLE_EXIT_S = 1.0
"""Seconds the engine's thread waits for a request before it ends."""


@dataclass
class _Cached:
    """An episode's KV cache between its turns: the ids whose keys and values it holds."""

    ids: list[int]
    cache: Any


@dataclass
class _Request:
    episode: BatchedEpisodePolicy
    context: list[int]
    turn: TurnDecoder
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class _Row:
    req: _Request
    length: int
    """Tokens in the row's cache (its next position)."""
    last: int
    """The sampled token to run next."""


def _layers(cache: Any) -> list[tuple[Any, Any]]:
    """(keys, values) per layer of a ``DynamicCache``, ``[rows, heads, length, head_dim]`` each."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def _cache(layers: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(layers)


class BatchEngine:
    """Decodes the turns of concurrent episodes in shared forward passes, on a thread of its own."""

    def __init__(self, model: Any):
        self.model = model
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._rows: list[_Row] = []
        self._cache: Any = None
        self._mask: Any = None
        """``[rows, length]`` 1 on real positions, 0 on left padding."""
        self.steps = 0
        """Batched decoding steps run (each one forward pass)."""
        self.row_steps = 0
        """Tokens those steps decoded (``row_steps / steps`` is the mean batch)."""
        self.turns = 0
        """Turns started (each one prefill of its context's new tokens)."""
        self.turns_cached = 0
        """Turns whose context extended the episode's cache, so only the new tokens ran (the others ran whole:
        first turns and trimmed contexts)."""
        self.prefill_tokens = 0
        """Context tokens run by those prefills."""

    def decode(self, episode: BatchedEpisodePolicy, context: list[int], turn: TurnDecoder) -> None:
        """Run ``turn`` to its end on ``context`` (blocks the calling episode's thread)."""
        req = _Request(episode, context, turn)
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="trajlake-batch-engine", daemon=True)
                self._thread.start()
            self._queue.put(req)
        req.done.wait()
        if req.error is not None:
            raise req.error

    def _idle(self) -> _Request | None:
        """The next request; None after a second without one, when the thread has ended (a later request
        starts another: no thread outlives its rollout holding the model)."""
        try:
            return self._queue.get(timeout=IDLE_EXIT_S)
        except queue.Empty:
            with self._start_lock:  # a request put from here on starts a new thread
                if self._queue.empty():
                    self._thread = None
                    return None
            return self._queue.get_nowait()

    # -- the engine's thread -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        torch = _torch()
        with torch.inference_mode():  # grad mode is per thread
            while True:
                new: list[_Request] = []
                if not self._rows:
                    first = self._idle()
                    if first is None:
                        return
                    new.append(first)
                while True:
                    try:
                        new.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                try:
                    for req in new:
                        self._start(req)
                    if self._rows:
                        self._step()
                except Exception as e:  # never leave an episode waiting on a turn that cannot end
                    for req in [r.req for r in self._rows] + new:
                        if not req.done.is_set():
                            self._finish(req, e)
                    self._rows, self._cache, self._mask = [], None, None

    def _start(self, req: _Request) -> None:
        """Run the request's new context tokens (alone) and sample its first token; it joins the batch unless
        that ended its turn."""
        torch = _torch()
        ep, ctx = req.episode, req.context
        try:
            cached, ep.cached = ep.cached, None
            device = self.model.device
            self.turns += 1
            if cached is not None and len(cached.ids) < len(ctx) and ctx[:len(cached.ids)] == cached.ids:
                self.turns_cached += 1
                self.prefill_tokens += len(ctx) - len(cached.ids)
                logits, cache = forward_step(self.model, torch.tensor([ctx[len(cached.ids):]], device=device),
                                             cached.cache)
            else:  # the first turn, or a trimmed context: run it whole
                self.prefill_tokens += len(ctx)
                logits, cache = forward_step(self.model, torch.tensor([ctx], device=device))
            tok = req.turn.sample(logits)
        except Exception as e:
            self._finish(req, e)
            return
        if req.turn.done:
            ep.cached = _Cached(list(ctx), cache)
            self._finish(req)
        else:
            self._join(_Row(req, len(ctx), tok), _layers(cache))

    def _join(self, row: _Row, layers: list[tuple[Any, Any]]) -> None:
        torch = _torch()
        pad = torch.nn.functional.pad
        ones = torch.ones(1, row.length, dtype=torch.long, device=layers[0][0].device)
        if not self._rows:
            self._rows, self._mask, self._cache = [row], ones, _cache(layers)
            return
        batch = _layers(self._cache)
        width = self._mask.shape[1]
        if row.length < width:  # left-pad the row to the batch
            layers = [(pad(k, (0, 0, width - row.length, 0)), pad(v, (0, 0, width - row.length, 0)))
                      for k, v in layers]
            ones = pad(ones, (width - row.length, 0))
        elif row.length > width:  # left-pad the batch to the row
            batch = [(pad(k, (0, 0, row.length - width, 0)), pad(v, (0, 0, row.length - width, 0)))
                     for k, v in batch]
            self._mask = pad(self._mask, (row.length - width, 0))
        self._cache = _cache([(torch.cat([bk, k]), torch.cat([bv, v])) for (bk, bv), (k, v) in zip(batch, layers,
                                                                                                strict=True)])
        self._mask = torch.cat([self._mask, ones])
        self._rows.append(row)

    def _step(self) -> None:
        """One forward pass of every row, then one token sampled per row; finished rows leave."""
        torch = _torch()
        rows = self._rows
        device = self._mask.device
        mask = torch.cat([self._mask, torch.ones(len(rows), 1, dtype=torch.long, device=device)], dim=1)
        try:
            logits, self._cache = forward_rows(
                self.model, torch.tensor([[r.last] for r in rows], device=device), self._cache,
                attention_mask=mask, position_ids=torch.tensor([[r.length] for r in rows], device=device))
        except Exception as e:  # the batch is lost: every row's turn fails
            for r in rows:
                self._finish(r.req, e)
            self._rows, self._cache, self._mask = [], None, None
            return
        self._mask = mask
        self.steps += 1
        self.row_steps += len(rows)
        failed: dict[int, Exception] = {}
        allowed: list[Any] = []
        for i, r in enumerate(rows):
            r.length += 1
            try:
                allowed.append(r.req.turn.allowed(device))
            except Exception as e:
                failed[i] = e
                allowed.append(None)
        stacked = None
        if any(a is not None for a in allowed):
            full = torch.ones(logits.shape[-1], dtype=torch.bool, device=device)
            stacked = torch.stack([full if a is None else a for a in allowed])
        s = rows[0].req.turn.settings
        logp = process_logits(logits, s.temperature, s.top_p, stacked)
        for i, r in enumerate(rows):
            if i not in failed:
                try:
                    r.last = r.req.turn.take(logp[i], allowed[i])
                except Exception as e:
                    failed[i] = e
        leaving = [i for i, r in enumerate(rows) if r.req.turn.done or i in failed]
        if leaving:
            self._leave(leaving, failed)

    def _leave(self, leaving: list[int], failed: dict[int, Exception]) -> None:
        torch = _torch()
        layers = _layers(self._cache)
        width = self._mask.shape[1]
        for i in leaving:
            r = self._rows[i]
            if i in failed:
                self._finish(r.req, failed[i])
                continue
            # the episode keeps its own cache (padding cut off) for its next turn
            own = [(k[i:i + 1, :, width - r.length:].clone(), v[i:i + 1, :, width - r.length:].clone())
                   for k, v in layers]
            r.req.episode.cached = _Cached(r.req.context + r.req.turn.ids[:-1], _cache(own))
            self._finish(r.req)
        gone = set(leaving)
        keep = [i for i in range(len(self._rows)) if i not in gone]
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, None
            return
        index = torch.tensor(keep, device=self._mask.device)
        mask = self._mask.index_select(0, index)
        first = int(mask.any(dim=0).nonzero()[0])  # columns that are padding in every row left: cut them
        self._mask = mask[:, first:]
        self._cache = _cache([(k.index_select(0, index)[:, :, first:], v.index_select(0, index)[:, :, first:])
                              for k, v in layers])

    @staticmethod
    def _finish(req: _Request, error: BaseException | None = None) -> None:
        req.error = error
        req.done.set()


class BatchedEpisodePolicy(HFPolicy):
    """One of the episodes a worker plays at once: an ``HFPolicy`` episode sharing its parent's model and
    tokenizer, whose turns the shared :class:`BatchEngine` decodes."""

    def __init__(self, parent: HFPolicy, engine: BatchEngine):
        super().__init__(parent.policy_version, parent.path, parent.settings, shared=parent)
        self.engine = engine
        self.cached: _Cached | None = None
        """This episode's KV cache between its turns (the engine's)."""

    def reset(self, task: Any, seed: int) -> None:
        super().reset(task, seed)
        self.cached = None

    def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        assert self.renderer is not None
        turn = TurnDecoder(self.settings, self.renderer.eos_id, self._generator, self.masker(), max_new_tokens)
        self.engine.decode(self, context_ids, turn)
        return turn.generation(self.renderer, len(context_ids))


def batched_policies(parent: HFPolicy, n: int) -> list[BatchedEpisodePolicy]:
    """``n`` episode policies over ``parent``'s model, decoded together by one engine."""
    engine = BatchEngine(parent.model)
    return [BatchedEpisodePolicy(parent, engine) for _ in range(n)]


__all__ = ["BatchEngine", "BatchedEpisodePolicy", "batched_policies"]
