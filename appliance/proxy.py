"""Believe X-Forwarded-For and X-Forwarded-Proto only from the front.

The front (appliance/front.py) sets both on every request it passes on: X-Forwarded-For
to the address it saw (replacing any value a client sent), X-Forwarded-Proto to its
scheme. WEIR_TRUSTED_PROXIES lists the peers allowed to say so: "unix" (the default) is a
peer on gunicorn's unix socket, which only the front reaches (scripts/run.sh keeps it in a
0700 directory; docker-compose.yml shares it with the nginx service alone); IP addresses
and networks name a front reaching gunicorn over TCP.

From a trusted peer, REMOTE_ADDR becomes the last X-Forwarded-For entry (the one the front
added) and X-Forwarded-Proto stays for SECURE_PROXY_SSL_HEADER. From any other peer both
headers are dropped before anything reads them, so a client talking to gunicorn directly
(WEIR_FRONT=none) cannot pose as another address or as HTTPS. Runs first of all middleware.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from appliance.env import UNIX_PEER

FORWARDED = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO")


class TrustedProxyMiddleware:
    """Apply the front's forwarding headers, or drop them when the peer is not the front."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        entries = settings.WEIR_TRUSTED_PROXIES
        self.unix = UNIX_PEER in entries
        self.networks = [ipaddress.ip_network(e, strict=False) for e in entries
                         if e != UNIX_PEER]

    def __call__(self, request: HttpRequest) -> HttpResponse:
        """Rewrite request.META, then go on."""
        meta = request.META
        if self.trusted(str(meta.get("REMOTE_ADDR") or "")):
            client = forwarded_client(str(meta.get("HTTP_X_FORWARDED_FOR") or ""))
            if client:
                meta["REMOTE_ADDR"] = client
        else:
            for name in FORWARDED:
                meta.pop(name, None)
        return self.get_response(request)

    def trusted(self, peer: str) -> bool:
        """True for the front: the unix socket's peer ("") or a listed address."""
        if not peer:
            return self.unix
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


def forwarded_client(header: str) -> str | None:
    """The last X-Forwarded-For entry when it is an IP address, else None."""
    last = header.rsplit(",", 1)[-1].strip()
    try:
        return str(ipaddress.ip_address(last))
    except ValueError:
        return None
