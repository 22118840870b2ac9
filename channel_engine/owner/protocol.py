"""The owner socket protocol: how processes that share a channel talk to its owner.

One process owns a channel's files (it holds `.lock` in the home); every other
process that opens the channel is a client of the owner over a Unix stream
socket, `owner.sock` in the home (so it works across containers that share the
volume, as flock does). A client thread has its own connection; requests on a
connection are answered in order, one at a time: a client sends its next request
only once it has the reply to the last, so a frame's reader may take everything it
receives for that frame (and refuses bytes past it: a peer out of step).

Frames (both directions):

    offset  size  field
    ------  ----  ---------------------------------------------------------
         0     4  length N of the body, big-endian u32 (at most 1 GiB)
         4     N  body: one MessagePack value

Request body: [version, op, args]   version: min(4, the owner's), op a string, args a
                                    list.

Versions in a rolling upgrade: a client sends hello as version 3, which every owner
since 3 answers, and reads the owner's version from the answer; every later request
carries min(VERSION, the owner's version) and only that version's arguments (a version
3 owner gets commit_batches without `movable`: it places the put where its producer
picked). An owner refuses a request whose argument count is not its version's.
Reply body:   [0, result]           success
              [1, error_class, message, attributes]   failure

Ops and their args/results (events travel as lists, bytes as MessagePack bin):

    op                args                               result
    ----------------  ---------------------------------  ---------------------------
    hello             []                                 {"pid", "name", "version"}
    commit_batches    [txn id or None, [[partition,      [[partition, first, last], ...]
                       batch], ...], partitions,
                       movable]
                       (queue/put_batch.py; movable: the
                       owner may choose the partition of
                       a keyless one-batch put; not in
                       a version 3 request)
    count_rollback    []                                 None
    count_failed_put  [events]                           None
    begin_take        [lease_ms or None, subscription]   take id
    take_events       [take id, max events]              [[p, offset, ts, key, headers, body], ...]
    reserve_ranges    [take id, max events]              [[partition, start, end], ...]
    commit_take       [take id]                          None
    rollback_take     [take id]                          None
    flush             []                                 None
    flush_if_due      []                                 true if a partition was flushed
    checkpoint        []                                 CheckpointResult as a map
    checkpoint_if_due []                                 the same, or None if not due
    apply_retention   []                                 {"segments_deleted", ...}
    status            [segments]                         the status map (channel_status.py)
    read              [partition, offset, max events]    events as for take_events
    offsets_for_time  [partition, timestamp]             offset or None
    list_offsets      []                                 [[log start offset, last stable
                                                          offset], ...] per partition
    acknowledge_losses
                      []                                 loss records acknowledged (int)
    subscriptions     []                                 names, `default` first
    add_subscription  [name, start]                      None
    remove_subscription
                      [name]                             None
    reset_subscription
                      [name, to]                         None
    (start, to: "earliest", "latest", {"timestamp_ms": t} or {partition: offset}:
     queue/subscriptions.py)

Every op but hello is a method of OwnerOperations (queue/operations.py) with the same
name and parameters; OPERATIONS below says, once for each, how its arguments and result
travel and what it does to the connection's takes. The client's methods and the
server's dispatch both go through it.

Errors are re-raised in the client as the same class from channel_engine.errors
(or ValueError / TypeError), with the same message and attributes. An op the owner
does not know is UnknownOperationError, also from an owner of an older version (it
answered ValueError "unknown owner op ..."), so that a newer client can fall back
(Channel.list_offsets asks status() of an owner older than list_offsets). A client
never gets an event a reply did not carry: takes are tied to the connection
that began them, and a connection that closes (its process died) rolls its
open takes back in the owner.
"""
from __future__ import annotations

import select
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgpack

from channel_engine import errors
from channel_engine.event import Event
from channel_engine.queue.checkpointer import CheckpointResult

