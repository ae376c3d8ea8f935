"""The trainer's lake reader: a torch ``IterableDataset`` of trajectories streamed from the lake's own tables.

``select_episodes`` picks episodes (runs, splits, environment versions, policy versions, success, terminated only,
maximum policy lag, maximum staleness, a trajectory TTL by time and environment version, a time-travel
pin) from the small ``episodes`` table (``selection.py``). ``LakeTrajectories``
shards that selection across data-parallel ranks and dataloader workers, streams the ``turns`` table's files in
Arrow record batches (only the needed columns, only the shard's episode ids, row groups skipped by their
``episode_id`` statistics), assembles an episode once all its ``n_turns`` rows are in, and yields one sample per
episode (or per policy turn for trimmed contexts) as numpy arrays (``stream.py``). ``pad_collate`` and ``pack``
make batches of them (``collate.py``); ``BatchGrammarMasks`` rebuilds the grammar masks of a batch's constrained
policy turns for the learner's re-score (``masks.py``).

Token ids are used exactly as recorded (token in, token out) when the episode was recorded with the trainer's
tokenizer and chat template; otherwise (text-only or byte-token episodes, another model's tokenizer) the episode
is re-rendered from ``raw_content`` exactly as an ``hf:`` policy would have seen it, and the re-rendered pieces must
concatenate to the tokenization of the whole text (the prefix check; ``samples.py``). See docs/training.md,
"Reading the lake".
"""

from trajlake.train.data.collate import pack, pad_collate
from trajlake.train.data.masks import BatchGrammarMasks, GrammarMasks
from trajlake.train.data.samples import RetokenizationError, TrainDataError
from trajlake.train.data.selection import EPISODE_COLUMNS, EnvAge, Selection, select_episodes, staleness_of
from trajlake.train.data.stream import SAMPLE_KEYS, LakeTrajectories

__all__ = [
    "EPISODE_COLUMNS",
    "SAMPLE_KEYS",
    "BatchGrammarMasks",
    "EnvAge",
    "GrammarMasks",
    "LakeTrajectories",
    "RetokenizationError",
    "Selection",
    "TrainDataError",
    "pack",
    "pad_collate",
    "select_episodes",
    "staleness_of",
]
