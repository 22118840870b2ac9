"""GET /api/v1/channels/{name}/events: search newest first across partitions (key, header,
body text and regex), bounded by hits, events scanned and time, paged by a cursor; tails
after positions; bad input is a 400 naming the field; reading never takes."""
from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row, problem, token_client
from django.http import QueryDict
from django.test import override_settings
from rest_framework.test import APIClient

from appliance import channels, event_search
from appliance.models import Channel
from appliance.search_query import parse_search
from channel_engine import Event, OffsetOutOfRangeError

pytestmark = pytest.mark.django_db
URL = "/api/v1/channels/orders/events"


@pytest.fixture()
def orders(tmp_path: Path) -> Iterator[Channel]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        yield channel_row(tmp_path, partitions=3, transaction_capacity=5000)
    channels.close_all()


@pytest.fixture()
def admin() -> APIClient:
    return token_client("admin")


def put(row: Channel, *events: dict[str, Any]) -> list[tuple[int, int]]:
    """Each event in a transaction of its own (keyless ones go round-robin); where they went."""
    placed = []
    for event in events:
        with channels.open_channel(row).put() as tx:
            tx.put(**event)
        placed.append(tx.committed[0][:2])
    return placed


def search(client: APIClient, **query: Any) -> dict[str, Any]:
    response = client.get(URL, query)
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


def test_it_finds_a_hit_on_another_partition_newest_first(
        orders: Channel, admin: APIClient) -> None:
    clock = count(1_000)
    placed = put(orders, {"body": b"the needle", "timestamp": next(clock)},
                 *({"body": f"hay {i}".encode(), "timestamp": next(clock)} for i in range(8)))
    latest = search(admin)
    assert [e["body"] for e in latest["events"]] == [f"hay {i}" for i in range(7, -1, -1)] + [
        "the needle"]
    assert {e["partition"] for e in latest["events"]} == {0, 1, 2}
    assert latest["scanned"] == latest["total"] == 9 and latest["cursor"] is None
    found = search(admin, contains="needle")
    assert [(e["partition"], e["offset"]) for e in found["events"]] == [placed[0]]
    assert placed[0][0] != latest["events"][0]["partition"]  # not where the newest is
    hit = found["events"][0]
    assert hit["timestamp"] == 1_000 and hit["body_base64"] == "dGhlIG5lZWRsZQ=="


def test_it_filters_by_key_header_text_and_regex(orders: Channel, admin: APIClient) -> None:
    put(orders, {"body": b'{"user": "ann", "n": 1}', "key": b"ann", "headers": {"kind": b"a"},
                 "timestamp": 1_000},  # one ms apart: puts in the same ms tie by partition
        {"body": b'{"user": "bob", "n": 22}', "key": b"bob", "headers": {"kind": b"b"},
         "timestamp": 1_001},
        {"body": b"\xff\x00binary", "key": b"bob", "headers": {"kind": b"a", "x": b"1"},
         "timestamp": 1_002})

    def bodies(**query: Any) -> list[str | None]:
        return [e["body"] for e in search(admin, **query)["events"]]

    assert bodies(key="bob") == [None, '{"user": "bob", "n": 22}']
    assert bodies(header="kind:a") == [None, '{"user": "ann", "n": 1}']
    assert bodies(header=["kind:a", "x:1"], key="bob") == [None]
    assert bodies(contains='"user"') == ['{"user": "bob", "n": 22}', '{"user": "ann", "n": 1}']
    assert bodies(regex=r'"n": \d{2}\b') == ['{"user": "bob", "n": 22}']
    assert bodies(regex="binary$", key="ann") == []
    assert bodies(key="nobody") == []


def test_it_pages_older_events_with_its_cursor(orders: Channel, admin: APIClient) -> None:
    put(orders, *({"body": f"e{i}".encode(), "timestamp": 1_000 + i} for i in range(10)))
    seen, cursor, pages = [], None, 0
    while True:
        page = search(admin, limit=3, **({"cursor": cursor} if cursor else {}))
        seen += [e["body"] for e in page["events"]]
        pages, cursor = pages + 1, page["cursor"]
        if cursor is None:
            break
        assert page["stopped"] == "limit" and not page["stopped_early"]
    assert seen == [f"e{i}" for i in range(9, -1, -1)] and pages == 4
    one = search(admin, partition=1)
    assert {e["partition"] for e in one["events"]} == {1} and one["total"] < 10


