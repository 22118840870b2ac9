"""OwnerClient: a process that shares a channel talks to its owner through the socket.

It satisfies OwnerOperations (queue/operations.py) as ChannelOwner does: each
operation one request and reply, encoded as protocol.OPERATIONS says. Each
thread has its own connection, so one thread waiting for an fsync does not hold
up the others, and the owner can share one fsync among them (group commit).
A broken connection raises OwnerLostError; Channel then elects a new owner.

close() may come from another thread while calls are in flight (a web worker closing
the handle of a channel deleted meanwhile). It shuts every connection down, which wakes
a call blocked on its reply at once (OwnerLostError), but it closes only the idle ones:
a connection in use is closed by its own call when that ends. Closing it under the call
would free its descriptor for the next socket or file the process opens, and the call
would then wait on, or read, another connection's bytes.

A call costs three system calls, a send, a poll for the reply and a recv (five before: a
poll asked whether the owner had closed the connection, and a Python socket timeout polls
before the send too); a produce request is a few hundred microseconds, and each of those
was one more release of the GIL:
  * the socket is blocking, its send bounded by the kernel's SO_SNDTIMEO (and its recvs by
    SO_RCVTIMEO) instead of a Python socket timeout. The reply is waited for in poll
    (POLLIN, timeout_s), not in a blocking recv: a recv sleeping on a Unix socket is also
    woken when the owner reads the request (the room freed in the send buffer wakes every
    sleeper of the socket), one more thread switch a call; poll sleeps until readable.
    No reply within timeout_s: OwnerLostError, as the timeout did.
  * an owner that closed the connection (it stopped, or died) is found by the send itself:
    on a Unix stream socket a send to a closed or shut down peer fails at once (EPIPE;
    Python ignores SIGPIPE), so the request was not sent: OwnerUnreachableError. Before,
    a poll asked the socket first.
  * a call that ends without its whole reply (a timeout, a lost owner, an exception raised
    into the thread mid-recv) leaves the connection out of step: its reply may still come.
    The connection is dropped at once, never used again, so a later request can never read
    an earlier one's reply (the poll found such bytes only if they had already arrived).
"""
from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

from channel_engine import errors
from channel_engine.errors import OwnerLostError, OwnerUnreachableError
from channel_engine.event import Event
from channel_engine.filenames import SOCKET_NAME
from channel_engine.owner import protocol
from channel_engine.owner.server import socket_path
from channel_engine.queue.channel_config import ChannelConfig
from channel_engine.queue.checkpointer import CheckpointResult
from channel_engine.queue.put_batch import Batches

R = TypeVar("R")


