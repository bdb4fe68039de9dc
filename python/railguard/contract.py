"""The job contract: the messages a training job and its railguard node agent
exchange, and how they are framed on the wire.

This is a Python mirror of the Rust module ``rdma::contract``
(``rdma/src/contract/{messages,wire,error}.rs``); the agent's side of the
socket is ``nodeagent/src/control.rs``. Nothing here does I/O: it encodes,
decodes and checks lines. :mod:`railguard.client` speaks them on a socket.

Framing
-------
One JSON object per line, ``\\n``-terminated (a trailing ``\\r`` is
dropped), at most :data:`MAX_LINE` bytes without the newline, in either
direction. Every object has a string ``"type"`` tag naming the message;
the other fields sit next to it::

    {"type":"hello","job":"train","rank":0,"pid":4242}
    {"type":"ok"}
    {"type":"order","order_id":1730000000000001,"kind":{"type":"checkpoint","step":null,"halt":true}}

Who speaks first
----------------
The job connects and its first line must be ``hello``. The agent answers
**every** job line with exactly one ``ok`` or ``error`` line, in the order
the job sent them. Between those answers, at any time, the agent may send
``order`` lines; each order must be answered, later, with an ``order_done``
line (which is itself answered ``ok``/``error`` like any job line).

Job -> agent (:data:`JOB_MESSAGE_TYPES`): :class:`Hello`, :class:`ConnUp`,
:class:`ConnMoved`, :class:`ConnClosed`, :class:`ConnStalled`, :class:`OrderDone`,
:class:`Checkpointed`.

Agent -> job (:data:`AGENT_MESSAGE_TYPES`): :class:`Ok`, :class:`Error`,
:class:`Order`, whose ``kind`` is one of :class:`Migrate`, :class:`Pace`,
:class:`Checkpoint`, :class:`Stop`; and :class:`HeldOut` (the host's NICs
an admin holds out of service, after every accepted ``hello`` and on each
change; not answered).

What happens on error
---------------------
A line that is not JSON, not an object, has no string ``type``, names an
unknown type or has fields of the wrong type is *malformed*: the agent
answers it with ``{"type":"error","message":"malformed message: ..."}``
and keeps the connection (once ``hello`` was accepted). A line longer than
:data:`MAX_LINE`, or begun and not finished within the agent's line
timeout (5 s), puts the stream out of step: the agent answers ``error``
and closes the socket. Before ``hello`` is accepted a connection gets one
answer only: anything but an accepted ``hello`` is answered ``error`` and
the socket is closed. Decoding here raises the same classes of error
(:class:`LineTooLong`, :class:`Malformed`, :class:`UnknownType`,
:class:`Invalid`) with the same wording as the Rust side.

Numbers
-------
Ids and steps are unsigned 64-bit integers on the Rust side; Python's ints
carry them exactly. Floats (``1.0``), booleans and negative numbers are
refused where an integer is expected, as serde does. Unknown fields are
ignored, as serde does by default.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__all__ = [
    "DEFAULT_SOCKET",
    "SOCKET_ENV",
    "MAX_LINE",
    "MAX_NAME_LEN",
    "MAX_DETAIL_LEN",
    "MAX_MIGRATE_CONNS",
    "MAX_CONNS_PER_CLIENT",
    "MAX_HELD_OUT_NICS",
    "JOB_MESSAGE_TYPES",
    "AGENT_MESSAGE_TYPES",
    "ORDER_KIND_TYPES",
    "ContractError",
    "LineTooLong",
    "LineTimeout",
    "Malformed",
    "UnknownType",
    "Invalid",
    "Hello",
    "ConnUp",
    "ConnMoved",
    "ConnClosed",
    "ConnStalled",
    "OrderDone",
    "Checkpointed",
    "Ok",
    "Error",
    "Order",
    "HeldOut",
    "Migrate",
    "Pace",
    "Checkpoint",
    "Stop",
    "JobMessage",
    "AgentMessage",
    "OrderKind",
    "encode",
    "decode_job",
    "decode_agent",
    "validate",
    "check_name",
    "truncate",
    "socket_path",
    "LineReader",
]

# --- bounds (rdma/src/contract/messages.rs) --------------------------------

#: Where the agent listens unless configured otherwise.
DEFAULT_SOCKET = "/run/railguard/agent.sock"
#: Environment variable naming the socket (set for ranks the agent launches).
SOCKET_ENV = "RAILGUARD_AGENT_SOCKET"
#: Longest line accepted in either direction (bytes, without the newline).
MAX_LINE = 64 << 10
#: Longest job, NIC or host name (bytes of UTF-8).
MAX_NAME_LEN = 253
#: Longest ``order_done`` detail (bytes; longer ones are cut by the client).
MAX_DETAIL_LEN = 1024
#: Most connection ids in one ``migrate`` order.
MAX_MIGRATE_CONNS = 1024
#: Most connections one client registers.
MAX_CONNS_PER_CLIENT = 4096
#: Most NICs a ``held_out`` message names.
MAX_HELD_OUT_NICS = 64

JOB_MESSAGE_TYPES: Tuple[str, ...] = (
    "hello",
    "conn_up",
    "conn_moved",
    "conn_closed",
    "order_done",
    "checkpointed",
    "conn_stalled",
)
AGENT_MESSAGE_TYPES: Tuple[str, ...] = ("ok", "error", "order", "held_out")
ORDER_KIND_TYPES: Tuple[str, ...] = ("migrate", "pace", "checkpoint", "stop")

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


def socket_path(environ: Optional[Dict[str, str]] = None) -> str:
    """``$RAILGUARD_AGENT_SOCKET`` if set and not empty, else
    :data:`DEFAULT_SOCKET` (the Rust ``socket_path()``)."""
    env = os.environ if environ is None else environ
    return env.get(SOCKET_ENV) or DEFAULT_SOCKET


# --- errors (rdma/src/contract/error.rs) -----------------------------------


class ContractError(Exception):
    """Any failure of the job contract (base class)."""


class LineTooLong(ContractError):
    """A line is longer than :data:`MAX_LINE`; the stream is out of step
    after it and must be closed."""

    def __init__(self, max: int = MAX_LINE):  # noqa: A002 - mirrors the Rust field
        self.max = max
        super().__init__(f"line longer than {max} bytes")


class LineTimeout(ContractError):
    """A line was begun but not finished in time; the stream is closed."""

    def __init__(self, ms: int):
        self.ms = ms
        super().__init__(f"a line was not finished within {ms} ms")


class Malformed(ContractError):
    """Not a JSON object with a string ``type``, fields that do not fit the
    type, or a stream that ended inside a line."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"malformed message: {reason}")