def test_a_bounded_scan_of_a_big_channel_stops_early_and_says_so(
        orders: Channel, admin: APIClient) -> None:
    for _ in range(3):  # 3 transactions of 2,000: one per partition
        with channels.open_channel(orders).put() as tx:
            for i in range(2000):
                tx.put(f"event {i}".encode())
    first = search(admin, contains="nowhere", scan_limit=1000)
    assert first["events"] == [] and first["scanned"] == 1000 and first["total"] == 6000
    assert first["stopped"] == "scan_limit" and first["stopped_early"] is True
    assert first["remaining"] == 5000 and first["cursor"]
    second = search(admin, contains="nowhere", scan_limit=1000, cursor=first["cursor"])
    assert second["scanned"] == 1000 and second["remaining"] == 4000
    assert sum(int(p.split(":")[1]) for p in second["cursor"].split(",")) == 4000
    last = search(admin, contains="event 0", scan_limit=1_000_000, cursor=first["cursor"])
    assert [e["body"] for e in last["events"]] == ["event 0"] * 3
    assert last["remaining"] == 0 and last["stopped"] is None and last["cursor"] is None


def test_the_time_budget_ends_a_scan(orders: Channel) -> None:
    put(orders, *({"body": b"x"} for _ in range(5)))
    ticks = count()  # a tick a look: the start, a read of each partition, then each event
    result = event_search.search(channels.open_channel(orders), [0, 1, 2],
                                 event_search.Filters(contains=b"y"),
                                 event_search.Bounds(budget_s=5.5), clock=lambda: next(ticks))
    assert result.stopped == "time_budget" and result.scanned == 2 and result.remaining == 3
    assert event_search.describe(result)["stopped_early"] is True


def test_the_time_budget_is_checked_before_each_partitions_first_read(
        orders: Channel) -> None:
    put(orders, *({"body": b"x"} for _ in range(5)))
    channel, reads = channels.open_channel(orders), []

    class Counted:
        def list_offsets(self) -> list[tuple[int, int]]:
            return channel.list_offsets()

        def read(self, partition: int, offset: int, max_events: int) -> list[Event]:
            reads.append(partition)
            return channel.read(partition, offset, max_events)

    ticks = count()  # the start, p0's read; then the time is up before p1's
    result = event_search.search(Counted(), [0, 1, 2],  # type: ignore[arg-type]
                                 event_search.Filters(), event_search.Bounds(budget_s=1.5),
                                 clock=lambda: next(ticks))
    assert reads == [0] and result.stopped == "time_budget"
    assert result.scanned == 0 and result.remaining == 5
    assert result.cursor == result.tail  # nothing skipped: the next page starts over


def test_a_page_of_hits_stops_at_a_reads_worth_of_bytes(orders: Channel,
                                                          admin: APIClient) -> None:
    put(orders, *({"body": b"b" * 300_000, "key": b"k"} for _ in range(5)))
    first = search(admin, limit=1000)
    assert len(first["events"]) == 4 and first["stopped"] == "bytes"
    assert first["stopped_early"] is False and first["remaining"] == 1
    assert len(search(admin, cursor=first["cursor"])["events"]) == 1


def test_a_tail_shares_a_reads_worth_of_bytes_across_partitions(orders: Channel) -> None:
    placed = put(orders, *({"body": b"b" * 300_000} for _ in range(12)))  # 4 a partition
    start = {p: 0 for p in range(3)}
    hits, after, _ = event_search.read_after(channels.open_channel(orders), start,
                                             event_search.Filters(), 1000)
    assert sum(len(e.body) for e in hits) < 1.5 * 1024 * 1024
    assert all(after[p] >= 1 for p in range(3))  # every partition moved on
    assert len({p for p, _ in placed}) == 3


def test_a_catastrophic_regex_on_long_bodies_stays_within_the_budget(
        orders: Channel, admin: APIClient) -> None:
    put(orders, {"body": b"a" * 30 + b"!"}, *({"body": b"a" * 500_000 + b"!"} for _ in range(3)))
    started = time.monotonic()
    found = search(admin, regex="^(a+)+$", budget_ms=1000)
    assert time.monotonic() - started < 2 and found["events"] == []
    assert found["scanned"] == 4 and found["stopped"] is None


