"""The tool-lookup task set, generated from (family, seed) when first needed (no bundled file: a split's tasks take
well under a second, the 20,400 train tasks ~1-3 s, and the same code always gives the same tasks).

Every instance has a small hidden directory: 4-8 entries drawn from a fixed pool of made-up names (:data:`NAMES`),
each with a 2-digit ``code`` drawn afresh for every instance and a ``partner`` (another entry's name). The values
are random per instance, so nothing about them carries over to a new instance: the agent has to look them up (a
model trained many times over on the same instances can still memorise theirs, see below). Names and codes
come from small pools on purpose: under the environment's tokenizer each is one token, so solving a task means
copying one token per value from an observation into a call (a tiny model learns that within minutes; copying
4-6 letter names and 3-digit codes letter by letter took it thousands of steps).
A template family is a task kind with one phrasing of its statement:

- ``code``: look up the named entry, submit its code (one lookup);
- ``two_hop``: look up the named entry, then its partner (named only in the first observation), submit the
  partner's code; every phrasing of this kind says "partner";
- ``pair``: look up two named entries, submit their codes joined by a dash in the order the statement gives.

Splits are assigned by family, explicitly: per kind ten phrasings are train, one is dev and one is hidden
(:data:`PHRASINGS`; phrasings 6-11 were added after the first four when four train phrasings per kind proved too
few for a tiny model to carry over to the hidden one, so the families' names stayed), so every kind is in every
split and no phrasing crosses splits. With ``train_phrasings`` (an environment argument, 10-36) the train split
also has families of up to twenty extra phrasings per kind (:data:`EXTRA_TRAIN_PHRASINGS`, p12-p31) and then of
up to six late ones (:data:`LATE_TRAIN_PHRASINGS`, p41-p46), listed after the standard ones; dev and hidden are
the same whatever it is. With ``hidden_phrasings`` (1, 2, 4, 5, 8 or 10) the
hidden split's 80 instances per kind are spread over that many phrasings (the standard one and the first of
:data:`EXTRA_HIDDEN_PHRASINGS`, p32-p40), 80/K each; train and dev are the same whatever it is. Sizes are fixed up
front (:data:`INSTANCES_PER_FAMILY`): hidden 240, dev 60, train 20,400. The train split had 68 instances per family (2,040)
until 2026-12-03; it grew to 680 because a tiny model cloned for thousands of steps on ~1,000 of them memorised each
instance's answer instead of learning to copy it (docs/training.md, "Seventh design"). A task is a pure function of
(family, seed), so the first 68 of every family, and every dev and hidden task, are unchanged (golden digests in
tests/test_tool_lookup.py). Names and codes appear in quotes in statements, observations and calls alike, so a
tokenizer splits them the same way wherever they occur.

Fields of a record the agent never sees: ``directory``, ``answer`` and ``plan`` (the oracle's calls).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from functools import cache
from typing import Any

from trajlake.envs import taskset
from trajlake.schemas.vocab import Split

ENV_ID = "tool-lookup"
GENERATOR = "trajlake.envs.tool_lookup.tasks"
CREATED_AT = "2026-12-01T00:00:00+00:00"
MAX_STEPS = 6
"""Step budget of every task: the oracle needs 2 or 3 calls, so a looping model is cut off early."""

KINDS = ("code", "two_hop", "pair")
DIFFICULTY = {"code": "easy", "two_hop": "medium", "pair": "hard"}

# Per kind: (split, statement template). ``{a}`` and ``{b}`` are entry names: for ``pair`` the answer is the code
# of {a}, a dash, the code of {b}, whatever order the phrasing names them in.
PHRASINGS: dict[str, tuple[tuple[Split, str], ...]] = {
    "code": (
        (Split.TRAIN, 'Look up "{a}" and submit its code.'),
        (Split.TRAIN, 'What is the code of "{a}"? Submit it.'),
        (Split.TRAIN, 'Find the entry "{a}" in the directory and submit the code it lists.'),
        (Split.TRAIN, 'Submit the code that the directory gives for "{a}".'),
        (Split.DEV, 'Submit the code stored for "{a}".'),
        (Split.HIDDEN, 'The directory has an entry "{a}". Submit the code of that entry.'),
        (Split.TRAIN, '"{a}" is in the directory. Submit its code.'),
        (Split.TRAIN, 'There is an entry named "{a}". Look it up and submit the code of that entry.'),
        (Split.TRAIN, 'Please submit the code of "{a}".'),
        (Split.TRAIN, 'The answer is the code of "{a}". Look up "{a}" and submit it.'),
        (Split.TRAIN, 'Check the directory for "{a}", then submit the code you find.'),
        (Split.TRAIN, 'Get the code listed for "{a}" and submit that code.'),
    ),
    "two_hop": (
        (Split.TRAIN, 'Look up "{a}", then look up its partner, and submit the code of the partner.'),
        (Split.TRAIN, 'What is the code of the partner of "{a}"? Submit it.'),
        (Split.TRAIN, 'Find who "{a}" lists as partner and submit the code of that partner.'),
        (Split.TRAIN, 'The entry "{a}" names a partner. Look the partner up and submit its code.'),
        (Split.DEV, 'Submit the code of the partner named in the entry "{a}".'),
        (Split.HIDDEN, '"{a}" has a partner in the directory. Submit the code of the partner.'),
        (Split.TRAIN, '"{a}" lists a partner. Submit the code of that partner.'),
        (Split.TRAIN, 'Submit the code of the entry that "{a}" names as its partner.'),
        (Split.TRAIN, 'Look up "{a}" to find its partner, then submit the code of the partner.'),
        (Split.TRAIN, 'The answer is the code of the partner of "{a}". Look up "{a}" first.'),
        (Split.TRAIN, 'Please submit the code of the partner of "{a}".'),
        (Split.TRAIN, 'Which entry is the partner of "{a}"? Submit the code of that partner.'),
    ),
    "pair": (
        (Split.TRAIN, 'Submit the code of "{a}", a dash, then the code of "{b}".'),
        (Split.TRAIN, 'Look up "{a}" and "{b}" and submit their codes joined by a dash, in that order.'),
        (Split.TRAIN, 'Submit the code of "{b}" after the code of "{a}", with a dash between them.'),
        (Split.TRAIN, 'Submit two codes joined by a dash: first the code of "{a}", then the code of "{b}".'),
        (Split.DEV, 'Answer with the code of "{a}" and the code of "{b}", in that order, joined by a dash.'),
        (Split.HIDDEN, 'Look up "{a}" and "{b}". Submit the code of "{a}", then a dash, then the code of "{b}".'),
        (Split.TRAIN, '"{a}" and "{b}" are in the directory. Submit the code of "{a}", a dash, and the code of "{b}".'),
        (Split.TRAIN, 'Look up "{a}", look up "{b}", then submit the two codes with a dash between, "{a}" first.'),
        (Split.TRAIN, 'The answer is the code of "{a}", then a dash, then the code of "{b}".'),
        (Split.TRAIN, 'Please submit the code of "{a}" and the code of "{b}" joined by a dash.'),
        (Split.TRAIN, 'Find "{a}" and "{b}". Submit the code of "{a}" followed by a dash and the code of "{b}".'),
        (Split.TRAIN, 'Join the codes of "{a}" and "{b}" with a dash, the code of "{a}" first, and submit.'),
    ),
}
STANDARD_TRAIN_PHRASINGS = 10
"""Train phrasings per kind of the standard task set (the split's families: ``PHRASINGS``)."""
# Twenty more train phrasings per kind (families p12-p31), opt-in with ``train_phrasings`` (up to 30 per kind;
# the late phrasings below go on to 36):
# written on 2026-12-03 for a probe of whether more phrasings make a tiny model's copying carry over to an unseen
# one. Each keeps the cue every phrasing of its kind has (two_hop: "partner"; pair: two quoted names and "dash";
# code: one quoted name); none is a dev or hidden phrasing.
EXTRA_TRAIN_PHRASINGS: dict[str, tuple[str, ...]] = {
    "code": (
        'Submit the code of "{a}".',
        'Tell me the code of "{a}" by submitting it.',
        'Which code does "{a}" have? Submit that code.',
        'Read the entry "{a}" and submit its code.',
        'The code you need belongs to "{a}". Submit it.',
        'Look "{a}" up in the directory, then submit the code.',
        'Your task: submit the code of the entry "{a}".',
        'I need the code of "{a}". Submit it.',
        'Submit whatever code the directory lists for "{a}".',
        'Open the entry for "{a}" and submit the code shown.',
        'What code is stored under "{a}"? Submit it.',
        'Find the code of "{a}" and submit it as the answer.',
        'Submit the code recorded for the entry named "{a}".',
        'The answer is the code of the entry "{a}".',
        'Give the code of "{a}" as your answer.',
        'Search the directory for "{a}" and submit its code.',
        'Report the code of "{a}" with submit.',
        'Look up the entry "{a}". Its code is the answer.',
        'Answer with the code of "{a}".',
        'Submit the code listed under the name "{a}".',
    ),
    "two_hop": (
        'Submit the code of the partner of "{a}".',
        'Tell me the code of the partner of "{a}" by submitting it.',
        'Which code does the partner of "{a}" have? Submit that code.',
        'Read the entry "{a}", find its partner, and submit the partner\'s code.',
        'The code you need belongs to the partner of "{a}". Submit it.',
        'Look "{a}" up, then look up its partner, then submit the partner\'s code.',
        'Your task: submit the code of the partner of the entry "{a}".',
        'I need the code of the partner of "{a}". Submit it.',
        'Submit whatever code the directory lists for the partner of "{a}".',
        'Open the entry for "{a}", go to its partner, and submit the partner\'s code.',
        'What code is stored under the partner of "{a}"? Submit it.',
        'Find the partner of "{a}" and submit the code of that partner as the answer.',
        'Submit the code recorded for the partner named in the entry "{a}".',
        'The answer is the code of the partner of the entry "{a}".',
        'Give the code of the partner of "{a}" as your answer.',
        'Search the directory for "{a}", then for its partner, and submit the partner\'s code.',
        'Report the code of the partner of "{a}" with submit.',
        'Look up the entry "{a}". The code of its partner is the answer.',
        'Answer with the code of the partner of "{a}".',
        'Submit the code listed for the partner of the name "{a}".',
    ),
    "pair": (
        'Submit the code of "{a}", a dash, and the code of "{b}".',
        'Tell me the codes of "{a}" and "{b}", joined by a dash, by submitting them.',
        'Which codes do "{a}" and "{b}" have? Submit them in that order with a dash between.',
        'Read the entries "{a}" and "{b}" and submit their codes joined by a dash.',
        'The answer is two codes with a dash: the code of "{a}", then the code of "{b}".',
        'Look "{a}" and "{b}" up in the directory, then submit both codes, dash-separated, "{a}" first.',
        'Your task: submit the code of "{a}", a dash, then the code of "{b}".',
        'I need the code of "{a}" and the code of "{b}", joined by a dash. Submit it.',
        'Submit the codes the directory lists for "{a}" and for "{b}", with a dash between them.',
        'Open the entries for "{a}" and "{b}" and submit the two codes joined by a dash.',
        'What codes are stored under "{a}" and "{b}"? Submit them joined by a dash.',
        'Find the codes of "{a}" and "{b}" and submit them with a dash between, in that order.',
        'Submit the code recorded for "{a}", a dash, and the code recorded for "{b}".',
        'Give the code of "{a}", a dash, and the code of "{b}" as your answer.',
        'Search the directory for "{a}" and "{b}" and submit their codes joined by a dash.',
        'Report the code of "{a}" and the code of "{b}" with a dash between, using submit.',
        'Look up "{a}" and "{b}". The answer is their codes joined by a dash.',
        'Answer with the code of "{a}", a dash, then the code of "{b}".',
        'Submit the two codes of "{a}" and "{b}", joined by a dash, "{a}" first.',
        'Join the code of "{a}" and the code of "{b}" with a dash and submit it.',
    ),
}
# Nine more hidden phrasings per kind (families p32-p40), opt-in with ``hidden_phrasings`` (up to 10 per kind):
# written on 2026-12-04, after the twelfth positive-control design, because with one hidden phrasing per kind a
# change in how a model reads that one phrasing moves all 80 of its instances together, which the task-clustered
# interval takes for 80 independent tasks (docs/training.md, "Thirteenth design"). Each keeps the cue of its kind
# and is none of the train or dev phrasings above.
EXTRA_HIDDEN_PHRASINGS: dict[str, tuple[str, ...]] = {
    "code": (
        'Find "{a}" and submit the code it has.',
        'The entry "{a}" holds a code. Submit that code.',
        'Submit the code of the directory entry "{a}".',
        'Use lookup on "{a}" and submit the code you read.',
        'Return the code of "{a}" with submit.',
        'What code does the directory list for "{a}"? Submit it.',
        'Submit the code written in the entry "{a}".',
        'Look for "{a}" in the directory and submit its code.',
        'The code of "{a}" is the answer. Submit it.',
    ),
    "two_hop": (
        'Find "{a}", then its partner, and submit the code the partner has.',
        'The entry "{a}" holds a partner. Submit the code of that partner.',
        'Submit the code of the directory entry that is the partner of "{a}".',
        'Use lookup on "{a}", then on its partner, and submit the code of the partner.',
        'Return the code of the partner of "{a}" with submit.',
        'What code does the directory list for the partner of "{a}"? Submit it.',
        'Submit the code written in the entry of the partner of "{a}".',
        'Look for the partner of "{a}" in the directory and submit its code.',
        'The code of the partner of "{a}" is the answer. Submit it.',
    ),
    "pair": (
        'Find "{a}" and "{b}" and submit their codes with a dash between, "{a}" first.',
        'The entries "{a}" and "{b}" hold codes. Submit them joined by a dash, in that order.',
        'Submit the code of the directory entry "{a}", a dash, then the code of "{b}".',
        'Use lookup on "{a}" and "{b}" and submit the two codes with a dash, "{a}" first.',
        'Return the code of "{a}" and the code of "{b}", joined by a dash, with submit.',
        'What codes does the directory list for "{a}" and "{b}"? Submit them joined by a dash, in that order.',
        'Submit the code written in the entry "{a}", a dash, then the one written in the entry "{b}".',
        'Look for "{a}" and "{b}" in the directory and submit both codes, dash-separated, in that order.',
        'The code of "{a}", a dash and the code of "{b}" is the answer. Submit it.',
    ),
}
# Six more train phrasings per kind (families p41-p46, after the extra hidden ones), opt-in with ``train_phrasings``
# 31-36: written on 2026-12-04 for the fifteenth positive-control design, so that with ten phrasings per kind held
# out for RL, B1 still clones twenty-six (the thirteenth design's families exactly: p0-p3, p6-p27), while RL plays
# p28-p31 and these. Each keeps the cue of its kind and is none of the phrasings above.
LATE_TRAIN_PHRASINGS: dict[str, tuple[str, ...]] = {
    "code": (
        'Fetch the code of "{a}" and submit it.',
        'Submit the code that belongs to "{a}".',
        'Consult the directory about "{a}" and submit its code.',
        'The directory knows the code of "{a}". Submit that code.',
        'Lookup "{a}" first; the code it shows is the answer to submit.',
        'Submit, as the answer, the code of the name "{a}".',
    ),
    "two_hop": (
        'Fetch the code of the partner of "{a}" and submit it.',
        'Submit the code that belongs to the partner of "{a}".',
        'Consult the directory about "{a}" and its partner, and submit the partner\'s code.',
        'The directory knows the partner of "{a}". Submit the code of that partner.',
        'Lookup "{a}" first; the code of its partner is the answer to submit.',
        'Submit, as the answer, the code of the partner of the name "{a}".',
    ),
    "pair": (
        'Fetch the codes of "{a}" and "{b}" and submit them joined by a dash, "{a}" first.',
        'Submit the code that belongs to "{a}", a dash, then the code that belongs to "{b}".',
        'Consult the directory about "{a}" and "{b}" and submit their codes with a dash between, in that order.',
        'The directory knows the codes of "{a}" and "{b}". Submit them joined by a dash, "{a}" first.',
        'Lookup "{a}" and "{b}" first; their codes joined by a dash, in that order, are the answer to submit.',
        'Submit, as the answer, the code of "{a}", a dash, and the code of "{b}".',
    ),
}
STANDARD_HIDDEN_PHRASINGS = 1
"""Hidden phrasings per kind of the standard task set."""
MAX_TRAIN_PHRASINGS = (STANDARD_TRAIN_PHRASINGS + len(EXTRA_TRAIN_PHRASINGS["code"])
                       + len(LATE_TRAIN_PHRASINGS["code"]))
"""The most train phrasings per kind ``train_phrasings`` can ask for (36)."""
HIDDEN_PHRASINGS_CHOICES = (1, 2, 4, 5, 8, 10)
"""What ``hidden_phrasings`` may be: the hidden split keeps its 240 instances (80 per kind), so the phrasings per
kind must divide 80, and there are ten of them."""
INSTANCES_PER_FAMILY: dict[str, int] = {Split.TRAIN: 680, Split.DEV: 20, Split.HIDDEN: 80}
"""Instances of every family of a split: 30 train families x 680, 3 dev x 20, 3 hidden x 80 (with
``hidden_phrasings = K``: 3K hidden families x 80/K, :func:`instances_per_family`)."""
CORPUS_INSTANCES = 68
"""The train instances per family an environment tokenizer's corpus is picked from: the split's size until it grew
(2026-12-03), so that tokenizers built before and after are the same."""

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def family_name(kind: str, phrasing: int) -> str:
    return f"{kind}/p{phrasing}"


def check_train_phrasings(train_phrasings: Any) -> int:
    """``train_phrasings`` if it is a whole number of train phrasings per kind this task set has, else ValueError."""
    if (isinstance(train_phrasings, bool) or not isinstance(train_phrasings, int)
            or not STANDARD_TRAIN_PHRASINGS <= train_phrasings <= MAX_TRAIN_PHRASINGS):
        raise ValueError(f"tool-lookup: train_phrasings must be a whole number from {STANDARD_TRAIN_PHRASINGS} to "
                         f"{MAX_TRAIN_PHRASINGS} (train phrasings per kind), got {train_phrasings!r}")
    return train_phrasings


def check_hidden_phrasings(hidden_phrasings: Any) -> int:
    """``hidden_phrasings`` if it is one of :data:`HIDDEN_PHRASINGS_CHOICES`, else ValueError."""
    if (isinstance(hidden_phrasings, bool) or not isinstance(hidden_phrasings, int)
            or hidden_phrasings not in HIDDEN_PHRASINGS_CHOICES):
        raise ValueError(f"tool-lookup: hidden_phrasings must be one of {', '.join(map(str, HIDDEN_PHRASINGS_CHOICES))}"
                         f" (hidden phrasings per kind; it must divide the 80 hidden instances of a kind), "
                         f"got {hidden_phrasings!r}")
    return hidden_phrasings


_FIRST_EXTRA_TRAIN = len(PHRASINGS["code"])
_FIRST_EXTRA_HIDDEN = _FIRST_EXTRA_TRAIN + len(EXTRA_TRAIN_PHRASINGS["code"])
_FIRST_LATE_TRAIN = _FIRST_EXTRA_HIDDEN + len(EXTRA_HIDDEN_PHRASINGS["code"])


def _templates(kind: str) -> tuple[tuple[Split, str], ...]:
    """Every statement template of ``kind`` by phrasing index: ``PHRASINGS``, then the extra train ones (p12-p31),
    the extra hidden ones (p32-p40) and the late train ones (p41-p46)."""
    return (PHRASINGS[kind] + tuple((Split.TRAIN, t) for t in EXTRA_TRAIN_PHRASINGS[kind])
            + tuple((Split.HIDDEN, t) for t in EXTRA_HIDDEN_PHRASINGS[kind])
            + tuple((Split.TRAIN, t) for t in LATE_TRAIN_PHRASINGS[kind]))


def families(train_phrasings: int = STANDARD_TRAIN_PHRASINGS,
             hidden_phrasings: int = STANDARD_HIDDEN_PHRASINGS) -> dict[str, tuple[str, int, Split]]:
    """Every template family with ``train_phrasings`` train and ``hidden_phrasings`` hidden phrasings per kind:
    name -> (kind, phrasing index, split). The standard ones are ``PHRASINGS``'s; more add the extra ones in
    order (train p12, p13, ... p31, then p41, ... p46; hidden p32, p33, ...)."""
    extra_train = check_train_phrasings(train_phrasings) - STANDARD_TRAIN_PHRASINGS
    extra_hidden = check_hidden_phrasings(hidden_phrasings) - STANDARD_HIDDEN_PHRASINGS
    early = min(extra_train, _FIRST_EXTRA_HIDDEN - _FIRST_EXTRA_TRAIN)
    picked = (*range(_FIRST_EXTRA_TRAIN + early), *range(_FIRST_EXTRA_HIDDEN, _FIRST_EXTRA_HIDDEN + extra_hidden),
              *range(_FIRST_LATE_TRAIN, _FIRST_LATE_TRAIN + extra_train - early))
    return {family_name(kind, i): (kind, i, _templates(kind)[i][0]) for kind in KINDS for i in picked}


@cache
def _every_family() -> dict[str, tuple[str, int, Split]]:
    """:func:`families` with every extra phrasing, made once (shared: do not modify)."""
    return families(MAX_TRAIN_PHRASINGS, max(HIDDEN_PHRASINGS_CHOICES))


def _phrasing(family: str) -> int | None:
    phrasing = family.rpartition("/p")[2]
    return int(phrasing) if phrasing.isdigit() else None


def is_extra_family(family: str) -> bool:
    """A family of the extra train phrasings (p12-p31, and the late ones p41-p46), which only ``train_phrasings``
    > 10 lists."""
    phrasing = _phrasing(family)
    return phrasing is not None and (_FIRST_EXTRA_TRAIN <= phrasing < _FIRST_EXTRA_HIDDEN
                                     or phrasing >= _FIRST_LATE_TRAIN)


def is_late_family(family: str) -> bool:
    """A family of the late train phrasings (p41-p46), which only ``train_phrasings`` > 30 lists."""
    phrasing = _phrasing(family)
    return phrasing is not None and phrasing >= _FIRST_LATE_TRAIN


def is_extra_hidden_family(family: str) -> bool:
    """A family of the extra hidden phrasings (p32-p40), which only ``hidden_phrasings`` > 1 lists."""
    phrasing = _phrasing(family)
    return phrasing is not None and _FIRST_EXTRA_HIDDEN <= phrasing < _FIRST_LATE_TRAIN


def instances_per_family(split: str, hidden_phrasings: int = STANDARD_HIDDEN_PHRASINGS) -> int:
    """Instances of every family of ``split``: the hidden split's 80 per kind are shared by its phrasings."""
    per_family = INSTANCES_PER_FAMILY[split]
    return per_family // check_hidden_phrasings(hidden_phrasings) if split == Split.HIDDEN else per_family


def _name_pool(n: int = 48) -> tuple[str, ...]:
    """``n`` distinct made-up two-syllable names (``Bofa``, ``Kilo``), the same on every machine."""
    rng = random.Random(f"{ENV_ID}:names")
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(2)).capitalize()
        if name not in names:
            names.append(name)
    return tuple(names)


