"""A JSON body as a collapsible tree: nested <details> (no script needed to fold it), every
key and value escaped, so nothing from an event is ever rendered as HTML.

Only objects and arrays make a tree (a scalar body reads as well as text); bodies over
MAX_BYTES or nested deeper than MAX_DEPTH are not parsed, and a tree stops at MAX_NODES
values with an ellipsis, so one event cannot make a page huge. The trees of one page share
a Budget of PAGE_NODES values: once it is spent, further bodies are not parsed (they show
as text), so a page of many events cannot either.
"""
from __future__ import annotations

import json
from typing import Any

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

MAX_BYTES = 256 * 1024
MAX_DEPTH = 64
MAX_NODES = 2000
PAGE_NODES = 10_000


class Budget:
    """Values trees may still show (one tree's, or a page's shared by its trees)."""

    def __init__(self, nodes: int = PAGE_NODES) -> None:
        self.left = nodes


def json_tree(body: bytes, page: Budget | None = None) -> SafeString | None:
    """The body as a tree of <details> when it is a JSON object or array, else None (also
    when the page's shared budget is spent); what it shows is taken from `page`."""
    if len(body) > MAX_BYTES or (page is not None and page.left <= 0):
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict | list) or _depth(value) > MAX_DEPTH:
        return None
    budget = Budget(MAX_NODES if page is None else min(MAX_NODES, page.left))
    tree = _node(value, budget)
    if page is not None:
        page.left -= min(MAX_NODES, page.left) - budget.left
    return tree


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH or not isinstance(value, dict | list):
        return level
    children = value.values() if isinstance(value, dict) else value
    return max((_depth(v, level + 1) for v in children), default=level + 1)


def _node(value: Any, budget: Budget) -> SafeString:
    budget.left -= 1
    if not isinstance(value, dict | list):
        kind = "null" if value is None else type(value).__name__
        return format_html('<span class="json-{}">{}</span>', kind, json.dumps(value))
    pairs = value.items() if isinstance(value, dict) else enumerate(value)
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    count = f"{len(value)} {'key' if isinstance(value, dict) else 'item'}" + (
        "" if len(value) == 1 else "s")
    lines = []
    for name, child in pairs:
        if budget.left <= 0:
            lines.append('<li class="json-more">…</li>')
            break
        label = (format_html('<span class="json-key">{}</span>: ', json.dumps(name))
                 if isinstance(value, dict) else "")
        lines.append(format_html("<li>{}{}</li>", label, _node(child, budget)))
    # every piece above went through format_html (escaped); joined as the safe strings they are
    members = mark_safe("".join(lines))  # noqa: S308
    return format_html('<details open><summary>{} <span class="json-count">{}</span>'
                       '</summary><ul class="json">{}</ul>{}</details>',
                       opening, count, members, escape(closing))