def test_text_and_regex_look_at_a_bodys_first_mib_only() -> None:
    cap = event_search.MATCH_BYTES
    inside, outside = (Event(0, 0, 0, None, {}, b"x" * (cap - n) + b"needle") for n in (6, 5))
    for filters in (event_search.Filters(contains=b"needle"),
                    parse_search(QueryDict("regex=needle"), 1).filters):
        assert filters.match(inside) and not filters.match(outside)


@pytest.mark.parametrize(("query", "field"), [
    ({"regex": "(unclosed"}, "regex"), ({"regex": "a" * 257}, "regex"),
    ({"regex": "(?=lookahead)"}, "regex"), ({"regex": r"(a)\1"}, "regex"),
    ({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"limit": "ten"}, "limit"),
    ({"scan_limit": 0}, "scan_limit"), ({"budget_ms": 50}, "budget_ms"),
    ({"header": "no-colon"}, "header"), ({"header": ":value"}, "header"),
    ({"partition": 3}, "partition"), ({"cursor": "0-5"}, "cursor"),
    ({"cursor": "7:5"}, "cursor"), ({"cursor": "0:1", "after": "0:1"}, "after"),
    ({"contains": "x" * 1025}, "contains")])
def test_bad_input_is_a_400_naming_the_field(orders: Channel, admin: APIClient,
                                             query: dict[str, Any], field: str) -> None:
    found = problem(admin.get(URL, query), 400, "validation-error")
    assert found["field"] == field and field in found["errors"]


def test_it_tails_after_positions_oldest_first(orders: Channel, admin: APIClient) -> None:
    put(orders, {"body": b"before"})
    start = search(admin)["tail"]
    assert search(admin, after=start) == {"events": [], "scanned": 0, "after": start}
    put(orders, {"body": b"new 1", "timestamp": 5_000}, {"body": b"new 2", "timestamp": 6_000})
    tail = search(admin, after=start)
    assert [e["body"] for e in tail["events"]] == ["new 1", "new 2"]
    assert search(admin, after=tail["after"])["events"] == []
    assert [e["body"] for e in search(admin, after=start, contains="2")["events"]] == ["new 2"]


def test_reading_takes_nothing_and_needs_the_admin_role(
        orders: Channel, admin: APIClient) -> None:
    put(orders, {"body": b"a"}, {"body": b"b"})
    search(admin, contains="a")
    assert channels.open_channel(orders).status()["events_untaken"] == 2
    for role in ("produce", "consume"):
        problem(token_client(role).get(URL), 403, "permission-denied")
        assert token_client(role).head(URL, {"regex": "a"}).status_code == 403
    assert admin.head(URL).status_code == 200
    assert token_client("produce").post(URL, {"events": [{"body": "c"}]},
                                         format="json").status_code == 200
    other = channel_row(Path(orders.checkpoint_dir).parent, name="other")
    problem(token_client("admin", channels=[other]).get(URL), 403, "permission-denied")


def test_head_needs_the_role_get_needs_on_every_api_view() -> None:
    from django.urls import get_resolver

    from appliance.api.base import ApiView
    views = {getattr(p.callback, "cls", None) for p in get_resolver().url_patterns
             if hasattr(p, "callback")}
    checked = [v for v in views if isinstance(v, type) and issubclass(v, ApiView)]
    assert len(checked) > 5
    for view in checked:
        assert view().role_for("HEAD") == view().role_for("GET"), view
    from appliance.api.search import ChannelEventsView
    roles = {m: ChannelEventsView().role_for(m) for m in ("GET", "HEAD", "OPTIONS", "POST")}
    assert roles == {"GET": "admin", "HEAD": "admin", "OPTIONS": "admin", "POST": "produce"}


def test_it_scans_every_event_when_big_bodies_cut_a_read_short(
        orders: Channel, admin: APIClient) -> None:
    big = b"z" * 400_000  # a read returns about 1 MiB: two or three of these
    with channels.open_channel(orders).put() as tx:  # one partition, one batch each below
        tx.put(big + b"0")
    for i in range(1, 6):
        with channels.open_channel(orders).put() as tx:
            tx.put(big + str(i).encode(), key=b"same")  # one key: one partition
    found = search(admin, key="same", regex="[15]$", scan_limit=100)
    assert [e["body"][-1] for e in found["events"]] == ["5", "1"]
    assert found["scanned"] == found["total"] == 6


