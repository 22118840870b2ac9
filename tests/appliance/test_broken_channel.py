"""One broken channel — its home unreadable, its key file unusable, its engine's open
raising — never breaks the views of every channel: the channel list (JSON), /metrics and
the dashboard show it as unhealthy with its reason, and every other channel as usual."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from appliance_helpers import channel_row, token_client
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils.html import escape
from prometheus_client.parser import text_string_to_metric_families

from appliance import channels
from appliance.models import Channel
from channel_engine import Channel as EngineChannel

pytestmark = pytest.mark.django_db


def home_unreadable(root: Path, row: Channel, monkeypatch: pytest.MonkeyPatch) -> str:
    home = root / row.name  # the tests run as root, which reads any mode: a file instead
    home.write_text("a file where the channel's home belongs")
    return str(home)


def key_file_unusable(root: Path, row: Channel, monkeypatch: pytest.MonkeyPatch) -> str:
    keys = root / "keys"  # key files are names in WEIR_KEY_DIR (appliance/keys.py)
    keys.mkdir(mode=0o700)
    monkeypatch.setattr(settings, "WEIR_KEY_DIR", keys)
    key_file = keys / "bad.keys"
    key_file.write_text("not a key file")
    key_file.chmod(0o600)
    Channel.objects.filter(pk=row.pk).update(encryption_key_file=key_file.name,
                                             encryption_active_key="k1")
    return "not valid JSON"


def open_raises(root: Path, row: Channel, monkeypatch: pytest.MonkeyPatch) -> str:
    real_open = EngineChannel.open

    def open_(config: object, **kwargs: object) -> EngineChannel:
        if getattr(config, "name", None) == row.name:
            raise RuntimeError("the engine open went wrong")
        return real_open(config, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(EngineChannel, "open", open_)
    return "RuntimeError: the engine open went wrong"


BREAKAGES: dict[str, Callable[[Path, Channel, pytest.MonkeyPatch], str]] = {
    "home unreadable": home_unreadable, "key file unusable": key_file_unusable,
    "engine open raises": open_raises}


@pytest.fixture(params=sorted(BREAKAGES))
def broken(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Channels good (10 events) and bad (broken as the parameter says); the bad one's
    expected reason."""
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        good = channel_row(tmp_path, "good")
        with channels.open_channel(good).put() as tx:
            for i in range(10):
                tx.put(b"e", key=str(i).encode())
        bad = channel_row(tmp_path, "bad", files=False)  # never opened before it breaks
        yield BREAKAGES[request.param](tmp_path, bad, monkeypatch)
    channels.close_all()


def test_it_lists_a_broken_channel_as_unhealthy_with_its_reason(broken: str) -> None:
    response = token_client("admin").get("/api/v1/channels")
    assert response.status_code == 200
    listed = {line["name"]: line for line in response.json()["channels"]}
    assert listed["good"]["health"] == "healthy" and listed["good"]["events_untaken"] == 10
    assert listed["bad"]["health"] == "unhealthy" and listed["bad"]["events_untaken"] is None
    assert listed["bad"]["health_reason"].startswith("cannot be opened: ")
    assert broken in listed["bad"]["health_reason"], listed["bad"]


def test_it_reports_a_broken_channel_as_down_in_the_metrics(broken: str) -> None:
    response = token_client("admin").get("/metrics")
    assert response.status_code == 200
    value = {f.name: {s.labels["channel"]: s.value for s in f.samples}
             for f in text_string_to_metric_families(response.content.decode())}
    assert value["weir_channel_up"] == {"good": 1, "bad": 0}
    assert value["weir_channel_healthy"] == {"good": 1, "bad": 0}
    assert value["weir_channel_events"] == {"good": 10}


def test_it_shows_a_broken_channel_as_unhealthy_on_the_dashboard(broken: str) -> None:
    operator = Client()
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    for page in ("/", "/ui/status"):
        response = operator.get(page)
        assert response.status_code == 200
        html = response.content.decode()
        bad = html[html.index('<tr data-channel="bad">'):]
        bad = bad[:bad.index("</tr>")]
        assert "unhealthy" in bad and "cannot be opened: " in bad and broken in bad, bad
        good = html[html.index('<tr data-channel="good">'):]
        good = good[:good.index("</tr>")]
        assert "badge healthy" in good and "cannot be opened" not in good, good


def test_the_event_browser_of_a_broken_channel_says_why(broken: str) -> None:
    operator = Client()
    operator.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    response = operator.get("/channels/bad/events")
    assert response.status_code == 503
    html = response.content.decode()
    assert "This channel cannot be opened: " in html and escape(broken) in html
    assert "No events yet" not in html
    assert operator.get("/channels/good/events").status_code == 200
