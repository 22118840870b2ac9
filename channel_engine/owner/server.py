"""OwnerServer: the owner process answers the other processes that share its channel.

A thread per connection (socketserver's ThreadingUnixStreamServer) runs each
request against the ChannelOwner, which is thread-safe: the ChannelOwner method
named by the request's op, with its arguments and result translated as the
table protocol.OPERATIONS says (owner/protocol.py). Takes are tied to the
connection that began them: when a connection closes — its process exited or
was killed — its open takes roll back, so a dead consumer never wedges the
channel or loses its events. A take begun with a lease is the exception:
whoever knows its id may commit it (a web worker other than the one that began
it), and its lease returns it otherwise.

Only processes of the owner's user may connect: the socket file is 0600 and
every peer's uid is checked with SO_PEERCRED. A directory in place of the socket file
is moved aside (`owner.sock.stray`); a socket that cannot be made fails the owner's open
with UnusableFileError naming the path. Stopping removes only the socket file this
server bound, in the home it bound it in: when a deleted channel is recreated at the same
path, a process still closing the old channel's owner never removes the new owner's
socket (which would leave the new owner holding the lock where no one can reach it).
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import struct
import threading
import time
from pathlib import Path
from typing import Any

from channel_engine.atomic_file import move_aside
from channel_engine.errors import UnknownOperationError, UnusableFileError
from channel_engine.filenames import SOCKET_NAME, STRAY_SUFFIX
from channel_engine.owner import protocol
from channel_engine.queue.channel_owner import ChannelOwner

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
log = logging.getLogger(__name__)


class OwnerServer:
    """Serve a ChannelOwner on `<home>/owner.sock` until stop()."""

    def __init__(self, owner: ChannelOwner) -> None:
        self.owner = owner
        self.path = owner.config.home / SOCKET_NAME
        self._dir_fd = os.open(owner.config.home, os.O_RDONLY | os.O_DIRECTORY)
        self._server = _Server(socket_path(self.path, self._dir_fd), _Handler, self)
        os.chmod(self.path, 0o600)
        bound = os.stat(SOCKET_NAME, dir_fd=self._dir_fd)
        self._bound = (bound.st_dev, bound.st_ino)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name=f"weir-owner-{owner.name}", daemon=True)

    def start(self) -> None:
        """Start answering in a background thread."""
        self._thread.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop answering: accept nothing more, let requests in progress finish and send
        their replies (up to grace_s), close every connection (their takes roll back) and
        remove the socket."""
        self._server.shutdown()
        self._server.stopping = True
        self._server.close_connections(idle_only=True)
        deadline = time.monotonic() + grace_s
        while self._server.busy_connections() and time.monotonic() < deadline:
            time.sleep(0.005)
        self._server.close_connections(idle_only=False)
        self._server.server_close()
        self._unlink_own_socket()
        os.close(self._dir_fd)

    def _unlink_own_socket(self) -> None:
        # through the home this server bound in, and only the file it bound: a deleted
        # channel's home recreated at the same path has a new owner whose owner.sock this
        # must never remove (its clients could no longer reach it)
        with contextlib.suppress(OSError):
            current = os.stat(SOCKET_NAME, dir_fd=self._dir_fd)
            if (current.st_dev, current.st_ino) == self._bound:
                os.unlink(SOCKET_NAME, dir_fd=self._dir_fd)


def socket_path(path: Path, dir_fd: int) -> str:
    """A name for bind/connect under the 108-byte AF_UNIX limit: the real path when short,
    else the same file reached through the home directory's descriptor in /proc."""
    name = str(path)
    if len(name.encode()) < 100:
        return name
    return f"/proc/self/fd/{dir_fd}/{path.name}"


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = socket.SOMAXCONN  # many client threads connect at once

    def __init__(self, address: str, handler: type[_Handler], owner_server: OwnerServer) -> None:
        self.owner_server = owner_server
        self.connections: dict[socket.socket, bool] = {}  # connection -> busy with a request
        self.connections_lock = threading.Lock()
        self.stopping = False
        try:
            os.unlink(address)  # a dead owner's socket file; we hold the lock now
        except FileNotFoundError:
            pass
        except IsADirectoryError:  # no owner's: kept aside, never deleted
            move_aside(owner_server.path, STRAY_SUFFIX)
        try:
            super().__init__(address, handler)
        except OSError as exc:
            raise UnusableFileError(owner_server.path, "the owner's socket", exc) from exc

    def verify_request(self, request: Any, client_address: Any) -> bool:
        creds = request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        _pid, uid, _gid = _PEERCRED.unpack(creds)
        return bool(uid == os.getuid())

    def close_connections(self, idle_only: bool) -> None:
        with self.connections_lock:
            for conn, busy in list(self.connections.items()):
                if busy and idle_only:
                    continue
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def busy_connections(self) -> int:
        with self.connections_lock:
            return sum(self.connections.values())

    def set_busy(self, conn: socket.socket, busy: bool) -> bool:
        """Mark a connection busy or idle; False if the server is stopping (idle: close)."""
        with self.connections_lock:
            self.connections[conn] = busy
            return not self.stopping


class _Handler(socketserver.BaseRequestHandler):
    """One connection: requests in order; its open takes roll back when it closes."""

    server: _Server

    def handle(self) -> None:
        owner = self.server.owner_server.owner
        takes: set[int] = set()
        sock = self.request
        if not self.server.set_busy(sock, False):
            return
        try:
            while True:
                try:
                    request = protocol.receive(sock)
                except (ConnectionResetError, BrokenPipeError, EOFError):
                    return  # the client went away
                except ConnectionError as exc:  # out of step: the client only sees the close
                    log.warning("channel %r: closed a client's connection to the owner: %s",
                                owner.name, exc)
                    return
                except OSError:
                    return
                self.server.set_busy(sock, True)
                try:
                    reply = [0, _dispatch(owner, request, takes)]
                except Exception as exc:  # the client re-raises it
                    reply = protocol.error_to_wire(exc)
                try:
                    protocol.send(sock, reply)
                except OSError:
                    return
                if not self.server.set_busy(sock, False):
                    return  # the owner is stopping: the reply went out, now close
        finally:
            with self.server.connections_lock:
                self.server.connections.pop(sock, None)
            for take_id in takes:
                try:
                    owner.rollback_take(take_id)
                except Exception:  # the owner is closing: the take returns on reopen anyway
                    pass


def _dispatch(owner: ChannelOwner, request: list[Any], takes: set[int]) -> Any:
    """Answer one request with the owner's method of its op's name (protocol.OPERATIONS);
    keep `takes`, the unleased takes this connection holds, up to date."""
    version, name, args = request
    if version not in protocol.ANSWERED_VERSIONS:
        raise ValueError(f"owner protocol version {version} is not supported "
                         f"(this owner speaks {protocol.VERSION})")
    if name == protocol.HELLO:
        return {"pid": os.getpid(), "name": owner.name, "version": protocol.VERSION}
    op = protocol.OPERATIONS.get(name)
    if op is None:
        raise UnknownOperationError(name)
    op.check_arguments(args, version)
    args = op.args_from_wire(args)
    if op.takes == "ends":  # gone from the connection even if ending it fails
        takes.discard(args[0])
    result = getattr(owner, op.name)(*args)
    if op.takes == "begins" and (not args or args[0] is None):
        takes.add(result)  # a leased take outlives its connection: its lease bounds it
    return op.result_to_wire(result)