# 2: puts travel as encoded batches (commit_batches); 3: subscriptions; 4: commit_batches
# `movable` (a version 3 client, which sends none, is still answered)
VERSION = 4
ANSWERED_VERSIONS = (3, 4)
HELLO_VERSION = 3  # the oldest answered: an owner of any version answers the handshake
LENGTH = struct.Struct(">I")
MAX_FRAME = 1 << 30
FIRST_READ = 1 << 16  # a frame's first recv: one system call for any frame this small
BUILTIN_ERRORS: dict[str, type[Exception]] = {"ValueError": ValueError,
                                               "TypeError": TypeError}
HELLO = "hello"  # the handshake: not an operation of the owner's, answered by the server
R = TypeVar("R")


def send(sock: socket.socket, value: Any) -> None:
    """Write one frame."""
    sock.sendall(frame(value))


def frame(value: Any) -> bytes:
    """One frame's bytes: the length, then the body."""
    body: bytes = msgpack.packb(value, use_bin_type=True)
    return LENGTH.pack(len(body)) + body


def receive(sock: socket.socket) -> Any:
    """Read one frame; raise EOFError when the peer closed the connection between frames.
    A small frame (a produce request, most replies) takes one recv: each side sends one
    frame and then waits for the other's, so bytes past this frame mean a peer out of step
    (ConnectionError)."""
    frame = receive_started(sock)
    return receive_rest(sock, frame) if isinstance(frame, Incomplete) else frame


@dataclass(frozen=True)
class Incomplete:
    """A frame whose first recv did not hold it whole: the bytes read so far."""

    first: bytes


def receive_started(sock: socket.socket) -> Any:
    """One recv (which does not block on a readable socket): the frame's value if that
    read held it whole, else Incomplete, for receive_rest (which may block) to finish;
    EOFError and ConnectionError as receive."""
    first = sock.recv(FIRST_READ)
    if not first:
        raise EOFError("connection closed")
    if len(first) < LENGTH.size:
        return Incomplete(first)
    length = _frame_length(first)
    missing = LENGTH.size + length - len(first)
    if missing < 0:
        raise ConnectionError(f"{-missing} bytes past a frame of {length} bytes: the peer "
                              "sent a frame before this side answered")
    if missing:
        return Incomplete(first)
    return msgpack.unpackb(memoryview(first)[LENGTH.size:], raw=False, strict_map_key=False)


def receive_rest(sock: socket.socket, frame: Incomplete) -> Any:
    """Finish reading a frame receive_started began (blocking until it is whole)."""
    first = frame.first
    if len(first) < LENGTH.size:
        first += _read_exactly(sock, LENGTH.size - len(first), eof_ok=False) or b""
    length = _frame_length(first)
    missing = LENGTH.size + length - len(first)
    if missing < 0:
        raise ConnectionError(f"{-missing} bytes past a frame of {length} bytes: the peer "
                              "sent a frame before this side answered")
    body = memoryview(first)[LENGTH.size:]
    if missing:
        body = memoryview(b"".join([body, _read_exactly(sock, missing, eof_ok=False) or b""]))
        _nothing_after(sock)
    return msgpack.unpackb(body, raw=False, strict_map_key=False)


def _nothing_after(sock: socket.socket) -> None:
    """ConnectionError when bytes already wait past the frame just read to its end: each
    side sends one frame and then waits for the other's (a peer out of step), as
    receive_started refuses bytes past a frame in its one read."""
    # poll first: a socket with a Python timeout would wait that long in recv, whatever
    # its flags; readable with nothing to peek is a peer that closed, for the next read
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        waiting = bool(poller.poll(0)) and bool(sock.recv(1, socket.MSG_PEEK))
    except (OSError, ValueError):  # reset meanwhile: the frame was read whole all the same
        return
    if waiting:
        raise ConnectionError("bytes past a frame: the peer sent a frame before this side "
                              "answered")


def _frame_length(first: bytes) -> int:
    (length,) = LENGTH.unpack_from(first)
    if length > MAX_FRAME:
        raise ConnectionError(f"frame of {length} bytes exceeds the {MAX_FRAME} byte limit")
    return int(length)