class UnknownType(ContractError):
    """A line's ``type`` tag is not one this side knows."""

    def __init__(self, found: str, expected: Sequence[str]):
        self.found = found
        self.expected = tuple(expected)
        super().__init__(
            f"unknown message type {json.dumps(found)} (expected one of {', '.join(expected)})"
        )


class Invalid(ContractError):
    """A well-formed message breaks a rule its types cannot express (a
    name's length or characters, a detail's length, a failure naming a
    checkpoint step)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"invalid message: {reason}")


# --- field readers: serde's rules for the Rust field types ------------------


class _FieldError(Exception):
    pass


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f"string {json.dumps(v)}"
    if isinstance(v, list):
        return "sequence"
    return "map"


def _int(v: Any, top: int, what: str) -> int:
    # bool is an int in Python; serde never takes a JSON boolean as a number.
    if isinstance(v, bool) or not isinstance(v, int):
        raise _FieldError(f"invalid type: {_type_name(v)}, expected {what}")
    if v < 0 or v > top:
        raise _FieldError(f"invalid value: integer `{v}`, expected {what}")
    return v


def _u64(v: Any) -> int:
    return _int(v, _U64, "u64")


def _u32(v: Any) -> int:
    return _int(v, _U32, "u32")


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise _FieldError(f"invalid type: {_type_name(v)}, expected a string")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _FieldError(f"invalid type: {_type_name(v)}, expected a boolean")
    return v


def _opt(read):
    def f(v: Any):
        return None if v is None else read(v)

    return f


def _str_list(v: Any) -> List[str]:
    if not isinstance(v, list):
        raise _FieldError(f"invalid type: {_type_name(v)}, expected a sequence")
    return [_str(x) for x in v]


def _u64_list(v: Any) -> List[int]:
    if not isinstance(v, list):
        raise _FieldError(f"invalid type: {_type_name(v)}, expected a sequence")
    return [_u64(x) for x in v]


_MISSING = object()


def _get(obj: Dict[str, Any], name: str, read, default: Any = _MISSING) -> Any:
    """Reads field ``name``: missing is an error unless a default is given
    (``#[serde(default)]``; ``Option`` fields default to None)."""
    if name not in obj:
        if default is _MISSING:
            raise _FieldError(f"missing field `{name}`")
        return default
    return read(obj[name])


# --- the messages (rdma/src/contract/messages.rs) ---------------------------


@dataclass(frozen=True)
class Hello:
    """First message of every connection: who is talking."""

    job: str
    rank: int
    pid: int
    TYPE = "hello"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "job": self.job, "rank": self.rank, "pid": self.pid}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "Hello":
        return cls(job=_get(o, "job", _str), rank=_get(o, "rank", _u32), pid=_get(o, "pid", _u32))


