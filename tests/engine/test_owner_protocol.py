"""Frames of the owner socket (owner/protocol.py): a small frame is read whole, a large or
split one is put together, and bytes past a frame or a frame cut short are refused."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from channel_engine.owner import protocol


class CountedSocket:
    """A socket whose recv calls are counted."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.recvs = 0

    def recv(self, size: int) -> bytes:
        self.recvs += 1
        return self.sock.recv(size)


def test_it_reads_a_small_frame_in_one_recv() -> None:
    left, right = socket.socketpair()
    request = [4, "commit_batches", [None, [[0, b"x" * 300]], 3, True]]
    with left, right:
        protocol.send(left, request)
        counted = CountedSocket(right)
        assert protocol.receive(counted) == request  # type: ignore[arg-type]
        assert counted.recvs == 1


def test_it_puts_together_a_frame_larger_than_the_first_read() -> None:
    left, right = socket.socketpair()
    value = [0, b"y" * (3 * protocol.FIRST_READ)]
    with left, right:
        sender = threading.Thread(target=protocol.send, args=(left, value))
        sender.start()
        assert protocol.receive(right) == value
        sender.join()


def test_it_waits_for_the_rest_of_a_split_length_prefix() -> None:
    left, right = socket.socketpair()
    frame = protocol.LENGTH.pack(3) + b"\x92\x01\x02"  # MessagePack [1, 2]
    with left, right:
        left.sendall(frame[:2])

        def rest() -> None:
            time.sleep(0.05)
            left.sendall(frame[2:])

        sender = threading.Thread(target=rest)
        sender.start()
        assert protocol.receive(right) == [1, 2]
        sender.join()


def test_it_refuses_bytes_past_a_frame_as_a_peer_out_of_step() -> None:
    left, right = socket.socketpair()
    with left, right:
        protocol.send(left, [0, None])
        protocol.send(left, [0, None])
        time.sleep(0.01)
        with pytest.raises(ConnectionError, match="bytes past a frame"):
            protocol.receive(right)


def test_it_refuses_bytes_past_a_frame_larger_than_the_first_read() -> None:
    left, right = socket.socketpair()
    with left, right:
        # room for both frames in the buffers: sendall returns with everything sent
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        right.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        large = protocol.frame([0, b"y" * (2 * protocol.FIRST_READ)])
        left.sendall(large + protocol.frame([0, None]))
        with pytest.raises(ConnectionError, match="bytes past a frame"):
            protocol.receive(right)
    left, right = socket.socketpair()  # the same large frame alone is read whole
    with left, right:
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        right.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        left.sendall(large)
        assert protocol.receive(right) == [0, b"y" * (2 * protocol.FIRST_READ)]


def test_a_frame_cut_short_is_a_connection_error_and_none_at_all_is_eof() -> None:
    left, right = socket.socketpair()
    with right:
        left.sendall(protocol.LENGTH.pack(10) + b"abc")
        left.close()
        with pytest.raises(ConnectionError, match="middle of a frame"):
            protocol.receive(right)
    left, right = socket.socketpair()
    with right:
        left.close()
        with pytest.raises(EOFError):
            protocol.receive(right)


def test_it_refuses_bytes_past_a_large_frame_above_descriptor_1024() -> None:
    # select() takes no descriptor >= FD_SETSIZE (1024), and a process with many files open
    # (a web worker with the segments of many channels) has such sockets: the check after
    # a large frame polls, and must tell waiting bytes from none there too
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        large = protocol.frame([0, b"y" * (2 * protocol.FIRST_READ)])
        for trailing, expected in ((b"", "read"), (protocol.frame([0, None]), "refused")):
            left, right = socket.socketpair()
            with left, right:
                assert right.fileno() >= 1024
                left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                right.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
                left.sendall(large + trailing)
                try:
                    protocol.receive(right)
                    outcome = "read"
                except ConnectionError:
                    outcome = "refused"
                assert outcome == expected
    finally:
        for fd in spare:
            os.close(fd)