def _read_exactly(sock: socket.socket, size: int, eof_ok: bool) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            if eof_ok and left == size:
                return None
            raise ConnectionError("connection closed in the middle of a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def events_to_wire(events: list[Event]) -> list[Event]:
    """Events for a reply: MessagePack packs an Event (a tuple) as the array of its fields,
    as it would the list of them, without a copy per event."""
    return events


def events_from_wire(rows: list[list[Any]]) -> list[Event]:
    """Events back from a reply (tuple.__new__: no Python frame per event, and no check of
    the row's length either: that is made here, once per reply)."""
    fields = len(Event._fields)
    for row in rows:
        if not isinstance(row, list) or len(row) != fields:
            raise errors.OwnerProtocolError(
                f"owner protocol: an event of {_described(row)} in a reply, expected a list "
                f"of {fields} fields ({', '.join(Event._fields)})")
    new = tuple.__new__
    return [new(Event, row) for row in rows]


def _described(row: Any) -> str:
    return f"{len(row)} fields" if isinstance(row, list) else f"type {type(row).__name__}"


def error_to_wire(exc: BaseException) -> list[Any]:
    """A failure reply for an exception raised by the owner."""
    attributes = {k: v for k, v in vars(exc).items()
                  if isinstance(v, str | int | float | bool | type(None))}
    return [1, type(exc).__name__, str(exc), attributes]


OLD_UNKNOWN_OP = "unknown owner op "  # how owners before UnknownOperationError said it


def error_from_wire(name: str, message: str, attributes: dict[str, Any]) -> Exception:
    """Rebuild the owner's exception in the client: same class, message and attributes."""
    if name == "ValueError" and message.startswith(OLD_UNKNOWN_OP):  # an older owner
        return errors.UnknownOperationError(message.removeprefix(OLD_UNKNOWN_OP).strip("'\""))
    cls = getattr(errors, name, None) or BUILTIN_ERRORS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return errors.ChannelEngineError(f"{name}: {message}")
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)  # the class's own __init__ wants its original arguments
    exc.__dict__.update(attributes)
    return exc


def _same(value: Any) -> Any:
    return value


def _nothing(_value: Any) -> None:
    return None


def _pairs(rows: list[list[Any]]) -> list[tuple[int, int]]:
    """(a, b) pairs back from a reply."""
    return [(int(a), int(b)) for a, b in rows]


def _ranges(rows: list[list[Any]]) -> list[tuple[int, int, int]]:
    """(partition, a, b) triples back from a reply."""
    return [(int(p), int(a), int(b)) for p, a, b in rows]


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _checkpoint_to_wire(result: CheckpointResult | None) -> dict[str, Any] | None:
    return None if result is None else result.to_dict()


def _checkpoint_from_wire(value: dict[str, Any]) -> CheckpointResult:
    return CheckpointResult(**value)


def _optional_checkpoint(value: dict[str, Any] | None) -> CheckpointResult | None:
    return None if value is None else CheckpointResult(**value)


def _batches_to_wire(args: tuple[Any, ...]) -> list[Any]:
    transaction_id, batches, partitions, movable = args
    return [transaction_id, [[partition, batch] for partition, batch in batches], partitions,
            movable]


def _batches_from_wire(args: list[Any]) -> list[Any]:
    transaction_id, batches, partitions, *movable = args  # none in a version 3 request
    return [transaction_id, [(partition, batch) for partition, batch in batches], partitions,
            bool(movable and movable[0] is True)]


