"""The floor for bench/http_small.py: a WSGI app that reads the request body and answers
200 with a small JSON, as a produce does, with nothing else (no framework, no disk)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Read the body, answer 200."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    environ["wsgi.input"].read(length)
    body = b'{"events": 1, "committed": [{"partition": 0, "first_offset": 0, "last_offset": 0}]}'
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]
