"""OwnerServer: the owner process answers the other processes that share its channel.

One thread, the loop, waits on every idle connection at once (a selector) and reads the
request of each that is ready. It answers the short ones itself (protocol.Op.inline:
puts, takes, reads, offsets; never one that waits for another client). Puts
(commit_batches): it begins every put of the round (checks, room, appends:
queue/puts.py), then finishes them in order, so the puts that arrived together share one
fsync (the first finish's group commit covers the rest), and replies to each. Take
commits (commit_take) likewise: the round's commits are begun (journalled), then waited
for together, one journal fsync for them all (unless another waiter's fsync covers them
already), so neither a put nor another consumer waits behind each consumer's own fsync.
A commit is acknowledged only after that fsync returned; its effect is seen by the rest
of the round before (a rollback of that take is refused as committed), and if the fsync
fails or the machine stops first, its events come back, as any unacknowledged commit's
(commit_journal: a failed fsync fails every later commit until a checkpoint). A request
answered this way costs no thread hand-off and no fight for the GIL among the
connections' threads (bench/README.md, owner_rtt.py: with a thread per connection, 8
client threads' fsync'd puts cost the owner 180-300 us of CPU each, 70-100 us now). The
others (status, checkpoints, flushes, retention, subscription changes), a put that would
wait for room (Flume's keep-alive: the loop never waits for it), and a frame larger than
one recv go to the connection's own thread (made the first time it needs one, kept until
the connection closes), which answers it and hands the connection back to the loop:
requests on a connection are answered in order, one at a time, as the protocol says.

Each request runs against the ChannelOwner, which is thread-safe: the ChannelOwner method
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
with UnusableFileError naming the path. Stopping lets the requests in progress finish and
send their replies (up to a grace period; a client stopped halfway through sending a
request has none in progress), then closes every connection (their takes roll back), and
removes only the socket file this
server bound, in the home it bound it in: when a deleted channel is recreated at the same
path, a process still closing the old channel's owner never removes the new owner's
socket (which would leave the new owner holding the lock where no one can reach it).
"""
from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from channel_engine.atomic_file import move_aside
from channel_engine.errors import RoomWouldWait, UnknownOperationError, UnusableFileError
from channel_engine.filenames import SOCKET_NAME, STRAY_SUFFIX
from channel_engine.owner import protocol
from channel_engine.queue.channel_owner import ChannelOwner
from channel_engine.queue.puts import PendingPut

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
log = logging.getLogger(__name__)


