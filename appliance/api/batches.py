"""GET /api/v1/channels/{name}/partitions/{p}/batches?start=S&end=E — the raw record
batches of offsets from S toward E of one partition, for readers that do not share the
appliance's disks (the Spark exporter's executors on a cluster). Role: consume.

One answer carries the batches of one segment at most — the engine's fetch
(Channel.fetch, channel_engine/log/fetch.py), as a Kafka broker answers a fetch — so a
reader asks again from where it stopped until it has [S, E). The body
(application/vnd.weir.batches) is whole Kafka record batches back to back: the first may
begin before S and the last end after E, so a reader keeps offsets in [S, E) only. The
header `X-Weir-Range: S-N` says which offsets the answer covers: [S, N), N the offset
after its last batch (the next request's start; N < E when the segment ended first).
Batches are served as the engine hands them out and never touched here: an unencrypted
range is a slice of the segment file, sent zero-copy (Django's FileResponse goes through
the WSGI server's wsgi.file_wrapper, and gunicorn sendfile()s it from the descriptor's
position for Content-Length bytes); an encrypted one is the engine's opened batches
(decrypted, each with its own CRC). A reader checks each batch's CRC, as a Kafka consumer
does.

Only committed events are served: E may not pass the partition's last stable offset, and
S must lie in [log start, last stable offset) (416 offset-out-of-range otherwise: the
problem names log_start_offset and last_stable_offset).
"""
from __future__ import annotations

from typing import Any

from django.http import FileResponse, HttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.events import check_partition
from appliance.api.problems import Problem
from appliance.api.schema import errors
from channel_engine import Channel as EngineChannel
from channel_engine import FetchData

MEDIA_TYPE = "application/vnd.weir.batches"


class BatchRange(serializers.Serializer):
    """The offsets wanted: [start, end)."""

    start = serializers.IntegerField(min_value=0, max_value=2**63 - 1)
    end = serializers.IntegerField(min_value=1, max_value=2**63 - 1)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": "must be greater than start"})
        return attrs


class BatchesView(ApiView):
    """Send the raw record batches of an offset range, one segment's at most."""

    role = "consume"

    @extend_schema(operation_id="partition_batches", parameters=[
        OpenApiParameter("partition", {"type": "integer", "minimum": 0}, OpenApiParameter.PATH),
        BatchRange,
        OpenApiParameter("X-Weir-Range", {"type": "string", "pattern": r"^[0-9]+-[0-9]+$"},
                         OpenApiParameter.HEADER, response=[200],
                         description="S-N: the answer covers offsets [S, N); ask again "
                                     "from N while N < end")], responses={
        (200, MEDIA_TYPE): OpenApiResponse({"type": "string", "format": "binary"},
                                           description="whole record batches of one segment, "
                                                       "back to back"),
        **errors(400, 404, 416, 503)})
    def get(self, request: Request, name: str, partition: int) -> Any:
        """Raw batches from start toward end, one segment's at most."""
        row = self.row
        wanted = BatchRange(data=request.query_params)
        wanted.is_valid(raise_exception=True)
        start, end = wanted.validated_data["start"], wanted.validated_data["end"]
        check_partition(row, partition)
        # the live owner's last stable offset: a read-only snapshot cannot tell a put in
        # doubt from a committed one
        status = channels.open_channel(row).status()["partitions"][partition]
        if start < status["log_start_offset"] or end > status["last_stable_offset"]:
            raise Problem(416, "offset-out-of-range",
                          f"partition {partition} of {name!r} serves offsets "
                          f"[{status['log_start_offset']}, {status['last_stable_offset']}), "
                          f"not [{start}, {end})", field="start" if start < status[
                              "log_start_offset"] else "end",
                          log_start_offset=status["log_start_offset"],
                          last_stable_offset=status["last_stable_offset"])
        with EngineChannel.open(channels.to_config(row), read_only=True) as snapshot:
            fetched = snapshot.fetch(partition, start, end)  # outlives the snapshot
        response = _body(fetched)
        response["X-Weir-Range"] = f"{start}-{fetched.next_offset}"
        return response


def _body(fetched: FetchData) -> HttpResponse | FileResponse:
    """A file slice as a FileResponse (its Content-Length the slice's, for sendfile), or
    the opened bytes."""
    if isinstance(fetched.records, bytes):
        return HttpResponse(fetched.records, content_type=MEDIA_TYPE)
    return FileResponse(fetched.records, content_type=MEDIA_TYPE)
