"""The wire protocol between an export worker and its warm export driver
(export_driver.py): one Unix stream socket, one connection per job.

The request, client to driver, once, with the job's export-run.lock descriptor attached
(SCM_RIGHTS) to its first byte; a request without it, or not whole within
REQUEST_TIMEOUT_S of the connection (export_driver.py), is refused (the descriptor closed):

    offset  size  field    what
    ------  ----  -------  --------------------------------------------------------------
    0       4     magic    b"WEXD"
    4       1     version  1 (REQUEST_VERSION); a driver refuses any other (closes the
                           connection, nothing started, the refusal in its log)
    5       4     length   of the JSON that follows, big-endian, at most MAX_REQUEST
    9       n     JSON     {"argv": the job's arguments (export.py's command line, without
                           `python -m channel_engine.spark.export`), "env": the job's whole
                           environment (the read token is in it)}

The replies, driver to client, frames until the driver closes the connection:

    offset  size  field    what
    ------  ----  -------  --------------------------------------------------------------
    0       1     kind     b"S" started (payload: the driver's pid), b"O" output (bytes of
                           the job's stdout and stderr, and the JVM's, as the fresh
                           process's pipe carries them), b"X" exit (payload: the job's exit
                           status as ASCII digits, "-" first when negative)
    1       4     length   of the payload, big-endian
    5       n     payload

A job is started once "S" came; ended with "X". A connection closed before "S": nothing
was started (the driver ended: idle, or its session failed). Closed after "S" without
"X": the driver died in the job (killed, a JVM crash), as a fresh job's process would.
"""
from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

from channel_engine.errors import DriverProtocolError

MAGIC = b"WEXD"
REQUEST_VERSION = 1
REQUEST = struct.Struct(">4sBI")
FRAME = struct.Struct(">cI")
assert REQUEST.size == 9 and FRAME.size == 5
MAX_REQUEST = 1 << 20
MAX_FRAME = 1 << 20  # the pump sends at most 64 KiB at once
STARTED, OUTPUT, EXIT = b"S", b"O", b"X"


def send_request(sock: socket.socket, argv: list[str], env: dict[str, str], fd: int) -> None:
    """Send a job's request with `fd` (the lock) attached."""
    payload = json.dumps({"argv": argv, "env": env}).encode()
    data = REQUEST.pack(MAGIC, REQUEST_VERSION, len(payload)) + payload
    sent = socket.send_fds(sock, [data], [fd])
    sock.sendall(data[sent:])


def recv_request(sock: socket.socket, timeout_s: float) -> tuple[dict[str, Any], int]:
    """A job's request and the lock descriptor attached to it, within `timeout_s`.
    DriverProtocolError for anything else (the descriptor, if one came, closed)."""
    sock.settimeout(timeout_s)
    data, fds, _, _ = socket.recv_fds(sock, 65536, 1)
    fd = fds[0] if fds else None
    try:
        if fd is None:
            raise DriverProtocolError("a request without the lock's descriptor")
        request = _request(sock, data)
    except BaseException:
        _close(fd)
        raise
    return request, fd


def _request(sock: socket.socket, data: bytes) -> dict[str, Any]:
    """The request whose first bytes are `data`, the rest read from `sock`."""
    data += _recv_whole(sock, REQUEST.size - len(data))
    magic, version, length = REQUEST.unpack_from(data)
    if magic != MAGIC or version != REQUEST_VERSION or length > MAX_REQUEST:
        raise DriverProtocolError(f"a request of magic {magic!r}, version {version}, length "
                            f"{length}; expected {MAGIC!r}, {REQUEST_VERSION}, at most "
                            f"{MAX_REQUEST}")
    data += _recv_whole(sock, REQUEST.size + length - len(data))
    try:
        request = json.loads(data[REQUEST.size:REQUEST.size + length])
    except ValueError as exc:
        raise DriverProtocolError(f"a request that is not JSON: {exc}") from exc
    if not isinstance(request, dict) or not isinstance(request.get("argv"), list) or \
            not isinstance(request.get("env"), dict):
        raise DriverProtocolError(f"a request without argv and env: {str(request)[:80]}")
    return request


def send_frame(sock: socket.socket, kind: bytes, payload: bytes) -> None:
    """Send one reply frame."""
    sock.sendall(FRAME.pack(kind, len(payload)) + payload)


def recv_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """The next reply frame (kind, payload); None when the driver closed the connection
    (also when it died within a frame)."""
    header = _recv_exact(sock, FRAME.size)
    if header is None:
        return None
    kind, length = FRAME.unpack(header)
    if kind not in (STARTED, OUTPUT, EXIT) or length > MAX_FRAME:
        raise DriverProtocolError(f"a reply frame of kind {kind!r}, length {length} (at most "
                            f"{MAX_FRAME})")
    payload = _recv_exact(sock, length)
    return None if payload is None else (kind, payload)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def _recv_whole(sock: socket.socket, size: int) -> bytes:
    data = _recv_exact(sock, size) if size > 0 else b""
    if data is None:
        raise DriverProtocolError("the request ended early")
    return data


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)
