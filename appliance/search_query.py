"""A search of a channel's events as a query string states it, checked: the one parser of
the search API (GET /api/v1/channels/{name}/events) and the UI's event browser.

    key=K              the event's key is K (UTF-8), exactly
    header=NAME:VALUE  a header NAME whose value is VALUE (repeat: every one must match)
    contains=TEXT      the body holds TEXT (UTF-8 bytes; binary bodies too) in its first MiB
    regex=PATTERN      the body's first MiB, as UTF-8 text, matches PATTERN (RE2 syntax,
                       searched: no backreferences or lookaround; linear time)
    partition=P        only partition P (default: every partition)
    limit=N            hits per page, 1..1000 (default 50; the UI's: 1..50, its page)
    scan_limit=N       events scanned at most, 1..1,000,000 (default 10,000)
    budget_ms=MS       time the scan may take, 100..10,000 (default 2,000)
    cursor=C           go on with older events from a previous scan's cursor
    after=C            a tail: events at or after these positions (a previous tail's
                       `after`, or a scan's `tail`; a partition not named: from its
                       start), oldest first; not with cursor

An empty value is no filter. A bad value raises BadQuery naming each field.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import re2

from appliance.event_parsing import MAX_HEADER_NAME, header_pair
from appliance.event_search import Bounds, Filters, parse_cursor

MAX_LIMIT = 1000
MAX_SCAN = 1_000_000
MAX_PATTERN = 256  # characters (RE2's time is linear in the text, its memory in the pattern)
MAX_TEXT = 1024
BUDGET_MS = (100, 10_000)
DEFAULTS = {"limit": 50, "scan_limit": 10_000, "budget_ms": 2_000}


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the caller's 400, not the server's log


class Query(Protocol):
    """A query string: Django's QueryDict (several values per name)."""

    def get(self, key: str, default: Any = None) -> Any: ...  # noqa: D102
    def getlist(self, key: str) -> list[str]: ...  # noqa: D102


class BadQuery(ValueError):
    """Fields of a search that are wrong: {field: what it should be}."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = dict(errors)


@dataclass(frozen=True)
class Search:
    """A checked search: what to match, where, how far, and from where."""

    filters: Filters
    bounds: Bounds
    partitions: list[int]
    cursor: dict[int, int] | None
    after: dict[int, int] | None


def parse_search(query: Query, partitions: int, max_limit: int = MAX_LIMIT) -> Search:
    """The search a query string asks for on a channel of `partitions` (hits per page at
    most `max_limit`: the UI's page is smaller than the API's); BadQuery if bad."""
    errors: dict[str, str] = {}
    filters = _filters(query, errors)
    numbers = {name: _number(query, name, low, high, errors, min(DEFAULTS[name], high))
               for name, low, high in (("limit", 1, max_limit), ("scan_limit", 1, MAX_SCAN),
                                       ("budget_ms", *BUDGET_MS))}
    only = _number(query, "partition", 0, partitions - 1, errors, None)
    where = [only] if only is not None else list(range(partitions))
    cursor = _cursor(query, "cursor", partitions, errors)
    after = _cursor(query, "after", partitions, errors)
    if cursor is not None and after is not None:
        errors["after"] = "give cursor (older events) or after (newer ones), not both"
    if errors:
        raise BadQuery(errors)
    if after is not None:  # a tail goes on from every partition searched
        after = {p: after.get(p, 0) for p in where}
    bounds = Bounds(limit=numbers["limit"] or 0, scan_limit=numbers["scan_limit"] or 0,
                    budget_s=(numbers["budget_ms"] or 0) / 1000)
    return Search(filters, bounds, where, cursor, after)


def _filters(query: Query, errors: dict[str, str]) -> Filters:
    key, contains, pattern = (_text(query, name, errors) for name in ("key", "contains",
                                                                      "regex"))
    headers = []
    for given in query.getlist("header"):
        if not given:
            continue
        try:
            name, value = header_pair(given)
        except ValueError:
            errors["header"] = f"{given!r}: a header as name:value"
            continue
        if len(name.encode()) > MAX_HEADER_NAME:
            errors["header"] = f"a header name of at most {MAX_HEADER_NAME} bytes"
        else:
            headers.append((name, value.encode()))
    regex = None
    if pattern:
        if len(pattern) > MAX_PATTERN:
            errors["regex"] = f"a regular expression of at most {MAX_PATTERN} characters"
        else:
            try:
                regex = re2.compile(pattern, _RE2_OPTIONS)
            except re2.error as exc:
                reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) \
                    else str(exc)
                errors["regex"] = f"not an RE2 regular expression: {reason}"
    return Filters(key=key.encode() if key else None, headers=tuple(headers),
                   contains=contains.encode() if contains else None, regex=regex)


def _text(query: Query, name: str, errors: dict[str, str]) -> str:
    text = query.get(name) or ""
    if len(text) > MAX_TEXT:
        errors[name] = f"at most {MAX_TEXT} characters"
    return str(text)


def _number(query: Query, name: str, low: int, high: int, errors: dict[str, str],
            default: int | None) -> int | None:
    text = query.get(name) or ""
    if not text:
        return default
    if text.isascii() and text.isdigit() and len(text) <= 19 and low <= int(text) <= high:
        return int(text)
    errors[name] = f"a whole number from {low:,} to {high:,}"
    return None


def _cursor(query: Query, name: str, partitions: int,
            errors: dict[str, str]) -> dict[int, int] | None:
    text = query.get(name) or ""
    if not text:
        return None
    try:
        return parse_cursor(text, partitions)
    except ValueError as exc:
        errors[name] = f"partition:offset pairs separated by commas ({exc})"
        return None
