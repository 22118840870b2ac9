"""X-Forwarded-For and X-Forwarded-Proto are believed only from the front (appliance/proxy.py):
from gunicorn's unix socket (REMOTE_ADDR "") by default, or a listed address."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from appliance.proxy import TrustedProxyMiddleware

SPOOF = {"HTTP_X_FORWARDED_FOR": "6.6.6.6", "HTTP_X_FORWARDED_PROTO": "https"}


def seen(peer: str, **meta: str) -> tuple[str, bool]:
    """(REMOTE_ADDR, is_secure()) as the views see a request from `peer`."""
    request = RequestFactory().get("/", REMOTE_ADDR=peer, **meta)
    got: list[tuple[str, bool]] = []

    def view(req: HttpRequest) -> HttpResponse:
        got.append((req.META["REMOTE_ADDR"], req.is_secure()))
        return HttpResponse()

    TrustedProxyMiddleware(view)(request)
    return got[0]


def test_it_believes_the_front_on_the_unix_socket() -> None:
    assert seen("", HTTP_X_FORWARDED_FOR="1.2.3.4", HTTP_X_FORWARDED_PROTO="https") == (
        "1.2.3.4", True)
    # a chain: only the entry the front added counts
    assert seen("", HTTP_X_FORWARDED_FOR="6.6.6.6, 1.2.3.4")[0] == "1.2.3.4"
    assert seen("", HTTP_X_FORWARDED_FOR="not-an-address")[0] == ""


def test_it_ignores_forwarding_headers_from_anyone_else() -> None:
    assert seen("127.0.0.1", **SPOOF) == ("127.0.0.1", False)
    assert seen("10.0.0.9", **SPOOF) == ("10.0.0.9", False)


@override_settings(WEIR_TRUSTED_PROXIES=["10.0.0.0/8"])
def test_it_believes_a_listed_tcp_front_only() -> None:
    assert seen("10.0.0.9", **SPOOF) == ("6.6.6.6", True)
    assert seen("", **SPOOF) == ("", False)  # "unix" not listed
    assert seen("192.168.1.1", **SPOOF) == ("192.168.1.1", False)