@dataclass(frozen=True)
class ConnUp:
    """A connection (queue pair) of a rank and where it runs now."""

    job: str
    rank: int
    conn_id: int
    nic: str
    peer_host: str
    peer_rank: int
    rail: int
    TYPE = "conn_up"

    def to_json(self) -> Dict[str, Any]:
        return {
            "type": self.TYPE,
            "job": self.job,
            "rank": self.rank,
            "conn_id": self.conn_id,
            "nic": self.nic,
            "peer_host": self.peer_host,
            "peer_rank": self.peer_rank,
            "rail": self.rail,
        }

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "ConnUp":
        return cls(
            job=_get(o, "job", _str),
            rank=_get(o, "rank", _u32),
            conn_id=_get(o, "conn_id", _u64),
            nic=_get(o, "nic", _str),
            peer_host=_get(o, "peer_host", _str),
            peer_rank=_get(o, "peer_rank", _u32),
            rail=_get(o, "rail", _u32),
        )


@dataclass(frozen=True)
class ConnMoved:
    """The transport moved a connection to ``nic``."""

    conn_id: int
    nic: str
    TYPE = "conn_moved"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "conn_id": self.conn_id, "nic": self.nic}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "ConnMoved":
        return cls(conn_id=_get(o, "conn_id", _u64), nic=_get(o, "nic", _str))


@dataclass(frozen=True)
class ConnClosed:
    """A registered connection is gone."""

    conn_id: int
    TYPE = "conn_closed"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "conn_id": self.conn_id}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "ConnClosed":
        return cls(conn_id=_get(o, "conn_id", _u64))


@dataclass(frozen=True)
class ConnStalled:
    """A registered connection has had no path for a while: no rail it
    tried reached the peer. The agent tells the supervisor (once per
    connection and incarnation), which moves the job at once."""

    conn_id: int
    TYPE = "conn_stalled"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "conn_id": self.conn_id}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "ConnStalled":
        return cls(conn_id=_get(o, "conn_id", _u64))


@dataclass(frozen=True)
class OrderDone:
    """The answer to an order (Rust ``JobMessage::OrderDone(OrderAnswer)``).

    ``step`` names the checkpoint a successful checkpoint order wrote; it is
    left out of the line when None (``skip_serializing_if``) and must be None
    when ``ok`` is false. ``detail`` is for people (at most
    :data:`MAX_DETAIL_LEN` bytes)."""

    order_id: int
    ok: bool
    detail: str = ""
    step: Optional[int] = None
    TYPE = "order_done"

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "type": self.TYPE,
            "order_id": self.order_id,
            "ok": self.ok,
            "detail": self.detail,
        }
        if self.step is not None:
            d["step"] = self.step
        return d

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "OrderDone":
        return cls(
            order_id=_get(o, "order_id", _u64),
            ok=_get(o, "ok", _bool),
            detail=_get(o, "detail", _str, ""),
            step=_get(o, "step", _opt(_u64), None),
        )