@dataclass(frozen=True)
class Op(Generic[R]):
    """How one owner operation travels: its arguments out and in, its result out and in,
    and what it does to the takes held by the connection that sends it."""

    name: str
    result_from_wire: Callable[[Any], R]
    result_to_wire: Callable[[Any], Any] = _same
    args_to_wire: Callable[[tuple[Any, ...]], list[Any]] = list
    args_from_wire: Callable[[list[Any]], list[Any]] = _same
    # "begins": an unleased take begun here is the connection's (rolled back when it
    # closes); "ends": the take named by the first argument is no longer the connection's
    takes: Literal["begins", "ends"] | None = None
    # protocol version -> how many arguments a request of that version carries, for an op
    # whose arguments changed between versions (None: the same in every version)
    arguments: dict[int, int] | None = None
    # answered by the owner's loop itself (server.py): short, and never waits for another
    # client; the others (checkpoints, flushes, retention, status, subscription changes)
    # go to the connection's own thread
    inline: bool = False

    def args_for_version(self, args: list[Any], version: int) -> list[Any]:
        """The wire arguments a request of `version` carries: those added by a later
        version are left out (an older owner would refuse them)."""
        return args if self.arguments is None else args[:self.arguments[version]]

    def check_arguments(self, args: Any, version: int) -> None:
        """ValueError unless `args` is a list of the count a request of `version` carries."""
        if not isinstance(args, list):
            raise ValueError(f"owner protocol: the arguments of {self.name} must be a list, "
                             f"not {type(args).__name__}")
        expected = None if self.arguments is None else self.arguments[version]
        if expected is not None and len(args) != expected:
            raise ValueError(f"owner protocol: {self.name} of version {version} takes "
                             f"{expected} arguments, got {len(args)}")


COMMIT_BATCHES = Op("commit_batches", _ranges, args_to_wire=_batches_to_wire,
                    args_from_wire=_batches_from_wire, arguments={3: 3, 4: 4}, inline=True)
COUNT_ROLLBACK = Op("count_rollback", _nothing, inline=True)
COUNT_FAILED_PUT = Op("count_failed_put", _nothing, inline=True)
BEGIN_TAKE = Op("begin_take", int, takes="begins", inline=True)
TAKE_EVENTS = Op("take_events", events_from_wire, events_to_wire, inline=True)
RESERVE_RANGES = Op("reserve_ranges", _ranges, inline=True)
COMMIT_TAKE = Op("commit_take", _nothing, takes="ends", inline=True)
ROLLBACK_TAKE = Op("rollback_take", _nothing, takes="ends", inline=True)
READ = Op("read", events_from_wire, events_to_wire, inline=True)
OFFSETS_FOR_TIME = Op("offsets_for_time", _optional_int, inline=True)
LIST_OFFSETS = Op("list_offsets", _pairs, inline=True)
STATUS = Op("status", dict)
FLUSH = Op("flush", _nothing)
FLUSH_IF_DUE = Op("flush_if_due", bool)
CHECKPOINT = Op("checkpoint", _checkpoint_from_wire, _checkpoint_to_wire)
CHECKPOINT_IF_DUE = Op("checkpoint_if_due", _optional_checkpoint, _checkpoint_to_wire)
APPLY_RETENTION = Op("apply_retention", dict)
ACKNOWLEDGE_LOSSES = Op("acknowledge_losses", int)
SUBSCRIPTIONS = Op("subscriptions", list, inline=True)
ADD_SUBSCRIPTION = Op("add_subscription", _nothing)
REMOVE_SUBSCRIPTION = Op("remove_subscription", _nothing)
RESET_SUBSCRIPTION = Op("reset_subscription", _nothing)

OPERATIONS: dict[str, Op[Any]] = {op.name: op for op in (
    COMMIT_BATCHES, COUNT_ROLLBACK, COUNT_FAILED_PUT, BEGIN_TAKE, TAKE_EVENTS, RESERVE_RANGES,
    COMMIT_TAKE, ROLLBACK_TAKE, READ, OFFSETS_FOR_TIME, LIST_OFFSETS, STATUS, FLUSH, FLUSH_IF_DUE,
    CHECKPOINT, CHECKPOINT_IF_DUE, APPLY_RETENTION, ACKNOWLEDGE_LOSSES, SUBSCRIPTIONS,
    ADD_SUBSCRIPTION, REMOVE_SUBSCRIPTION, RESET_SUBSCRIPTION)}
