"""The event browser (/channels/<name>/events): the channel's latest events across every
partition, newest first, searched by key, header and body (appliance/event_search.py, the
search API's read path); or one partition from an offset or a time. Reading never takes.

    ?                                   the latest events, newest first
    ?key=&header=&contains=&regex=      a search (appliance/search_query.py), newest first;
     &partition=&cursor=                cursor: the next page of older events
    ?partition=P&offset=O | &time=T     one partition from an offset or a time
    /<partition>/<offset>               one event's body, raw, as a download
    /tail?after=C&<search>              the live tail: rows of the events after C
                                        (oldest last), the next C in X-Weir-After
    /step?<search>&cursor=C             one short step of a search the page runs
                                        (browser.js): rows of its hits, its figures in
                                        X-Weir-Scanned/-Total/-Cursor/-Stopped, and
                                        X-Weir-After: where a tail of it starts
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render

from appliance import channels, event_search
from appliance.models import Channel
from appliance.search_query import BadQuery, parse_search
from appliance.ui.access import page
from appliance.ui.json_tree import Budget, json_tree
from appliance.ui.preview import hex_dump, preview
from channel_engine import Event, OffsetOutOfRangeError

PAGE_EVENTS = 50
INT64_MAX = 2**63 - 1
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TEMPLATE = "ui/events.html"
STEP_MS = 250  # one step of a search the page runs (browser.js): progress moves, Cancel is prompt
STEP_SCAN = 10_000  # events one step scans at most (the API's default scan limit)
STOPPED = {"limit": "a page of hits", "bytes": "a page's worth of bytes (1 MiB)",
           "scan_limit": "the scan limit",
           "time_budget": "the time budget"}
# fields of a search the form has no input for (typed into the address): named for people
OTHER_FIELDS = {"limit": "Hits per page", "scan_limit": "Scan limit",
                "budget_ms": "Time budget (ms)", "cursor": "Older events from",
                "after": "Newer events from"}


@page
def events(request: HttpRequest, name: str) -> HttpResponse:
    """The latest events or a search, newest first; or a partition from an offset or time."""
    row = get_object_or_404(Channel, name=name)
    if "offset" in request.GET or "time" in request.GET:
        return _browse(request, row, _context(row, request.GET))
    return _search(request, row, _context(row, request.GET), request.GET)


def latest_page(request: HttpRequest, row: Channel, extra: dict[str, Any],
                status: int) -> HttpResponse:
    """The page of the latest events, with `extra` in its context (a refused form)."""
    response = _search(request, row, {**_context(row, QueryDict()), **extra}, QueryDict())
    response.status_code = status
    return response


def _context(row: Channel, query: QueryDict) -> dict[str, Any]:
    return {"row": row, "partitions": range(row.partitions), "query": query, "events": [],
            "errors": {}, "step": {"ms": STEP_MS, "scan": STEP_SCAN, "hits": PAGE_EVENTS,
                                   "tail_ms": int(settings.WEIR_UI_REFRESH_S * 1000)}}


@page
def events_tail(request: HttpRequest, name: str) -> HttpResponse:
    """Rows of the events after the page's positions, newest first (the live tail polls)."""
    row = get_object_or_404(Channel, name=name)
    try:
        search = parse_search(request.GET, row.partitions, max_limit=PAGE_EVENTS)
    except BadQuery as bad:
        return HttpResponse(str(bad), status=400, content_type="text/plain; charset=utf-8")
    if search.after is None:
        return HttpResponse("after: the positions to go on from", status=400,
                            content_type="text/plain; charset=utf-8")
    hits, after, _ = event_search.read_after(channels.open_channel(row), search.after,
                                             search.filters, search.bounds.limit)
    response = render(request, "ui/_event_rows.html", {"row": row, "events": rows(hits[::-1])})
    response["X-Weir-After"] = event_search.cursor_text(after)
    return response


@page
def events_step(request: HttpRequest, name: str) -> HttpResponse:
    """One bounded step of a search the page runs: rows of its hits, newest first; how far
    the whole search is (scanned of total) and where the next step goes on in headers."""
    row = get_object_or_404(Channel, name=name)
    ranges, why = channels.offsets_of(row)
    if ranges is None:
        return HttpResponse(f"This channel cannot be opened: {why}", status=503,
                            content_type="text/plain; charset=utf-8")
    try:
        search = parse_search(request.GET, row.partitions, max_limit=PAGE_EVENTS)
    except BadQuery as bad:
        return HttpResponse(str(bad), status=400, content_type="text/plain; charset=utf-8")
    result = event_search.search(channels.open_channel(row), search.partitions,
                                 search.filters, search.bounds, search.cursor, ranges=ranges)
    response = render(request, "ui/_event_rows.html", {"row": row, "events": rows(result.hits)})
    # scanned counts from the search's start (the cursor carries it), as the page's summary
    response["X-Weir-Scanned"] = str(result.total - result.remaining)
    response["X-Weir-Total"] = str(result.total)
    response["X-Weir-Cursor"] = event_search.cursor_text(result.cursor) or ""
    response["X-Weir-Stopped"] = result.stopped or ""
    response["X-Weir-After"] = event_search.cursor_text(result.tail)  # where a tail starts
    return response


