"""Request bodies sent with Transfer-Encoding: chunked (no Content-Length).

Django reads a body only as far as CONTENT_LENGTH says, so under gunicorn (which
de-chunks the stream but cannot know its length in advance) such a body reads as
empty: a produce was refused as "not valid JSON", a PATCH changed nothing. This
middleware reads the whole de-chunked body first, up to DATA_UPLOAD_MAX_MEMORY_SIZE
(WEIR_MAX_PRODUCE_BYTES), and hands it on with its length set, so every view sees
it as if it had been sent with a Content-Length. A longer body is answered 413 in
the API's error shape (a body-too-large problem, appliance/api/problems.py) without
reading the rest; a body cut off mid-chunk is answered 400 (parse-error).
"""
from __future__ import annotations

import io
from collections.abc import Callable

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse

from appliance.api.problems import Problem


class ChunkedBodyMiddleware:
    """Give a chunked request body its length before any view or parser reads it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        meta = request.META
        chunked = "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower()
        if chunked and not meta.get("CONTENT_LENGTH") and "wsgi.input" in meta:
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            try:
                body = meta["wsgi.input"].read(limit + 1)
            # any failure here is the client's body: gunicorn raises its own ParseException
            # kinds (not OSError) for a malformed or cut-off chunk
            except Exception as exc:  # noqa: BLE001
                return Problem(400, "parse-error",
                               f"the chunked body could not be read: {exc}").response()
            if len(body) > limit:
                return Problem(413, "body-too-large", f"body over {limit} bytes "
                                                      "(WEIR_MAX_PRODUCE_BYTES)").response()
            meta["CONTENT_LENGTH"] = str(len(body))
            request._stream = LimitedStream(io.BytesIO(body), len(body))  # type: ignore[attr-defined]
        return self.get_response(request)