class OwnerServer:
    """Serve a ChannelOwner on `<home>/owner.sock` until stop()."""

    def __init__(self, owner: ChannelOwner) -> None:
        self.owner = owner
        self.path = owner.config.home / SOCKET_NAME
        self._dir_fd = os.open(owner.config.home, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._listener = _listen(self.path, socket_path(self.path, self._dir_fd))
        except BaseException:
            os.close(self._dir_fd)
            raise
        try:
            self._set_up()
        except BaseException:  # nothing of it left open
            self._listener.close()
            os.close(self._dir_fd)
            raise

    def _set_up(self) -> None:
        """The rest of __init__, once the socket listens."""
        owner = self.owner
        bound = os.stat(SOCKET_NAME, dir_fd=self._dir_fd)
        self._bound = (bound.st_dev, bound.st_ino)
        self._selector = selectors.DefaultSelector()
        try:
            self._wake_r, self._wake_w = socket.socketpair()
        except BaseException:
            self._selector.close()
            raise
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._lock = threading.Lock()  # guards the fields below and each connection's busy
        self._connections: set[_Connection] = set()
        self._returned: deque[_Connection] = deque()  # handed back to the loop by their thread
        self._stopping = False
        # the round's partition logs fsynced side by side (_flush_round): made once, its
        # threads started as first needed; none for one partition, where the loop flushes
        self._flushers = (ThreadPoolExecutor(min(owner.config.partitions - 1, _FLUSHERS_MAX),
                                             f"weir-owner-{owner.name}-flush")
                          if owner.config.partitions > 1 else None)
        self._thread = threading.Thread(target=self._loop, name=f"weir-owner-{owner.name}",
                                        daemon=True)

    def start(self) -> None:
        """Start answering in a background thread."""
        self._thread.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop answering: accept nothing more, let requests in progress finish and send
        their replies (up to grace_s), close every connection (their takes roll back) and
        remove the socket."""
        with self._lock:
            self._stopping = True
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()  # it ends its round first: its replies went out
        with self._lock:
            idle = [conn for conn in self._connections if not conn.busy]
        for conn in idle:
            self._close(conn)
        deadline = time.monotonic() + grace_s
        while self._busy() and time.monotonic() < deadline:
            time.sleep(0.005)
        with self._lock:
            left = list(self._connections)
        for conn in left:  # past the grace: its thread closes it (and rolls back) when it fails
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        if self._flushers is not None:
            self._flushers.shutdown()
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        self._unlink_own_socket()
        os.close(self._dir_fd)

    def _busy(self) -> bool:
        with self._lock:
            return any(conn.busy for conn in self._connections)

    def _unlink_own_socket(self) -> None:
        # through the home this server bound in, and only the file it bound: a deleted
        # channel's home recreated at the same path has a new owner whose owner.sock this
        # must never remove (its clients could no longer reach it)
        with contextlib.suppress(OSError):
            current = os.stat(SOCKET_NAME, dir_fd=self._dir_fd)
            if (current.st_dev, current.st_ino) == self._bound:
                os.unlink(SOCKET_NAME, dir_fd=self._dir_fd)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: the loop is awake already
            self._wake_w.send(b"\0")

    # -- the loop ---------------------------------------------------------------------
    def _loop(self) -> None:
        """Answer until stop(): accept, read every ready request, answer the puts of the
        round together, hand the rest to the connections' threads."""
        selector = self._selector
        self._listener.setblocking(False)  # _accept takes all that wait, then stops
        selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        while not self._stopping:
            try:
                self._round(selector)
            except Exception:  # a bug: said, and the loop goes on answering
                log.exception("channel %r: the owner's loop failed a round", self.owner.name)
                time.sleep(0.1)  # not a hot spin should it fail again at once

    def _round(self, selector: selectors.BaseSelector) -> None:
        """Wait for ready connections, read a request from each, answer."""
        puts: list[tuple[_Connection, PendingPut | BaseException]] = []
        commits: list[tuple[_Connection, Callable[[], None]]] = []
        try:
            for key, _events in selector.select():
                if key.data is _LISTENER:
                    self._accept()
                elif key.data is _WAKE:
                    self._take_back()
                else:
                    try:
                        self._read(key.data, puts, commits)
                    except Exception:  # a bug: that client loses its connection, not all
                        log.exception("channel %r: a client's request failed in the owner's "
                                      "loop; closing its connection", self.owner.name)
                        self._close(key.data)
        finally:  # a round that fails part way still ends every put and commit it began
            try:
                self._answer_puts(puts)
            finally:
                self._answer_commits(commits)

    def _accept(self) -> None:
        """Take every connection waiting (the listener does not block)."""
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # none left; or out of descriptors: the client retries
                return
            if not _same_user(sock):
                sock.close()
                continue
            sock.setblocking(True)  # its thread, if it gets one, reads and writes blocking
            conn = _Connection(sock)
            try:
                self._selector.register(sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError) as exc:  # e.g. out of epoll watches: not kept open
                log.warning("channel %r: refused a client's connection to the owner: %s",
                            self.owner.name, exc)
                sock.close()
                continue
            with self._lock:
                self._connections.add(conn)

    def _take_back(self) -> None:
        """Listen again on the connections whose thread answered their request."""
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            returned, self._returned = list(self._returned), deque()
        for conn in returned:
            if not conn.closed:
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection,
              puts: list[tuple[_Connection, PendingPut | BaseException]],
              commits: list[tuple[_Connection, Callable[[], None]]]) -> None:
        """Read a ready connection's request: begin a put or a take commit, answer a hello
        or another short request, or hand it on."""
        try:
            request = protocol.receive_started(conn.sock)
        except (ConnectionError, ValueError) as exc:  # ValueError: not msgpack
            if not isinstance(exc, ConnectionResetError | BrokenPipeError):
                log.warning("channel %r: closed a client's connection to the owner: %s",
                            self.owner.name, exc)
            self._close(conn)
            return
        except (EOFError, OSError):  # the client went away
            self._close(conn)
            return
        if isinstance(request, protocol.Incomplete):
            self._hand_off(conn, request)
            return
        try:
            version, name, args = _request(request)
            op = protocol.OPERATIONS.get(name)
            if op is protocol.COMMIT_TAKE:
                self._begin_commit(conn, version, args, commits)
                return
            if name == protocol.HELLO or (op is not None and op.inline
                                          and op is not protocol.COMMIT_BATCHES):
                self._answer(conn, request)
                return
            if op is not protocol.COMMIT_BATCHES:
                self._hand_off(conn, request)
                return
            op.check_arguments(args, version)
            transaction_id, batches, partitions, movable = op.args_from_wire(args)
            puts.append((conn, self.owner.puts.begin(transaction_id, batches, partitions,
                                                     movable, wait=False)))
        except RoomWouldWait:
            self._hand_off(conn, request)
        except Exception as exc:  # the client re-raises it
            puts.append((conn, exc))

    def _begin_commit(self, conn: _Connection, version: int, args: Any,
                      commits: list[tuple[_Connection, Callable[[], None]]]) -> None:
        """Commit a take, answered at once unless it must wait for its journal fsync: then
        at the round's end, with the round's other commits (one fsync for them all)."""
        op = protocol.COMMIT_TAKE
        try:
            op.check_arguments(args, version)
            (take_id,) = op.args_from_wire(args)
            conn.takes.discard(take_id)  # gone from the connection even if ending it fails
            durable = self.owner.takes.begin_commit_take(take_id)
        except Exception as exc:  # the client re-raises it
            self._reply(conn, protocol.error_to_wire(exc))
            return
        if durable is None:
            self._reply(conn, [0, op.result_to_wire(None)])
        else:
            commits.append((conn, durable))

    def _answer_commits(self, commits: list[tuple[_Connection, Callable[[], None]]]) -> None:
        """Wait for the round's take commits to be durable (the first wait's fsync covers
        the others) and reply; a commit is acknowledged only once its record is on disk."""
        for conn, durable in commits:
            try:
                durable()
                reply = [0, protocol.COMMIT_TAKE.result_to_wire(None)]
            except Exception as exc:  # the client re-raises it
                reply = protocol.error_to_wire(exc)
            try:
                self._reply(conn, reply)
            except Exception:  # a bug: that client loses its connection, not the others
                log.exception("channel %r: replying to a take commit failed in the owner's "
                              "loop; closing its connection", self.owner.name)
                self._close(conn)

    def _answer(self, conn: _Connection, request: Any) -> None:
        """Answer a short request in the loop."""
        try:
            reply = [0, _dispatch(self.owner, request, conn.takes)]
        except Exception as exc:  # the client re-raises it
            reply = protocol.error_to_wire(exc)
        self._reply(conn, reply)

    def _answer_puts(self, puts: list[tuple[_Connection, PendingPut | BaseException]]) -> None:
        """Finish the round's puts in order (the first fsync covers the rest) and reply.
        Every begun put is finished (or aborted) even if a reply fails: that one closes
        only its own connection."""
        self._flush_round([put for _, put in puts if isinstance(put, PendingPut)])
        for conn, put in puts:
            try:
                self._reply(conn, self._finish_put(put))
            except Exception:  # a bug: that client loses its connection, not the others
                log.exception("channel %r: replying to a put failed in the owner's loop; "
                              "closing its connection", self.owner.name)
                self._close(conn)

    def _flush_round(self, puts: list[PendingPut]) -> None:
        """fsync the round's partition logs side by side when it wrote to more than one
        (fdatasync lets go of the GIL): the round then costs its slowest fsync, not their
        sum, and each finish finds its batches durable. A flush that fails here fails again
        in its put's finish, which reports it."""
        ends: dict[int, tuple[int, int]] = {}  # partition: (flush to, epoch written in)
        for put in puts:
            for partition, flush_to, epoch in put.flushes:
                ends[partition] = max(ends.get(partition, (0, 0)), (flush_to, epoch))
        if len(ends) < 2 or self._flushers is None:
            return  # one log: finish flushes it, with no hand-off
        logs = self.owner.logs
        (own, own_end), *others = ends.items()
        flushing = [self._flushers.submit(logs[p].flush_to, *end) for p, end in others]
        with contextlib.suppress(Exception):
            logs[own].flush_to(*own_end)  # the loop does one itself
        for future in flushing:
            with contextlib.suppress(Exception):
                future.result()

    def _finish_put(self, put: PendingPut | BaseException) -> list[Any]:
        """A begun put finished (or its begin's error) as the reply to send."""
        if isinstance(put, BaseException):
            return protocol.error_to_wire(put)
        try:
            committed = self.owner.puts.finish(put)
        except Exception as exc:  # finish aborted it: the client re-raises it
            return protocol.error_to_wire(exc)
        return [0, protocol.COMMIT_BATCHES.result_to_wire(committed)]

    def _reply(self, conn: _Connection, reply: list[Any]) -> None:
        """Send a reply from the loop without waiting: what the socket's buffer does not
        take at once (a large take or read, a client slow to read) its connection's thread
        sends, so a client that stops reading never stops the loop. A connection that
        cannot take it is closed."""
        data = protocol.frame(reply)
        try:
            sent = conn.sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(conn)
            return
        if sent < len(data):
            self._hand_off(conn, _Unsent(memoryview(data)[sent:]))

    # -- a connection's own thread ------------------------------------------------------
    def _hand_off(self, conn: _Connection, request: Any) -> None:
        """Give a request to its connection's thread; the loop stops listening to it."""
        self._selector.unregister(conn.sock)
        if not isinstance(request, protocol.Incomplete):  # else busy once it is whole:
            with self._lock:  # a client stalled mid-frame never holds up stop()
                conn.busy = True
        if conn.inbox is None:
            conn.inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(conn, conn.inbox), daemon=True,
                             name=f"weir-owner-{self.owner.name}-conn").start()
        conn.inbox.put(request)

    def _serve(self, conn: _Connection, inbox: queue.SimpleQueue[Any]) -> None:
        """A connection's thread: answer each request the loop hands it, in order. Whatever
        fails here closes the connection (its takes roll back): never a thread gone and its
        connection left open, busy, holding its takes."""
        try:
            while (request := inbox.get()) is not None:
                if not self._serve_one(conn, request):
                    return
        except Exception:  # a bug: that client loses its connection, not its takes
            log.exception("channel %r: a connection's thread failed; closing its connection",
                          self.owner.name)
            self._close(conn)

    def _serve_one(self, conn: _Connection, request: Any) -> bool:
        """Answer one handed-off request; False when the connection was closed."""
        if isinstance(request, _Unsent):  # the rest of a reply the loop began
            return self._send(conn, request.data)
        try:
            if isinstance(request, protocol.Incomplete):
                request = protocol.receive_rest(conn.sock, request)
        except (ConnectionResetError, BrokenPipeError, EOFError):
            self._close(conn)
            return False
        except (ConnectionError, ValueError) as exc:  # too long, out of step, not msgpack
            log.warning("channel %r: closed a client's connection to the owner: %s",
                        self.owner.name, exc)
            self._close(conn)
            return False
        except OSError:
            self._close(conn)
            return False
        with self._lock:
            if conn.closed:  # stop() closed it while the frame was coming: not answered
                return False
            conn.busy = True
        try:
            reply = [0, _dispatch(self.owner, request, conn.takes)]
        except Exception as exc:  # the client re-raises it
            reply = protocol.error_to_wire(exc)
        return self._send(conn, protocol.frame(reply))

    def _send(self, conn: _Connection, data: bytes | memoryview) -> bool:
        """A connection's thread: send the rest of a reply and give the connection back to
        the loop; False when it closed the connection instead (it failed, or the owner is
        stopping)."""
        try:
            conn.sock.sendall(data)
        except OSError:
            self._close(conn)
            return False
        with self._lock:
            conn.busy = False
            stopping = self._stopping
            if not stopping:
                self._returned.append(conn)
        if stopping:  # the owner is stopping: the reply went out, now close
            self._close(conn)
            return False
        self._wake()
        return True

    def _close(self, conn: _Connection) -> None:
        """Close a connection once; its unleased takes roll back."""
        with self._lock:
            if conn.closed:
                return
            conn.closed = True
            conn.busy = False
            self._connections.discard(conn)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)  # the loop's, or not registered
        with contextlib.suppress(OSError):  # wakes its thread if it waits in a recv
            conn.sock.shutdown(socket.SHUT_RDWR)
        conn.sock.close()
        if conn.inbox is not None:
            conn.inbox.put(None)  # its thread ends
        for take_id in conn.takes:
            try:
                self.owner.rollback_take(take_id)
            except Exception:  # the owner is closing: the take returns on reopen anyway
                pass


