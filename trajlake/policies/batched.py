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
padding, each row's own positions. The rows' keys and values live in one preallocated buffer per layer
(``_KVBuffer``) with room on both sides of the window the rows use: a decoding step writes each row's new key and
value into the next column and attends over a view, instead of concatenating every row's whole cache at every
step (a copy of rows x context per layer: ~0.4 ms a layer at 8 rows of 4,000 tokens, a third of that step's
attention); a row joins by one copy of its own cache into a free slot, a row that leaves is replaced by the last
row, and the window is copied into a new buffer only when it outgrows the old one.

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


class _KVBuffer:
    """The batch's keys and values: per layer ``[slots, heads, capacity, head_dim]``, rows ``0..rows-1`` in use.

    Every row uses the columns ``start..end`` (the window), left-padded: row ``i`` holds its ``lengths[i]``
    positions in ``end - lengths[i] .. end`` and ``mask[i]`` is 1 exactly there. Columns outside a row's positions
    hold finite values (zeros, or keys and values of rows that left) that the mask hides.
    """

    def __init__(self, template: list[tuple[Any, Any]], slots: int, capacity: int, end: int):
        self.keys, self.values, self.mask = self._allocate([k for k, _ in template], [v for _, v in template],
                                                           slots, capacity)
        self.rows = 0
        self.start = self.end = end

    @staticmethod
    def _allocate(keys: list[Any], values: list[Any], slots: int, capacity: int) -> tuple[list[Any], list[Any], Any]:
        """Zeroed keys, values (heads, head size, dtype and device of ``keys`` / ``values`` per layer) and mask
        for ``slots`` rows of ``capacity`` columns."""
        torch = _torch()

        def zeros(like: Any) -> Any:
            return torch.zeros(slots, like.shape[1], capacity, like.shape[3], dtype=like.dtype, device=like.device)

        mask = torch.zeros(slots, capacity, dtype=torch.long, device=keys[0].device)
        return [zeros(k) for k in keys], [zeros(v) for v in values], mask

    @property
    def slots(self) -> int:
        return int(self.mask.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.mask.shape[1])

    @property
    def width(self) -> int:
        return self.end - self.start

    def relayout(self, slots: int, left: int, right: int) -> None:
        """Copy the window into a new buffer of ``slots`` rows with at least ``left`` free columns before it and
        ``right`` after it (each side also gets half the window's width again as room to grow)."""
        width = self.width
        room = width // 2 + 16
        start = left + room
        capacity = start + width + right + room
        keys, values, mask = self._allocate(self.keys, self.values, slots, capacity)
        n, a, b = self.rows, self.start, self.end
        for new, old in zip(keys + values, self.keys + self.values, strict=True):
            new[:n, :, start:start + width] = old[:n, :, a:b]
        mask[:n, start:start + width] = self.mask[:n, a:b]
        self.keys, self.values, self.mask = keys, values, mask
        self.start, self.end = start, start + width

    def add(self, layers: list[tuple[Any, Any]], length: int) -> None:
        """A new last row: its own cache (``[1, heads, length, head_dim]`` per layer) copied in, right-aligned."""
        full = self.rows == self.slots
        if full or (length > self.width and self.end - length < 0):
            self.relayout(2 * self.slots if full else self.slots, max(0, length - self.width), 1)
        if length > self.width:  # the window widens to the left: the other rows' new columns are padding
            self.mask[:self.rows, self.end - length:self.start] = 0
            self.start = self.end - length
        i = self.rows
        for buf, (k, v) in zip(zip(self.keys, self.values, strict=True), layers, strict=True):
            buf[0][i, :, self.end - length:self.end] = k[0]
            buf[1][i, :, self.end - length:self.end] = v[0]
        self.mask[i, self.start:self.end - length] = 0
        self.mask[i, self.end - length:self.end] = 1
        self.rows += 1

    def own(self, i: int, length: int) -> list[tuple[Any, Any]]:
        """Row ``i``'s keys and values (its positions only): views into the buffer."""
        a, b = self.end - length, self.end
        return [(k[i:i + 1, :, a:b], v[i:i + 1, :, a:b]) for k, v in zip(self.keys, self.values, strict=True)]

    def remove(self, i: int) -> None:
        """Drop row ``i``: the last row moves into its slot."""
        last = self.rows - 1
        if i != last:
            a, b = self.start, self.end
            for buf in self.keys + self.values:
                buf[i, :, a:b] = buf[last, :, a:b]
            self.mask[i, a:b] = self.mask[last, a:b]
        self.rows -= 1

    def open_column(self) -> Any:
        """Start a decoding step: column ``end`` exists and is unmasked in every row; returns the step's attention
        mask (``[rows, width + 1]``). The step's layers write their keys and values there."""
        if self.end == self.capacity:
            self.relayout(self.slots, 0, 1)
        self.mask[:self.rows, self.end] = 1
        return self.mask[:self.rows, self.start:self.end + 1]

    def close_column(self) -> None:
        """End a decoding step: its column joins the window."""
        self.end += 1

    def fit(self, longest: int) -> None:
        """Narrow the window to the longest row left (columns that are padding in every row drop out)."""
        self.start = self.end - longest


