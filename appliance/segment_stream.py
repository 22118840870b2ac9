"""GET /api/v1/channels/{name}/partitions/{p}/batches?start=S&end=E — the raw record
batches holding offsets [S, E) of one partition, for readers that do not share the
appliance's disks (the Spark exporter's executors on a cluster).

The body (application/vnd.weir.batches) is the Kafka record batches as the segment
files hold them — decrypted when the channel is encrypted — back to back; the first may
begin before S and the last end after E, so a reader keeps offsets in [S, E) only.
Only committed events are served: E may not pass the partition's last stable offset
(416 otherwise, as for a range below the log start). Role: consume.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from appliance import channels, row_cache
from appliance.permissions import HasRole
from appliance.produce import errors
from channel_engine import Channel as EngineChannel
from channel_engine import OffsetOutOfRangeError
from channel_engine.log import record_batch

MEDIA_TYPE = "application/vnd.weir.batches"
CHUNK_BYTES = 4 << 20


class BatchRange(serializers.Serializer):
    """The offsets wanted: [start, end)."""

    start = serializers.IntegerField(min_value=0, max_value=2**63 - 1)
    end = serializers.IntegerField(min_value=1, max_value=2**63 - 1)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": "must be greater than start"})
        return attrs


_RANGE_ERROR = {"type": "object", "required": ["error"], "properties": {
    "error": {"type": "string"}, "log_start_offset": {"type": "integer"},
    "last_stable_offset": {"type": "integer"}}}


class BatchesView(APIView):
    """Stream the raw record batches of an offset range."""

    permission_classes = [HasRole]
    role = "consume"

    @extend_schema(operation_id="partition_batches", parameters=[
        OpenApiParameter("partition", {"type": "integer", "minimum": 0}, OpenApiParameter.PATH),
        BatchRange], responses={
        (200, MEDIA_TYPE): OpenApiResponse({"type": "string", "format": "binary"},
                                           description="record batches, back to back"),
        **errors(400, 404, 416, 503, html404=True, e416=_RANGE_ERROR)})
    def get(self, request: Request, name: str, partition: int) -> Any:
        """Raw batches for offsets [start, end)."""
        row = row_cache.channel(name)
        if row is None:
            raise NotFound(f"no channel {name!r}")
        self.check_object_permissions(request, row)
        wanted = BatchRange(data=request.query_params)
        wanted.is_valid(raise_exception=True)
        start, end = wanted.validated_data["start"], wanted.validated_data["end"]
        if partition >= row.partitions:
            return Response({"partition": [f"channel {name!r} has partitions 0.."
                                           f"{row.partitions - 1}"]}, status=400)
        status = channels.open_channel(row).status()["partitions"][partition]
        if start < status["log_start_offset"] or end > status["last_stable_offset"]:
            return Response({"error": f"partition {partition} of {name!r} serves offsets "
                                      f"[{status['log_start_offset']}, "
                                      f"{status['last_stable_offset']}), not [{start}, {end})",
                             "log_start_offset": status["log_start_offset"],
                             "last_stable_offset": status["last_stable_offset"]}, status=416)
        snapshot = EngineChannel.open(channels.to_config(row), read_only=True)
        response = StreamingHttpResponse(_batches(snapshot, partition, start, end),
                                         content_type=MEDIA_TYPE)
        response["X-Weir-Range"] = f"{start}-{end}"
        return response


def _batches(snapshot: EngineChannel, partition: int, start: int, end: int) -> Iterator[bytes]:
    """The batches of [start, end), plain, in chunks of about CHUNK_BYTES."""
    try:
        owner = snapshot.owner
        assert owner is not None
        log = owner.logs[partition]
        offset, pending, size = start, [], 0
        while offset < end:
            read = list(log.read_batches(offset, end, CHUNK_BYTES))
            if not read:
                raise OffsetOutOfRangeError(offset, log.log_start_offset, log.high_watermark)
            for _, header, data in read:
                plain = bytes(data)
                if header.attributes & record_batch.ENCRYPTED_MASK:
                    opened = bytearray(record_batch.unseal(plain, log.sealer))
                    struct.pack_into(">I", opened, 17, record_batch.compute_crc(opened))
                    plain = bytes(opened)  # a batch like any other, its CRC its own
                pending.append(plain)
                size += len(plain)
                offset = header.next_offset
            if size >= CHUNK_BYTES:
                yield b"".join(pending)
                pending, size = [], 0
        if pending:
            yield b"".join(pending)
    finally:
        snapshot.close()