@dataclass(frozen=True)
class Checkpointed:
    """This rank's part of the checkpoint at ``step`` is durable (written and
    renamed into place). Sent for periodic and ordered checkpoints alike."""

    step: int
    TYPE = "checkpointed"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "step": self.step}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "Checkpointed":
        return cls(step=_get(o, "step", _u64))


@dataclass(frozen=True)
class Ok:
    """The agent accepted the job's line."""

    TYPE = "ok"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "Ok":
        return cls()


@dataclass(frozen=True)
class Error:
    """The agent refused the job's line (``message`` says why)."""

    message: str
    TYPE = "error"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "message": self.message}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "Error":
        return cls(message=_get(o, "message", _str))


@dataclass(frozen=True)
class Migrate:
    """Move these connections to ``to_nic`` (None: any healthy NIC)."""

    conn_ids: Tuple[int, ...]
    to_nic: Optional[str] = None
    TYPE = "migrate"

    def __post_init__(self) -> None:
        object.__setattr__(self, "conn_ids", tuple(self.conn_ids))

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "conn_ids": list(self.conn_ids), "to_nic": self.to_nic}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "Migrate":
        return cls(
            conn_ids=tuple(_get(o, "conn_ids", _u64_list)),
            to_nic=_get(o, "to_nic", _opt(_str), None),
        )


@dataclass(frozen=True)
class Pace:
    """Limit a connection's rate (None: no limit)."""

    conn_id: int
    bytes_per_s: Optional[int] = None
    TYPE = "pace"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "conn_id": self.conn_id, "bytes_per_s": self.bytes_per_s}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "Pace":
        return cls(
            conn_id=_get(o, "conn_id", _u64),
            bytes_per_s=_get(o, "bytes_per_s", _opt(_u64), None),
        )


@dataclass(frozen=True)
class Checkpoint:
    """Write a checkpoint at ``step`` (None: the next step every rank can
    reach); with ``halt``, compute nothing after it and wait to be stopped."""

    step: Optional[int] = None
    halt: bool = False
    TYPE = "checkpoint"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "step": self.step, "halt": self.halt}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "Checkpoint":
        return cls(step=_get(o, "step", _opt(_u64), None), halt=_get(o, "halt", _bool, False))


@dataclass(frozen=True)
class Stop:
    """Stop the job (answer it first)."""

    TYPE = "stop"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "Stop":
        return cls()


OrderKind = Union[Migrate, Pace, Checkpoint, Stop]
_KINDS = {k.TYPE: k for k in (Migrate, Pace, Checkpoint, Stop)}


def _kind(v: Any) -> OrderKind:
    if not isinstance(v, dict):
        raise _FieldError(f"invalid type: {_type_name(v)}, expected internally tagged enum OrderKind")
    tag = v.get("type", _MISSING)
    if tag is _MISSING:
        raise _FieldError("missing field `type`")
    if not isinstance(tag, str) or tag not in _KINDS:
        shown = tag if isinstance(tag, str) else _type_name(tag)
        expected = ", ".join(f"`{k}`" for k in ORDER_KIND_TYPES)
        raise _FieldError(f"unknown variant `{shown}`, expected one of {expected}")
    return _KINDS[tag]._from(v)


@dataclass(frozen=True)
class Order:
    """An order for the job; answer it with :class:`OrderDone`."""

    order_id: int
    kind: OrderKind
    TYPE = "order"

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "order_id": self.order_id, "kind": self.kind.to_json()}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "Order":
        return cls(order_id=_get(o, "order_id", _u64), kind=_get(o, "kind", _kind))


@dataclass(frozen=True)
class HeldOut:
    """The host's NICs out of service for connections: those an admin
    holds (``railguard nic failover`` until ``nic failback``) and those the
    agent finds Degraded (losing packets, link up): the whole set.
    Not an order; nothing answers it. A job with its own transport keeps
    its connections off these NICs."""

    nics: Tuple[str, ...] = ()
    TYPE = "held_out"

    def __post_init__(self) -> None:
        object.__setattr__(self, "nics", tuple(self.nics))

    def to_json(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "nics": list(self.nics)}

    @classmethod
    def _from(cls, o: Dict[str, Any]) -> "HeldOut":
        return cls(nics=tuple(_get(o, "nics", _str_list)))