def _buffer_layer_class() -> type:
    """:class:`_BufferLayer`'s class, made on first use (transformers is imported lazily)."""
    global _BUFFER_LAYER
    if _BUFFER_LAYER is None:
        from transformers.cache_utils import DynamicLayer

        class _BufferLayer(DynamicLayer):
            """One layer of a cache over a :class:`_KVBuffer`: what the model's attention calls."""

            is_compileable = False
            is_croppable = False

            def __init__(self, buffer: _KVBuffer, index: int):
                self.buffer = buffer
                self.index = index
                self.is_initialized = True
                self.keys = self.values = None

            def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
                """Write the step's keys and values into column ``end`` (the engine moves ``end`` on after the
                pass) and return the window including them."""
                b, n = self.buffer, int(key_states.shape[-2])
                k, v = b.keys[self.index], b.values[self.index]
                k[:b.rows, :, b.end:b.end + n] = key_states
                v[:b.rows, :, b.end:b.end + n] = value_states
                self.keys, self.values = k[:b.rows, :, b.start:b.end + n], v[:b.rows, :, b.start:b.end + n]
                return self.keys, self.values

            def get_seq_length(self) -> int:
                return self.buffer.width

            def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
                return self.buffer.width + query_length, 0

        _BUFFER_LAYER = _BufferLayer
    return _BUFFER_LAYER


_BUFFER_LAYER: type | None = None


def _buffer_cache(buffer: _KVBuffer) -> Any:
    """A transformers ``DynamicCache`` whose layers read and write ``buffer`` (no copy of the cached states)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = None
    layer = _buffer_layer_class()
    cache.layers = [layer(buffer, i) for i in range(len(buffer.keys))]
    return cache


class BatchEngine:
    """Decodes the turns of concurrent episodes in shared forward passes, on a thread of its own."""

    def __init__(self, model: Any, slots: int = 8):
        self.model = model
        self.slots = slots
        """Rows the buffer is first made for (``batch_episodes``); it grows if more join."""
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._rows: list[_Row] = []
        """The rows decoding now: ``_rows[i]`` is the buffer's row ``i``."""
        self._buffer: _KVBuffer | None = None
        self._cache: Any = None
        """A cache over ``_buffer`` for the model's forward passes."""
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
                    self._drop_batch()

    def _drop_batch(self) -> None:
        self._rows, self._buffer, self._cache = [], None, None

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
        if self._buffer is None:
            room = row.length // 2 + 16  # for longer rows joining (left) and decoding steps (right)
            self._buffer = _KVBuffer(layers, self.slots, row.length + 2 * room, row.length + room)
            self._cache = _buffer_cache(self._buffer)
        self._buffer.add(layers, row.length)
        self._rows.append(row)

    def _step(self) -> None:
        """One forward pass of every row, then one token sampled per row; finished rows leave."""
        torch = _torch()
        rows, buf = self._rows, self._buffer
        assert buf is not None
        device = buf.mask.device
        mask = buf.open_column()
        try:
            logits, _ = forward_rows(
                self.model, torch.tensor([[r.last] for r in rows], device=device), self._cache,
                attention_mask=mask, position_ids=torch.tensor([[r.length] for r in rows], device=device))
        except Exception as e:  # the batch is lost: every row's turn fails
            for r in rows:
                self._finish(r.req, e)
            self._drop_batch()
            return
        buf.close_column()
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
        buf = self._buffer
        assert buf is not None
        for i in leaving:
            r = self._rows[i]
            if i in failed:
                self._finish(r.req, failed[i])
                continue
            # the episode keeps its own cache (a copy of its positions) for its next turn
            own = [(k.clone(), v.clone()) for k, v in buf.own(i, r.length)]
            r.req.episode.cached = _Cached(r.req.context + r.req.turn.ids[:-1], _cache(own))
            self._finish(r.req)
        for i in sorted(leaving, reverse=True):  # the last row moves into each freed slot
            buf.remove(i)
            last = self._rows.pop()
            if i < len(self._rows):
                self._rows[i] = last
        if not self._rows:
            self._drop_batch()
            return
        buf.fit(max(r.length for r in self._rows))

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
    engine = BatchEngine(parent.model, slots=n)
    return [BatchedEpisodePolicy(parent, engine) for _ in range(n)]


__all__ = ["BatchEngine", "BatchedEpisodePolicy", "batched_policies"]
