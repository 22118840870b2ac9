"""GET /api/v1/channels/{name}/partitions/{p}/batches?start=S&end=E — the raw record
batches holding offsets [S, E) of one partition, for readers that do not share the
appliance's disks (the Spark exporter's executors on a cluster).

The body (application/vnd.weir.batches) is the Kafka record batches as the segment
files hold them — decrypted when the channel is encrypted — back to back; the first may
begin before S and the last end after E, so a reader keeps offsets in [S, E) only.
Only committed events are served: E may not pass the partition's last stable offset
(416 offset-out-of-range otherwise, as for a range below the log start: the problem names
log_start_offset and last_stable_offset). Role: consume.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request

from appliance import channels
from appliance.api.base import ApiView
from appliance.api.events import check_partition
from appliance.api.problems import Problem
from appliance.api.schema import errors
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


class BatchesView(ApiView):
    """Stream the raw record batches of an offset range."""

    role = "consume"

    @extend_schema(operation_id="partition_batches", parameters=[
        OpenApiParameter("partition", {"type": "integer", "minimum": 0}, OpenApiParameter.PATH),
        BatchRange], responses={
        (200, MEDIA_TYPE): OpenApiResponse({"type": "string", "format": "binary"},
                                           description="record batches, back to back"),
        **errors(400, 404, 416, 503)})
    def get(self, request: Request, name: str, partition: int) -> Any:
        """Raw batches for offsets [start, end)."""
        row = self.row
        wanted = BatchRange(data=request.query_params)
        wanted.is_valid(raise_exception=True)
        start, end = wanted.validated_data["start"], wanted.validated_data["end"]
        check_partition(row, partition)
        status = channels.open_channel(row).status()["partitions"][partition]
        if start < status["log_start_offset"] or end > status["last_stable_offset"]:
            raise Problem(416, "offset-out-of-range",
                          f"partition {partition} of {name!r} serves offsets "
                          f"[{status['log_start_offset']}, {status['last_stable_offset']}), "
                          f"not [{start}, {end})", field="start" if start < status[
                              "log_start_offset"] else "end",
                          log_start_offset=status["log_start_offset"],
                          last_stable_offset=status["last_stable_offset"])
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