NAMES: tuple[str, ...] = _name_pool()
"""The pool the directories' names come from."""
CODES: tuple[str, ...] = tuple(str(c) for c in range(10, 100))
"""The pool of codes: two digits."""


def make_name(rng: random.Random) -> str:
    """A name of the pool, drawn with ``rng``."""
    return rng.choice(NAMES)


def make_directory(rng: random.Random) -> dict[str, dict[str, str]]:
    """4-8 entries with distinct names and codes; every partner is another entry."""
    size = rng.randint(4, 8)
    names: list[str] = []
    while len(names) < size:
        name = make_name(rng)
        if name not in names:
            names.append(name)
    codes = rng.sample(CODES, len(names))
    return {n: {"code": c, "partner": rng.choice([m for m in names if m != n])} for n, c in zip(names, codes,
                                                                                                    strict=True)}


def entry_line(name: str, entry: Mapping[str, str]) -> str:
    """What ``lookup`` shows of an entry: one JSON object, quoted like the calls."""
    return json.dumps({"name": name, "code": entry["code"], "partner": entry["partner"]})


def make_task(family: str, seed: int) -> dict[str, Any]:
    """The task of ``family`` and ``seed``: a pure function of both."""
    kind, phrasing, split = _every_family()[family]
    rng = random.Random(f"{ENV_ID}:{family}:{seed}")
    directory = make_directory(rng)
    names = list(directory)
    a = rng.choice(names)
    if kind == "code":
        b, order, answer = None, [a], directory[a]["code"]
    elif kind == "two_hop":
        b = directory[a]["partner"]
        order, answer = [a, b], directory[b]["code"]
    else:
        b = rng.choice([n for n in names if n != a])
        order, answer = [a, b], f"{directory[a]['code']}-{directory[b]['code']}"
    plan = [{"tool": "lookup", "args": {"name": n}} for n in order] + [{"tool": "submit", "args": {"answer": answer}}]
    statement = _templates(kind)[phrasing][1].format(a=a, b=b)
    record: dict[str, Any] = {
        "task_id": f"{ENV_ID}/{family}/{seed}", "split": str(split), "family": family, "kind": kind,
        "difficulty": DIFFICULTY[kind], "statement": statement, "seed": seed, "directory": directory,
        "answer": answer, "plan": plan, "has_oracle": True, "created_at": CREATED_AT,
        "budget": {"max_steps": MAX_STEPS, "max_tokens": None, "max_cost": None},
        "provenance": {"generator": GENERATOR, "source": None, "commit": None, "template": family, "seed": seed,
                       "diff_hash": hashlib.sha256(json.dumps(directory, sort_keys=True).encode()).hexdigest()},
    }
    record["task_version"] = taskset.content_version(record)
    return record