JobMessage = Union[Hello, ConnUp, ConnMoved, ConnClosed, OrderDone, Checkpointed, ConnStalled]
AgentMessage = Union[Ok, Error, Order, HeldOut]
_JOB = {m.TYPE: m for m in (Hello, ConnUp, ConnMoved, ConnClosed, OrderDone, Checkpointed, ConnStalled)}
_AGENT = {m.TYPE: m for m in (Ok, Error, Order, HeldOut)}


# --- checks the types cannot express ----------------------------------------

# Rust's char::is_whitespace (Unicode White_Space) and char::is_control (Cc).
_WHITESPACE = frozenset(
    [chr(c) for c in range(0x09, 0x0E)]
    + ["\x20", "\x85", "\xa0", "\u1680"]
    + [chr(c) for c in range(0x2000, 0x200B)]
    + ["\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
)


def _bad_char(c: str) -> bool:
    o = ord(c)
    return c in _WHITESPACE or o < 0x20 or 0x7F <= o <= 0x9F


def check_name(what: str, s: str) -> None:
    """A job, NIC or host name: 1..=253 bytes of UTF-8, no whitespace or
    control characters. Raises :class:`Invalid`."""
    n = len(s.encode("utf-8", "surrogatepass"))
    if n == 0 or n > MAX_NAME_LEN:
        raise Invalid(f"{what} must be 1..={MAX_NAME_LEN} bytes")
    if any(_bad_char(c) for c in s):
        raise Invalid(f"{what} {json.dumps(s)} contains whitespace or control characters")


def validate(msg: JobMessage) -> None:
    """Checks what the types cannot (the Rust ``JobMessage::validate``):
    names, the detail's length, and that a failed answer names no step.
    Raises :class:`Invalid`."""
    if isinstance(msg, Hello):
        check_name("job", msg.job)
    elif isinstance(msg, ConnUp):
        check_name("job", msg.job)
        check_name("nic", msg.nic)
        check_name("peer_host", msg.peer_host)
    elif isinstance(msg, ConnMoved):
        check_name("nic", msg.nic)
    elif isinstance(msg, OrderDone):
        if len(msg.detail.encode("utf-8", "surrogatepass")) > MAX_DETAIL_LEN:
            raise Invalid(f"detail longer than {MAX_DETAIL_LEN} bytes")
        if not msg.ok and msg.step is not None:
            raise Invalid(f"order {msg.order_id} failed but names checkpoint step {msg.step}")
    elif not isinstance(msg, (ConnClosed, Checkpointed, ConnStalled)):
        raise TypeError(f"not a job message: {msg!r}")


def truncate(s: str, max_bytes: int) -> str:
    """``s`` cut to at most ``max_bytes`` bytes of UTF-8, at a character
    boundary."""
    b = s.encode("utf-8")
    if len(b) <= max_bytes:
        return s
    return b[:max_bytes].decode("utf-8", "ignore")


# --- framing (rdma/src/contract/wire.rs) ------------------------------------


def _check_fields(msg: Any) -> None:
    """Refuses to encode what the other side would not decode (a bool or a
    float where an integer goes, an id out of range): one place to catch a
    caller's mistake before it becomes an agent's ``error`` line."""
    try:
        decoded = _decode_obj(json.loads(json.dumps(msg.to_json())), _JOB if msg.TYPE in _JOB else _AGENT)
    except Malformed as e:
        raise Invalid(f"cannot encode {e.reason}") from None
    except ContractError as e:
        raise Invalid(f"cannot encode {msg!r}: {e}") from None
    if decoded != msg:
        raise Invalid(f"{msg.TYPE}: a field does not fit its wire type: {msg!r}")


def encode(msg: Union[JobMessage, AgentMessage]) -> bytes:
    """One message as a line (UTF-8 JSON and the newline). Raises
    :class:`LineTooLong` past :data:`MAX_LINE`, :class:`Invalid` when a field
    has a value its wire type cannot carry."""
    _check_fields(msg)
    text = json.dumps(msg.to_json(), separators=(",", ":"), ensure_ascii=False)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid(f"{msg.TYPE}: a string is not valid UTF-8 (lone surrogate)") from None
    if len(data) > MAX_LINE:
        raise LineTooLong(MAX_LINE)
    return data + b"\n"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_surrogates(v: Any) -> None:
    # Python's json accepts lone surrogates ("\\ud800"); serde_json does not.
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("lone surrogate in a string") from None
    elif isinstance(v, list):
        for x in v:
            _no_surrogates(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            _no_surrogates(k)
            _no_surrogates(x)


def _parse(line: bytes) -> Any:
    if len(line) > MAX_LINE:
        raise LineTooLong(MAX_LINE)
    try:
        text = bytes(line).decode("utf-8")
        v = json.loads(text, parse_constant=_reject_constant)
        _no_surrogates(v)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Malformed(f"not JSON: {e}") from None
    return v


def _decode_obj(v: Any, known: Dict[str, Any]) -> Any:
    if not isinstance(v, dict):
        raise Malformed("not a JSON object")
    if "type" not in v:
        raise Malformed('no "type" field')
    tag = v["type"]
    if not isinstance(tag, str):
        raise Malformed('"type" is not a string')
    if tag not in known:
        raise UnknownType(tag, tuple(known))
    try:
        return known[tag]._from(v)
    except _FieldError as e:
        raise Malformed(f"{tag}: {e}") from None


def decode_job(line: bytes) -> JobMessage:
    """Decodes a job's line (without its newline). Raises
    :class:`LineTooLong`, :class:`Malformed` or :class:`UnknownType`. Does
    not :func:`validate`."""
    return _decode_obj(_parse(line), _JOB)


def decode_agent(line: bytes) -> AgentMessage:
    """Decodes an agent's line (without its newline) and checks it.
    Raises :class:`LineTooLong`, :class:`Malformed`, :class:`UnknownType`
    or :class:`Invalid`."""
    msg = _decode_obj(_parse(line), _AGENT)
    if isinstance(msg, HeldOut):
        if len(msg.nics) > MAX_HELD_OUT_NICS:
            raise Invalid(f"held_out names {len(msg.nics)} NICs; at most {MAX_HELD_OUT_NICS}")
        for n in msg.nics:
            check_name("nic", n)
    return msg


class LineReader:
    """Splits a byte stream into bounded lines, like the Rust ``LineReader``.

    :meth:`feed` takes what ``recv`` returned and gives back the complete
    lines (without ``\\n``; a trailing ``\\r`` is dropped). A line longer than
    :data:`MAX_LINE` raises :class:`LineTooLong`; once a line has begun it
    must end within ``line_timeout`` seconds (:meth:`check_timeout` raises
    :class:`LineTimeout`; None: no limit). Waiting *between* lines is never
    limited. :meth:`eof` raises :class:`Malformed` if the stream ended in the
    middle of a line. After an error the stream is out of step: close it.
    """

    def __init__(self, line_timeout: Optional[float] = None, max_line: int = MAX_LINE):
        self._buf = bytearray()
        self._line_timeout = line_timeout
        self._max = max_line
        self._begun_at: Optional[float] = None

    @property
    def partial(self) -> bool:
        """Whether a line has begun and not ended."""
        return bool(self._buf)

    def feed(self, data: bytes, now: Optional[float] = None) -> List[bytes]:
        lines: List[bytes] = []
        start = 0
        while True:
            i = data.find(b"\n", start)
            if i < 0:
                break
            if len(self._buf) + (i - start) > self._max:
                raise LineTooLong(self._max)
            self._buf += data[start:i]
            line = bytes(self._buf)
            self._buf.clear()
            self._begun_at = None
            if line.endswith(b"\r"):
                line = line[:-1]
            lines.append(line)
            start = i + 1
        rest = len(data) - start
        if len(self._buf) + rest > self._max:
            raise LineTooLong(self._max)
        if rest:
            if not self._buf:
                self._begun_at = time.monotonic() if now is None else now
            self._buf += data[start:]
        return lines

    def check_timeout(self, now: Optional[float] = None) -> None:
        if self._line_timeout is None or self._begun_at is None:
            return
        now = time.monotonic() if now is None else now
        if now - self._begun_at >= self._line_timeout:
            raise LineTimeout(int(self._line_timeout * 1000))

    def eof(self) -> None:
        if self._buf:
            raise Malformed("connection closed in the middle of a line")