@page
def event_body(request: HttpRequest, name: str, partition: int, offset: int) -> HttpResponse:
    """One event's body as it is stored, as a file to save."""
    row = get_object_or_404(Channel, name=name)
    if partition >= row.partitions:
        raise Http404(f"channel {name} has no partition {partition}")
    try:
        found = channels.open_channel(row).read(partition, offset, 1)
    except OffsetOutOfRangeError as exc:
        raise Http404(str(exc)) from None
    if not found or found[0].offset != offset:
        raise Http404(f"no event at offset {offset} of partition {partition}")
    response = HttpResponse(found[0].body, content_type="application/octet-stream")
    response["Content-Disposition"] = (f'attachment; filename="{name}-{partition}-{offset}'
                                       '.bin"')
    return response


def rows(found: list[Event]) -> list[dict[str, Any]]:
    """Events as the browser's rows show them (safe previews of key, headers and body; JSON
    trees out of one page budget)."""
    page = Budget()
    return [_row(e, page) for e in found]


def _row(event: Event, page: Budget) -> dict[str, Any]:
    body = preview(event.body)
    tree = json_tree(event.body, page)
    return {"event": event, "key": preview(event.key), "body": body, "json": tree,
            "hex": hex_dump(event.body) if body and body.kind == "text" else None,
            "view": "json" if tree is not None else body.kind if body else "text",
            "headers": [(k, preview(v)) for k, v in event.headers.items()]}


def _search(request: HttpRequest, row: Channel, context: dict[str, Any],
            query: QueryDict) -> HttpResponse:
    context["mode"] = "search"
    ranges, why = channels.offsets_of(row)
    if ranges is None:  # the channel page says the same: the page stands, the reason shown
        context["unavailable"] = why
        return render(request, TEMPLATE, context, status=503)
    try:
        search = parse_search(query, row.partitions, max_limit=PAGE_EVENTS)
    except BadQuery as bad:
        context["errors"] = bad.errors
        context["other_errors"] = [(label, bad.errors[field])
                                   for field, label in OTHER_FIELDS.items()
                                   if field in bad.errors]
        return render(request, TEMPLATE, context, status=400)
    result = event_search.search(channels.open_channel(row), search.partitions,
                                 search.filters, search.bounds, search.cursor,
                                 ranges=ranges)
    context["events"] = rows(result.hits)
    context["scan"] = {**event_search.describe(result),
                       "done": result.total - result.remaining,
                       "stopped_at": STOPPED.get(result.stopped or "")}
    if search.cursor is None:  # the newest page: the live tail goes on from here
        tail = query.copy()
        tail.pop("cursor", None)
        context["tail_query"] = tail.urlencode()
        context["tail_after"] = event_search.cursor_text(result.tail)
        context["tail_ms"] = int(settings.WEIR_UI_REFRESH_S * 1000)
    if result.cursor is not None:
        older = query.copy()
        older["cursor"] = event_search.cursor_text(result.cursor)
        context["older"] = older.urlencode()
    return render(request, TEMPLATE, context)


def _browse(request: HttpRequest, row: Channel, context: dict[str, Any]) -> HttpResponse:
    query = request.GET
    context["mode"] = "browse"
    text = query.get("partition", "0")
    partition = int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else -1
    if not 0 <= partition < row.partitions:
        context["errors"]["partition"] = f"a partition from 0 to {row.partitions - 1}"
        return render(request, TEMPLATE, context, status=400)
    channel = channels.open_channel(row)
    start: int | None
    if query.get("time"):
        at = _when(query["time"])
        if at is None:
            context["errors"]["time"] = ("a time like 2026-11-23T19:30:00 (UTC, 1970 to 9999) or "
                                         "ms since the epoch")
            return render(request, TEMPLATE, context, status=400)
        start = channel.offsets_for_time(partition, at)
        context["found_offset"] = start
        if start is None:
            context["note"] = "no event at or after that time"
            return render(request, TEMPLATE, context)
    else:
        text = query.get("offset", "").strip() or "0"
        if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > INT64_MAX:
            context["errors"]["offset"] = f"an offset: a whole number from 0 to {INT64_MAX}"
            return render(request, TEMPLATE, context, status=400)
        start = int(text)
    try:
        found = channel.read(partition, start, PAGE_EVENTS)
    except OffsetOutOfRangeError as exc:
        context["errors"]["offset"] = str(exc)
        return render(request, TEMPLATE, context, status=416)
    context["events"] = rows(found)
    context["partition"] = partition
    context["next_offset"] = found[-1].offset + 1 if len(found) == PAGE_EVENTS else None
    return render(request, TEMPLATE, context)


def _when(text: str) -> int | None:
    """A time the operator typed (ISO, UTC unless it says otherwise) as ms since the epoch,
    0 .. INT64_MAX (None: not a time)."""
    if text.isascii() and text.isdigit():
        return int(text) if len(text) <= 19 and int(text) <= INT64_MAX else None
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        ms = (moment - EPOCH) // timedelta(milliseconds=1)
    except (ValueError, OverflowError):  # 9999-12-31T23:59:59-01:00 is past datetime.max
        return None
    return ms if ms >= 0 else None