@cache
def _split_tasks(split: str, train_phrasings: int = STANDARD_TRAIN_PHRASINGS,
                 hidden_phrasings: int = STANDARD_HIDDEN_PHRASINGS) -> tuple[dict[str, Any], ...]:
    return tuple(make_task(family, seed)
                 for family, (_, _, s) in families(train_phrasings, hidden_phrasings).items() if s == split
                 for seed in range(instances_per_family(split, hidden_phrasings)))


def load_tasks(split: str | None = None, train_phrasings: int = STANDARD_TRAIN_PHRASINGS,
               hidden_phrasings: int = STANDARD_HIDDEN_PHRASINGS) -> list[dict[str, Any]]:
    """The task records of a split (None: every split), in generation order, with ``train_phrasings`` train and
    ``hidden_phrasings`` hidden phrasings per kind; made on first use (a split's tasks are generated only when
    asked for)."""
    check_train_phrasings(train_phrasings)
    check_hidden_phrasings(hidden_phrasings)
    splits = list(INSTANCES_PER_FAMILY) if split is None else [split] if split in INSTANCES_PER_FAMILY else []
    return [dict(t) for s in splits for t in _split_tasks(s, train_phrasings, hidden_phrasings)]


@cache
def tasks_by_id() -> dict[str, dict[str, Any]]:
    """Every task record by id, the extra train and hidden phrasings' included (shared: do not modify)."""
    known = {t["task_id"]: t for s in INSTANCES_PER_FAMILY for t in _split_tasks(s, MAX_TRAIN_PHRASINGS)}
    for hidden_phrasings in HIDDEN_PHRASINGS_CHOICES[1:]:
        known.update((t["task_id"], t) for t in _split_tasks(Split.HIDDEN, hidden_phrasings=hidden_phrasings))
    return known


__all__ = ["CODES", "CORPUS_INSTANCES", "CREATED_AT", "ENV_ID", "EXTRA_HIDDEN_PHRASINGS", "EXTRA_TRAIN_PHRASINGS",
           "GENERATOR", "HIDDEN_PHRASINGS_CHOICES", "INSTANCES_PER_FAMILY", "KINDS", "LATE_TRAIN_PHRASINGS", "MAX_STEPS",
           "MAX_TRAIN_PHRASINGS", "NAMES", "PHRASINGS", "STANDARD_HIDDEN_PHRASINGS", "STANDARD_TRAIN_PHRASINGS",
           "check_hidden_phrasings", "check_train_phrasings", "entry_line", "families", "family_name",
           "instances_per_family", "is_extra_family", "is_extra_hidden_family", "is_late_family", "load_tasks", "make_directory",
           "make_name", "make_task", "tasks_by_id"]
