"""Underspecified Mini Web tasks, and the simulated user who knows what they leave out.

An underspecified variant's statement omits one detail the user has in mind: which saved address, which agent,
which order, which category. The detail is kept in the record's hidden ``intent`` (never shown to the agent, never
in the lake's ``tasks`` table). The statement fits every value of ``intent["candidates"]`` and the site shows them
all, while the task's checks (those of the task the variant was made from) accept only the intended one, so a
policy that guesses without asking succeeds by chance (one in ``len(candidates)`` for a uniform guess). The
``ask_user`` action reaches :class:`SimulatedUser`, who answers from the intent alone.

Variants are made from the bundled tasks, like the attacked variants of the injection suite: one per task of a
family with a rule in :data:`RULES`, a pure function of the task record. A variant keeps the task's split (a
template family never crosses splits), seed, checks, budget and vectors; its id is ``<task id>/ask/<slot>``, its
provenance names this module as generator and the task it came from as source, and its oracle asks first
(``{"op": "ask", "question": ...}``), then plays the task's solution.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trajlake.envs.taskset import content_version

from .data import AGENTS, CATEGORIES, seed_rows

GENERATOR = "trajlake.envs.mini_web.underspecified"
VARIANT_MARK = "/ask/"
"""Between a task's id and the omitted slot in the id of its underspecified variant (``<task>/ask/<slot>``)."""
DONT_KNOW = "I don't know."
"""The simulated user's answer to a question about anything but the omitted detail (and on a task that omits
nothing): the user knows what they want, not what the site holds, so a question never reveals an answer the
grader checks beyond the intent."""
ADDRESS_LABELS = ("Home", "Office", "Old office")
"""The saved addresses of every seeded account (``data.seed_rows``): what "one of your saved addresses" can be."""

Steps = list[dict[str, Any]]


@dataclass(frozen=True)
class SimulatedUser:
    """The person behind the agent, answering ``ask_user`` from a task's hidden ``intent`` (None: the task omits
    nothing). Deterministic: the answer is a function of the intent and the question. A question that names the
    omitted detail's topic (a word or phrase of ``intent["topics"]``, whole words, any case) gets
    ``intent["reply"]``; any other question gets :data:`DONT_KNOW`."""

    intent: Mapping[str, Any] | None

    def answer(self, question: str) -> str:
        if not self.intent:
            return DONT_KNOW
        words = " ".join(re.findall(r"[a-z0-9]+", question.lower()))
        for topic in self.intent["topics"]:
            phrase = " ".join(re.findall(r"[a-z0-9]+", str(topic).lower()))
            if phrase and re.search(rf"\b{re.escape(phrase)}\b", words):
                return str(self.intent["reply"])
        return DONT_KNOW


@dataclass(frozen=True)
class Rule:
    """How one template family is made underspecified."""

    slot: str
    """What the statement leaves out (the variant id's last part)."""
    pattern: re.Pattern[str]
    """Matches the task's statement; group ``value`` is the detail to omit."""
    statement: Callable[[re.Match[str]], str]
    """The variant's statement, from the match (without the detail)."""
    candidates: Callable[[Mapping[str, Any]], list[str]]
    """Every value the variant's statement fits (the intended one among them)."""
    topics: tuple[str, ...]
    """Words or phrases of a question about the slot (the candidates are added)."""
    reply: str
    """The user's answer, ``{value}`` replaced by the intended value."""
    question: str
    """What the oracle asks."""
    steps: Callable[[Mapping[str, Any], str], Steps]
    """The task's solution for one candidate value (the oracle plays the intended one; a guessing policy another)."""


def _replace(steps: Sequence[Mapping[str, Any]], match: Callable[[Mapping[str, Any]], bool],
             **fields: str) -> Steps:
    """``steps`` with ``fields`` set on the steps ``match`` selects; raises when none does (a family changed)."""
    out = [dict(s) for s in steps]
    hits = [s for s in out if match(s)]
    if not hits:
        raise ValueError(f"no solution step to change ({fields})")
    for s in hits:
        s.update(fields)
    return out


def _ship_to(task: Mapping[str, Any], value: str) -> Steps:
    return _replace(task["oracle"], lambda s: s["op"] == "select" and s["name"] == "Ship to", value=value)


def _cheapest_answer(task: Mapping[str, Any], category: str) -> Steps:
    price = min(p[3] for p in seed_rows(int(task["seed"]))["products"] if p[2] == category)
    steps = _replace(task["oracle"], lambda s: s["op"] == "select" and s["name"] == "Category", value=category)
    return _replace(steps, lambda s: s["op"] == "answer", text=f"${price // 100}.{price % 100:02d}")


_ADDRESS_TOPICS = ("address", "addresses", "ship", "shipping", "deliver", "delivery", "where")