class CappedLog:
    """A partition log whose reads stop at a byte cap, as the engine's do (at least one
    event), recording the bytes each read answered."""

    def __init__(self, sizes: list[int], cap: int) -> None:
        self.events = [Event(0, i, i, None, {}, bytes([i % 256]) * n)
                       for i, n in enumerate(sizes)]
        self.cap, self.answered = cap, []

    def read(self, partition: int, offset: int, max_events: int) -> list[Event]:
        out: list[Event] = []
        for event in self.events[offset:offset + max_events]:
            if out and sum(len(e.body) for e in out) + len(event.body) > self.cap:
                break
            out.append(event)
        self.answered.append(sum(len(e.body) for e in out))
        return out


def test_a_backward_read_holds_one_capped_read_at_most_and_misses_nothing() -> None:
    sizes = [10] * 300 + [400] * 40 + [10] * 300 + [3000] * 3
    log = CappedLog(sizes, cap=1000)
    scan = event_search._Backwards(log, 0, 0, len(sizes))  # type: ignore[arg-type]
    seen = []
    while (event := scan.head()) is not None:
        seen.append(event.offset)
        scan.pop()
        assert sum(len(e.body) for e in scan.buffer) <= 3000
    assert seen == list(range(len(sizes) - 1, -1, -1))
    assert max(log.answered) <= 3000 and len(log.answered) < 120


class RetainedLog(CappedLog):
    """A capped log whose retention deletes everything below `start` when `retain` is
    called (from a read, as a deletion between two reads would)."""

    def __init__(self, sizes: list[int], cap: int, retain_at_read: int, start: int) -> None:
        super().__init__(sizes, cap)
        self.start, self.reads, self.retain_at_read, self.new_start = 0, 0, retain_at_read, start

    def list_offsets(self) -> list[tuple[int, int]]:
        return [(self.start, len(self.events))]

    def read(self, partition: int, offset: int, max_events: int) -> list[Event]:
        self.reads += 1
        if self.reads == self.retain_at_read:
            self.start = self.new_start
        if not self.start <= offset <= len(self.events):
            raise OffsetOutOfRangeError(offset, self.start, len(self.events))
        return super().read(partition, offset, max_events)


def test_a_scan_goes_on_from_the_new_log_start_when_retention_deletes_meanwhile() -> None:
    log = RetainedLog([10] * 400, cap=10_000, retain_at_read=2, start=150)
    result = event_search.search(log, [0], event_search.Filters(),  # type: ignore[arg-type]
                                 event_search.Bounds(limit=1000, scan_limit=1000))
    assert [e.offset for e in result.hits] == list(range(399, 149, -1))
    assert result.remaining == 0 and result.cursor is None
    gone = RetainedLog([10] * 400, cap=10_000, retain_at_read=2, start=400)
    result = event_search.search(gone, [0], event_search.Filters(),  # type: ignore[arg-type]
                                 event_search.Bounds(limit=1000, scan_limit=1000))
    assert len(result.hits) == 200 and result.remaining == 0


def test_a_tail_reads_from_the_new_log_start_when_retention_passed_its_position() -> None:
    log = RetainedLog([10] * 400, cap=10_000, retain_at_read=1, start=100)
    hits, after, scanned = event_search.read_after(
        log, {0: 50}, event_search.Filters(), 20)  # type: ignore[arg-type]
    assert [e.offset for e in hits] == list(range(100, 120)) and after == {0: 120}


def test_search_and_tail_ask_the_engine_for_offsets_not_its_status(
        orders: Channel, admin: APIClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """status() reads every partition's figures, subscriptions and losses: a search or a
    tail needs each partition's readable range only (one small call)."""
    put(orders, {"body": b"the needle", "timestamp": 1_000})
    channel = channels.open_channel(orders)
    asked = {"status": 0, "list_offsets": 0}
    for name in asked:
        real = getattr(channel, name)
        monkeypatch.setattr(channel, name, lambda *a, _n=name, _r=real, **k: (
            asked.__setitem__(_n, asked[_n] + 1), _r(*a, **k))[1])
    assert search(admin, contains="needle")["events"]
    assert asked == {"status": 0, "list_offsets": 1}
    assert search(admin, after="0:0,1:0,2:0")["events"]
    assert asked == {"status": 0, "list_offsets": 2}
