"""The raw batches endpoint (appliance/api/batches.py): an unencrypted range goes to the WSGI
server's file wrapper as a slice of the segment file (so gunicorn sendfile()s it), an
encrypted one as the engine's opened batches; one segment per answer, X-Weir-Range naming
what it covers, and a reader asking again gets the whole range — through a real gunicorn."""
from __future__ import annotations

import os
import urllib.request
import wsgiref.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from appliance_helpers import channel_row, token_client
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import override_settings
from test_gunicorn import gunicorn, manage

from appliance import channels
from appliance.models import ApiToken
from appliance.models import Channel as ChannelRow
from channel_engine import Channel, ChannelConfig
from channel_engine.encryption import KeyRing
from channel_engine.log import record_batch

PUTS, PER_PUT = 30, 10  # 300 events in batches of about 560 bytes: several 4 KiB segments


def body(offset: int) -> bytes:
    return b"event-%05d-" % offset + b"x" * 30


def fill(channel: Channel) -> None:
    for first in range(0, PUTS * PER_PUT, PER_PUT):
        with channel.put() as tx:
            for offset in range(first, first + PER_PUT):
                tx.put(body(offset))


def records(data: bytes) -> list[tuple[int, bytes | None]]:
    """(offset, value) of the records of whole, CRC-valid batches back to back."""
    out, position = [], 0
    while position < len(data):
        header = record_batch.check_batch(data, position, len(data), None, True)
        batch = data[position:position + header.size]
        out += [(offset, value) for offset, _, _, value, _ in record_batch.records(batch)]
        position += header.size
    return out


@pytest.fixture()
def raw(tmp_path: Path) -> Iterator[ChannelRow]:
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path, name="raw", segment_bytes=4096)
        fill(channels.open_channel(row))
        yield row
    channels.close_all()


class RecordingFileWrapper:
    """A WSGI server's wsgi.file_wrapper (PEP 3333) that keeps what it was given: gunicorn's
    FileWrapper sendfile()s `filelike` from its fileno()'s position."""

    def __init__(self, filelike: Any, blksize: int = 8192) -> None:
        self.filelike, self.blksize = filelike, blksize

    def __iter__(self) -> Iterator[bytes]:
        return iter(lambda: self.filelike.read(self.blksize), b"")

    def close(self) -> None:
        self.filelike.close()


def call_wsgi(path: str, query: str, key: str) -> tuple[str, dict[str, str], Any]:
    """Django's WSGI application called as a WSGI server that offers wsgi.file_wrapper."""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query,
               "HTTP_HOST": "testserver", "REMOTE_ADDR": "127.0.0.1",
               "HTTP_AUTHORIZATION": f"Bearer {key}", "wsgi.file_wrapper": RecordingFileWrapper}
    wsgiref.util.setup_testing_defaults(environ)
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answer["status"], answer["headers"] = status, dict(headers)
    result = WSGIHandler()(environ, start_response)
    return answer["status"], answer["headers"], result


@pytest.mark.django_db
def test_an_unencrypted_range_goes_to_the_file_wrapper_as_a_slice_of_the_segment(
        raw: ChannelRow) -> None:
    _, key = ApiToken.issue("test", ["consume"], [raw])
    # as Django's test client does: the request signals must not close the test's database
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        status, headers, result = call_wsgi("/api/v1/channels/raw/partitions/0/batches",
                                            "start=35&end=250", key)
        assert status.startswith("200"), (status, b"".join(result)[:300])
        assert isinstance(result, RecordingFileWrapper)  # not a stream of chunks
        fd = result.filelike.fileno()
        logs = {os.stat(p).st_ino: p for p in
                channels.to_config(raw).partition_dir(0).glob("*.log")}
        assert os.fstat(fd).st_ino in logs  # the segment file itself
        # what gunicorn's sendfile sends: Content-Length bytes from the descriptor's position
        length = int(headers["Content-Length"])
        sent = os.pread(fd, length, os.lseek(fd, 0, os.SEEK_CUR))
        got = records(sent)
        assert got[0][0] <= 35 and headers["X-Weir-Range"] == f"35-{got[-1][0] + 1}"
        assert got == [(o, body(o)) for o in range(got[0][0], got[-1][0] + 1)]
        assert got[-1][0] + 1 < 250  # the segment ended first
        assert b"".join(result) == sent  # a server without sendfile reads the same bytes
        result.close()
        assert result.filelike.closed
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.mark.django_db
def test_the_test_client_gets_exactly_the_slice(raw: ChannelRow) -> None:
    client = token_client("consume", channels=[raw])
    response = client.get("/api/v1/channels/raw/partitions/0/batches?start=35&end=40")
    assert response.status_code == 200 and response["X-Weir-Range"] == "35-40"
    data = b"".join(response.streaming_content)
    assert int(response["Content-Length"]) == len(data)
    assert records(data) == [(o, body(o)) for o in range(30, 40)]


@pytest.mark.django_db
def test_an_encrypted_range_is_the_engines_opened_batches(
        tmp_path: Path, settings: Any) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    settings.WEIR_KEY_DIR = keys
    KeyRing.write_new(keys / "sealed.keys", ["k1"])
    with override_settings(WEIR_DATA_ROOTS=[tmp_path]):
        row = channel_row(tmp_path, name="sealed", segment_bytes=4096,
                          encryption_key_file="sealed.keys", encryption_active_key="k1")
        fill(channels.open_channel(row))
        client = token_client("consume", channels=[row])
        response = client.get("/api/v1/channels/sealed/partitions/0/batches?start=35&end=250")
        assert response.status_code == 200, response.content[:300]
        got = records(response.content)  # plain batches, each with its own valid CRC
        served = int(response["X-Weir-Range"].split("-")[1])
        assert response["X-Weir-Range"] == f"35-{served}" and 35 < served < 250
        assert got == [(o, body(o)) for o in range(got[0][0], served)] and got[0][0] <= 35
    channels.close_all()


@pytest.mark.own_sqlite  # its gunicorn runs on a SQLite database of its own
def test_a_reader_asking_again_gets_a_multi_segment_range_from_a_real_gunicorn(
        tmp_path: Path) -> None:
    env = {**os.environ, "WEIR_VAR_DIR": str(tmp_path / "var"),
           "WEIR_DATA_ROOT": str(tmp_path / "channels")}
    env.pop("DATABASE_URL", None)
    manage(env, "migrate", "--noinput")
    manage(env, "create_channel", "raw", "--set", "minimum_required_space=0",
           "--set", "segment_bytes=4096")
    key = manage(env, "create_token", "reader", "--role", "consume").split()[-1]
    home = tmp_path / "channels" / "raw" / "checkpoint"
    with Channel.open(ChannelConfig.load(home)) as channel, gunicorn(env, workers=2) as url:
        fill(channel)  # this process owns the channel; the workers are its clients
        got: list[tuple[int, bytes | None]] = []
        offset, answers = 17, 0
        while offset < 283:
            request = urllib.request.Request(
                f"{url}/api/v1/channels/raw/partitions/0/batches?start={offset}&end=283",
                headers={"Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(request, timeout=60) as response:
                data = response.read()
                covered = response.headers["X-Weir-Range"]
                assert int(response.headers["Content-Length"]) == len(data)
            batch_records = records(data)
            assert batch_records[0][0] <= offset
            assert covered == f"{offset}-{batch_records[-1][0] + 1}"
            got += [(o, v) for o, v in batch_records if offset <= o < 283]
            offset = batch_records[-1][0] + 1
            answers += 1
        assert got == [(o, body(o)) for o in range(17, 283)]
        assert answers > 3  # one answer per segment