_FLUSHERS_MAX = 8  # fsyncs of one round side by side: more buy little on a few disks
_LISTENER = object()  # selector keys' data: the listening socket
_WAKE = object()  # the loop's wake-up socket


@dataclass(frozen=True)
class _Unsent:
    """The bytes of a reply the loop's send did not take, for the connection's thread."""

    data: memoryview


class _Connection:
    """A client's connection: its socket, its open unleased takes, its thread if any."""

    __slots__ = ("busy", "closed", "inbox", "sock", "takes")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.takes: set[int] = set()
        self.busy = False  # its thread is answering a request
        self.closed = False
        self.inbox: queue.SimpleQueue[Any] | None = None


def socket_path(path: Path, dir_fd: int) -> str:
    """A name for bind/connect under the 108-byte AF_UNIX limit: the real path when short,
    else the same file reached through the home directory's descriptor in /proc."""
    name = str(path)
    if len(name.encode()) < 100:
        return name
    return f"/proc/self/fd/{dir_fd}/{path.name}"


def _listen(path: Path, address: str) -> socket.socket:
    """The listening socket at `address` (the file `path`), 0600."""
    try:
        os.unlink(address)  # a dead owner's socket file; we hold the lock now
    except FileNotFoundError:
        pass
    except IsADirectoryError:  # no owner's: kept aside, never deleted
        move_aside(path, STRAY_SUFFIX)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
        os.chmod(path, 0o600)
        listener.listen(socket.SOMAXCONN)  # many client threads connect at once
    except OSError as exc:
        listener.close()
        raise UnusableFileError(path, "the owner's socket", exc) from exc
    return listener


def _same_user(sock: socket.socket) -> bool:
    """Whether the peer runs as this process's user (SO_PEERCRED)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return False
    _pid, uid, _gid = _PEERCRED.unpack(creds)
    return bool(uid == os.getuid())


def _request(request: Any) -> tuple[int, str, Any]:
    """A request's version, op and arguments; ValueError unless it is one this owner
    answers."""
    if not isinstance(request, list) or len(request) != 3:
        raise ValueError("owner protocol: a request is [version, op, args]")
    version, name, args = request
    if version not in protocol.ANSWERED_VERSIONS:
        raise ValueError(f"owner protocol version {version} is not supported "
                         f"(this owner speaks {protocol.VERSION})")
    return version, name, args


def _hello(owner: ChannelOwner) -> dict[str, Any]:
    return {"pid": os.getpid(), "name": owner.name, "version": protocol.VERSION}


def _dispatch(owner: ChannelOwner, request: Any, takes: set[int]) -> Any:
    """Answer one request with the owner's method of its op's name (protocol.OPERATIONS);
    keep `takes`, the unleased takes this connection holds, up to date."""
    version, name, args = _request(request)
    if name == protocol.HELLO:
        return _hello(owner)
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