def _kernel_timeout(sock: socket.socket, timeout_s: float) -> None:
    """Make `sock` blocking, its sends and recvs ending with EAGAIN after timeout_s (module
    doc: no poll before a send)."""
    sock.settimeout(None)
    seconds = int(timeout_s)
    timeval = struct.pack("@ll", seconds, int((timeout_s - seconds) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


class OwnerClient:
    """The channel as seen from a process that does not own it."""

    def __init__(self, config: ChannelConfig, timeout_s: float) -> None:
        self.config = config
        self.name = config.name
        self.read_only = False
        self.timeout_s = timeout_s
        # poll's, within its C int (a keep_alive_ms of weeks makes timeout_s that long)
        self.timeout_ms = min(max(1, round(timeout_s * 1000)), 2**31 - 1)
        self.path = config.home / SOCKET_NAME
        self._local = threading.local()
        self._sockets: list[socket.socket] = []
        self._busy: set[socket.socket] = set()  # in a call now (under _sockets_lock)
        self._sockets_lock = threading.Lock()
        self.lost = False
        self.owner_pid = 0
        self.version = protocol.HELLO_VERSION  # the requests' version: min(ours, the owner's)

    @classmethod
    def connect(cls, config: ChannelConfig, timeout_s: float = 60.0) -> OwnerClient:
        """Connect to the owner; raise OSError when no owner is listening."""
        client = cls(config, timeout_s)
        client._connection()
        hello = client.call(protocol.HELLO)  # as HELLO_VERSION: any owner answers it
        client.owner_pid = hello["pid"]
        # an owner that answered a HELLO_VERSION request speaks at least that
        owner_version = int(hello.get("version", protocol.HELLO_VERSION))
        client.version = min(protocol.VERSION, owner_version)
        if client.version not in protocol.ANSWERED_VERSIONS:
            client.close()
            raise errors.OwnerProtocolError(
                f"channel {config.name!r}: the owner speaks protocol version "
                f"{owner_version}, this process {protocol.VERSION}")
        return client

    def _connection(self) -> socket.socket:
        sock: socket.socket | None = getattr(self._local, "sock", None)
        if sock is not None:
            return sock
        if self.lost:  # nothing is sent on a connection of a lost owner
            raise OwnerUnreachableError(f"channel {self.name!r}: the owner process went "
                                        "away; the request was not sent")
        sock = self._connect()
        self._local.replies = select.poll()  # readable: its reply (or the owner's close)
        self._local.replies.register(sock, select.POLLIN)
        self._local.sock = sock
        with self._sockets_lock:
            self._sockets.append(sock)
        return sock

    def _connect(self) -> socket.socket:
        """A new connection; a full listen backlog (EAGAIN) is waited out, not taken for a
        dead owner. Refused or missing socket: the owner is gone."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            dir_fd = os.open(self.config.home, os.O_RDONLY | os.O_DIRECTORY)
            try:
                sock.settimeout(self.timeout_s)  # connect: EAGAIN at once on a full backlog
                sock.connect(socket_path(Path(self.path), dir_fd))
                _kernel_timeout(sock, self.timeout_s)
                return sock
            except (BlockingIOError, InterruptedError):
                sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.002)
            except OSError:
                sock.close()
                raise
            finally:
                os.close(dir_fd)

    def call(self, op: str, *args: Any) -> Any:
        """One request and its reply; the owner's exceptions are re-raised here."""
        try:
            sock = self._connection()
        except OSError as exc:
            self.lost = True
            raise OwnerUnreachableError(f"channel {self.name!r}: the owner process is gone "
                                        f"({exc}); {op} was not done") from exc
        with self._sockets_lock:
            if sock not in self._sockets:  # close() came first: the descriptor is gone
                raise OwnerUnreachableError(f"channel {self.name!r}: the connection was "
                                            f"closed; {op} was not done")
            self._busy.add(sock)
        try:
            reply = self._exchange(sock, op, args)
        except BaseException:
            self._drop(sock)  # out of step: its reply may come yet (module doc)
            raise
        finally:
            with self._sockets_lock:
                self._busy.discard(sock)
                if sock not in self._sockets:  # close() or _drop() left it to us
                    sock.close()
        if reply[0] == 0:
            return reply[1]
        raise protocol.error_from_wire(*reply[1:])

    def _drop(self, sock: socket.socket) -> None:
        """Never use this thread's connection again; call() closes it."""
        self._local.sock = None
        with self._sockets_lock:
            if sock in self._sockets:
                self._sockets.remove(sock)

    def _exchange(self, sock: socket.socket, op: str, args: tuple[Any, ...]) -> Any:
        """Send one request and read its reply frame; the connection's failures raised as
        OwnerUnreachableError (not sent) or OwnerLostError (outcome unknown)."""
        try:
            protocol.send(sock, [self.version, op, list(args)])
        except OSError as exc:  # the owner never read the request: nothing happened
            self.lost = True
            raise OwnerUnreachableError(f"channel {self.name!r}: the owner process is gone "
                                        f"({exc}); {op} was not done") from exc
        try:
            if not self._local.replies.poll(self.timeout_ms):
                raise TimeoutError("no reply")
            return protocol.receive(sock)
        except (OSError, EOFError, ConnectionError) as exc:
            self.lost = True
            reason = f"no reply within {self.timeout_s:g} s" \
                if isinstance(exc, BlockingIOError | TimeoutError) else exc
            raise OwnerLostError(f"channel {self.name!r}: lost the owner process during "
                                 f"{op} ({reason}); its outcome is unknown") from exc

    def close(self) -> None:
        """Close every connection (open takes roll back in the owner); a call in flight in
        another thread ends at once with OwnerLostError (module doc)."""
        self.lost = True
        with self._sockets_lock:
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # already reset by the owner's side
                    pass
                if sock not in self._busy:
                    sock.close()
            self._sockets.clear()

    def _request(self, op: protocol.Op[R], *args: Any) -> R:
        """One operation of OwnerOperations, encoded and decoded as protocol.OPERATIONS says."""
        wire = op.args_for_version(op.args_to_wire(args), self.version)
        return op.result_from_wire(self.call(op.name, *wire))

    # -- OwnerOperations (queue/operations.py), each one request ---------------------------
    def commit_batches(self, transaction_id: int | None, batches: Batches,
                       partitions: int, movable: bool = False) -> list[tuple[int, int, int]]:
        """Commit an encoded put transaction in the owner."""
        return self._request(protocol.COMMIT_BATCHES, transaction_id, batches, partitions,
                             movable)

    def count_rollback(self) -> None:
        """Count a put rollback in the owner's counters."""
        self._request(protocol.COUNT_ROLLBACK)

    def count_failed_put(self, count: int) -> None:
        """Count a put that failed before reaching the owner in its counters."""
        self._request(protocol.COUNT_FAILED_PUT, count)

    def begin_take(self, lease_ms: int | None = None, subscription: str = "default") -> int:
        """Begin a take transaction of a subscription in the owner."""
        return self._request(protocol.BEGIN_TAKE, lease_ms, subscription)

    def subscriptions(self) -> list[str]:
        """The channel's subscriptions, from the owner."""
        return self._request(protocol.SUBSCRIPTIONS)

    def add_subscription(self, name: str, start: Any = "earliest") -> None:
        """Add a subscription in the owner."""
        self._request(protocol.ADD_SUBSCRIPTION, name, start)

    def remove_subscription(self, name: str) -> None:
        """Remove a subscription in the owner."""
        self._request(protocol.REMOVE_SUBSCRIPTION, name)

    def reset_subscription(self, name: str, to: Any) -> None:
        """Reset a subscription's position in the owner."""
        self._request(protocol.RESET_SUBSCRIPTION, name, to)

    def take_events(self, take_id: int, max_events: int) -> list[Event]:
        """Reserve and read events for a take."""
        return self._request(protocol.TAKE_EVENTS, take_id, max_events)

    def reserve_ranges(self, take_id: int, max_events: int) -> list[tuple[int, int, int]]:
        """Reserve ranges for a take without reading them."""
        return self._request(protocol.RESERVE_RANGES, take_id, max_events)

    def commit_take(self, take_id: int) -> None:
        """Commit a take in the owner."""
        self._request(protocol.COMMIT_TAKE, take_id)

    def rollback_take(self, take_id: int) -> None:
        """Roll a take back in the owner."""
        self._request(protocol.ROLLBACK_TAKE, take_id)

    def read(self, partition: int, offset: int, max_events: int = 100) -> list[Event]:
        """Committed events of a partition from an offset."""
        return self._request(protocol.READ, partition, offset, max_events)

    def offsets_for_time(self, partition: int, timestamp: int) -> int | None:
        """Kafka's offsetsForTimes for one partition."""
        return self._request(protocol.OFFSETS_FOR_TIME, partition, timestamp)

    def list_offsets(self) -> list[tuple[int, int]]:
        """Kafka's ListOffsets (earliest, and latest read-committed) of every partition."""
        return self._request(protocol.LIST_OFFSETS)

    def status(self, segments: bool = False) -> dict[str, Any]:
        """The owner's status (with segment tables when `segments`)."""
        return self._request(protocol.STATUS, segments)

    def flush(self) -> None:
        """Make every committed put and take durable now, in the owner."""
        self._request(protocol.FLUSH)

    def flush_if_due(self) -> bool:
        """The flusher's hook, run in the owner."""
        return self._request(protocol.FLUSH_IF_DUE)

    def checkpoint(self) -> CheckpointResult:
        """Write a checkpoint in the owner."""
        return self._request(protocol.CHECKPOINT)

    def checkpoint_if_due(self) -> CheckpointResult | None:
        """The checkpointer's hook, run in the owner."""
        return self._request(protocol.CHECKPOINT_IF_DUE)

    def apply_retention(self) -> dict[str, Any]:
        """Apply retention in the owner."""
        return self._request(protocol.APPLY_RETENTION)

    def acknowledge_losses(self) -> int:
        """Acknowledge every loss record in the owner; return how many."""
        return self._request(protocol.ACKNOWLEDGE_LOSSES)
