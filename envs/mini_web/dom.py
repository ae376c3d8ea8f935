"""Served HTML -> a simplified accessibility tree with element ids (BrowserGym-style ``[id] role "name"`` lines).

Ids are assigned in document order to every node shown, so the same page always gets the same ids. Hidden inputs
are kept (they travel with their form) but not shown. Values typed or selected by the agent live in the browser
state and are overlaid on the tree when it is rendered and when a form is sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser

_VOID = frozenset({"input", "meta", "br", "img", "hr", "link"})
_TRANSPARENT = frozenset({"html", "body", "main", "head", "ul", "ol", "div", "span", "section", "table", "article",
                          "thead", "tbody"})
MAX_TEXT = 1200


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        out: list[str] = []
        for c in self.children:
            out.append(c if isinstance(c, str) else c.text())
        return " ".join(" ".join(out).split())


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(el)
        if tag not in _VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.stack[-1].children.append(data)


@dataclass
class Node:
    """One shown node of the tree."""

    bid: int
    role: str
    name: str
    depth: int
    href: str | None = None
    field_name: str | None = None
    value: str | None = None
    options: list[tuple[str, str]] | None = None
    form: int | None = None
    """bid of the enclosing form."""
    method: str | None = None
    action: str | None = None
    hidden: dict[str, str] = field(default_factory=dict)
    """For forms: hidden fields sent with the form."""
    index: int | None = None
    """For forms: ordinal among the page's forms (how a real browser finds the same form)."""


@dataclass
class Page:
    """A parsed page: title and nodes by id."""

    title: str
    nodes: dict[int, Node]

    def fields_of(self, form_bid: int) -> list[Node]:
        return [n for n in self.nodes.values() if n.form == form_bid and n.field_name]


def parse_page(html_text: str) -> Page:
    b = _Builder()
    b.feed(html_text)
    b.close()
    nodes: dict[int, Node] = {}
    title = ""

    def add(node: Node) -> Node:
        nodes[node.bid] = node
        return node

    def walk(el: Element, depth: int, form: Node | None) -> None:
        nonlocal title
        for child in el.children:
            if isinstance(child, str):
                add(Node(len(nodes) + 1, "text", _clip(" ".join(child.split())), depth, form=form.bid if form else None))
                continue
            tag, a = child.tag, child.attrs
            if tag == "title":
                title = child.text()
            elif tag in ("script", "style", "meta"):
                continue
            elif tag == "nav":
                add(Node(len(nodes) + 1, "navigation", a.get("aria-label", ""), depth))
                walk(child, depth + 1, form)
            elif tag in ("h1", "h2", "h3"):
                add(Node(len(nodes) + 1, "heading", child.text(), depth))
            elif tag == "a":
                add(Node(len(nodes) + 1, "link", child.text(), depth, href=a.get("href", ""),
                         form=form.bid if form else None))
            elif tag == "form":
                f = add(Node(len(nodes) + 1, "form", a.get("aria-label", ""), depth, method=a.get("method", "get").lower(),
                             action=a.get("action", ""), index=sum(1 for n in nodes.values() if n.role == "form")))
                walk(child, depth + 1, f)
            elif tag == "input":
                kind = a.get("type", "text")
                if kind == "hidden":
                    if form is not None:
                        form.hidden[a.get("name", "")] = a.get("value", "")
                    continue
                role = "spinbutton" if kind == "number" else "textbox"
                add(Node(len(nodes) + 1, role, a.get("aria-label", a.get("name", "")), depth, field_name=a.get("name"),
                         value=a.get("value", ""), form=form.bid if form else None))
            elif tag == "textarea":
                add(Node(len(nodes) + 1, "textbox", a.get("aria-label", a.get("name", "")), depth,
                         field_name=a.get("name"), value=child.text(), form=form.bid if form else None))
            elif tag == "select":
                opts = [(o.attrs.get("value", o.text()), o.text()) for o in child.children
                        if isinstance(o, Element) and o.tag == "option"]
                chosen = next((v for (v, _), o in zip(opts, [o for o in child.children if isinstance(o, Element)
                                                              and o.tag == "option"], strict=False)
                               if "selected" in o.attrs), opts[0][0] if opts else "")
                add(Node(len(nodes) + 1, "combobox", a.get("aria-label", a.get("name", "")), depth,
                         field_name=a.get("name"), value=chosen, options=opts, form=form.bid if form else None))
            elif tag == "button":
                add(Node(len(nodes) + 1, "button", child.text(), depth, form=form.bid if form else None))
            elif tag == "p" and a.get("role") in ("status", "alert"):
                add(Node(len(nodes) + 1, a["role"], child.text(), depth))
            elif tag == "tr":
                cells = [c.text() for c in child.children if isinstance(c, Element) and c.tag in ("td", "th")]
                add(Node(len(nodes) + 1, "row", _clip(" | ".join(c for c in cells if c)), depth))
                for c in child.children:
                    if isinstance(c, Element):
                        walk_interactive(c, depth + 1, form)
            elif tag in ("p", "li", "td", "th") and not _has_interactive(child):
                text = child.text()
                if text:
                    add(Node(len(nodes) + 1, "text", _clip(text), depth, form=form.bid if form else None))
            else:
                walk(child, depth if tag in _TRANSPARENT or tag in ("p", "li", "td", "th") else depth + 1, form)

    def walk_interactive(el: Element, depth: int, form: Node | None) -> None:
        """Inside a table row: only links, forms and controls get their own nodes (the row shows the text)."""
        for child in el.children:
            if isinstance(child, Element):
                if child.tag in ("a", "form", "input", "select", "textarea", "button"):
                    walk(Element("#wrap", {}, [child]), depth, form)
                else:
                    walk_interactive(child, depth, form)

    walk(b.root, 0, None)
    return Page(title, nodes)


def _has_interactive(el: Element) -> bool:
    for c in el.children:
        if isinstance(c, Element) and (c.tag in ("a", "form", "input", "select", "textarea", "button")
                                       or _has_interactive(c)):
            return True
    return False


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def render(page: Page, values: Mapping[int, str]) -> str:
    """The tree as text, one node per line, with the agent's typed/selected values overlaid."""
    lines = []
    for n in page.nodes.values():
        line = f"{'  ' * n.depth}[{n.bid}] {n.role} {json.dumps(n.name, ensure_ascii=False)}"
        if n.role in ("textbox", "spinbutton", "combobox"):
            line += f" value={json.dumps(values.get(n.bid, n.value or ''), ensure_ascii=False)}"
        if n.options is not None:
            line += " options=" + json.dumps([v for v, _ in n.options], ensure_ascii=False)
        lines.append(line)
    return "\n".join(lines)


def form_data(page: Page, form_bid: int, values: Mapping[int, str]) -> list[tuple[str, str]]:
    """The (name, value) pairs a form sends: hidden fields, then its controls in document order."""
    form = page.nodes[form_bid]
    out = list(form.hidden.items())
    for n in page.fields_of(form_bid):
        assert n.field_name is not None
        out.append((n.field_name, values.get(n.bid, n.value or "")))
    return out