RULES: dict[str, Rule] = {
    "account/delete-address": Rule(
        "address", re.compile(r'^Delete the saved address labelled "(?P<value>Office|Old office)"\. '),
        lambda m: "Delete my saved office address. Leave the other addresses alone.",
        lambda t: ["Office", "Old office"], ("address", "addresses", "label", "labelled", "delete", "remove"),
        'The one labelled "{value}".', "Which saved address should I delete, Office or Old office?",
        lambda t, v: _replace(t["oracle"], lambda s: s["op"] == "click", name=f"Delete {v}")),
    "orders/two-items-coupon": Rule(
        "address", re.compile(r"^(?P<head>.*) to your (?P<value>Home|Office|Old office) address(?P<tail>, .*)$"),
        lambda m: f"{m['head']} to one of your saved addresses{m['tail']}",
        lambda t: list(ADDRESS_LABELS), _ADDRESS_TOPICS, "Ship it to my {value} address.",
        "Which of my saved addresses should the order ship to?", _ship_to),
    "orders/cheapest-rated": Rule(
        "address", re.compile(r"^(?P<head>.*) to your (?P<value>Home|Office|Old office) address(?P<tail> and .*)$"),
        lambda m: f"{m['head']} to one of your saved addresses{m['tail']}",
        lambda t: list(ADDRESS_LABELS), _ADDRESS_TOPICS, "Ship it to my {value} address.",
        "Which of my saved addresses should the order ship to?", _ship_to),
    "tickets/triage": Rule(
        "assignee", re.compile(r"^(?P<head>.*) and assign it to (?P<value>\w+)\.(?P<tail> .*)$"),
        lambda m: f"{m['head']} and assign it to the agent who should handle it.{m['tail']}",
        lambda t: list(AGENTS[1:]), ("assign", "assignee", "agent", "who", "handle", "owner"),
        "Assign it to {value}.", "Which agent should I assign the ticket to?",
        lambda t, v: _replace(t["oracle"], lambda s: s["op"] == "select" and s["name"] == "Assignee", value=v)),
    "orders/refund-from-ticket": Rule(
        "order", re.compile(r'^Order (?P<value>\d+) arrived damaged, as the customer explains in the ticket '
                            r'"(?P<ticket>[^"]+)"\. Request a refund for order (?P=value) with the reason damaged'
                            r"(?P<tail>, .*)$"),
        lambda m: (f"An order arrived damaged, as the customer explains in the ticket \"{m['ticket']}\" (the ticket "
                   f"does not say which order). Request a refund for that order with the reason damaged{m['tail']}"),
        lambda t: ["1", "2"], ("order", "orders", "refund", "refunded"), "It is order {value}.",
        "Which order should I refund?",
        lambda t, v: _replace(t["oracle"], lambda s: s["op"] == "goto" and s["path"].startswith("/orders/"),
                              path=f"/orders/{v}")),
    "compare/cheapest-in-category": Rule(
        "category", re.compile(r"^(?P<head>.*) in the (?P<value>\w+) category\?(?P<tail> .*)$"),
        lambda m: f"{m['head']} in the category I am shopping in?{m['tail']}",
        lambda t: list(CATEGORIES), ("category", "categories", "shopping", "section", "department"),
        "I am shopping in the {value} category.", "Which category are you shopping in?", _cheapest_answer),
}
"""The families with an underspecified variant, by family name."""


def variant_task_id(task_id: str, slot: str) -> str:
    return f"{task_id}{VARIANT_MARK}{slot}"


def underspecified_task(task: Mapping[str, Any]) -> dict[str, Any]:
    """The underspecified variant of one bundled task (its family must have a rule)."""
    rule = RULES[task["family"]]
    m = rule.pattern.match(task["statement"])
    if m is None:
        raise ValueError(f"{task['task_id']}: the statement no longer matches the {rule.slot} rule of its family")
    value = m["value"]
    candidates = rule.candidates(task)
    if value not in candidates:
        raise ValueError(f"{task['task_id']}: {value!r} is not one of the {rule.slot} candidates {candidates}")
    out = dict(task)
    out["task_id"] = variant_task_id(task["task_id"], rule.slot)
    out["statement"] = rule.statement(m)
    out["oracle"] = [{"op": "ask", "question": rule.question}, *rule.steps(task, value)]
    out["intent"] = {"slot": rule.slot, "value": value, "candidates": candidates,
                     "topics": sorted({*rule.topics, *(c.lower() for c in candidates)}),
                     "reply": rule.reply.format(value=value)}
    out["provenance"] = {**task["provenance"], "generator": GENERATOR, "source": task["task_id"]}
    out["task_version"] = content_version(out)
    return out


def underspecified_tasks(tasks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The underspecified variant of every task whose family has a rule (benign tasks: ``intent`` absent)."""
    return [underspecified_task(t) for t in tasks if t["family"] in RULES and not t.get("injection")]


def guess_steps(variant: Mapping[str, Any], value: str) -> Steps:
    """The solution of an underspecified variant as a policy that assumed ``value`` without asking would play it
    (for tests and analyses: only the intended value's passes the checks)."""
    return [s for s in RULES[variant["family"]].steps(variant, value) if s["op"] != "ask"]


__all__ = ["ADDRESS_LABELS", "DONT_KNOW", "GENERATOR", "RULES", "VARIANT_MARK", "Rule", "SimulatedUser",
           "guess_steps", "underspecified_task", "underspecified_tasks", "variant_task_id"]
