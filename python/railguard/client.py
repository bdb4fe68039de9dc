"""The job's side of the contract: :class:`JobClient`.

A rank connects to its node agent's Unix socket, says ``hello`` and then
talks in lines (see :mod:`railguard.contract` for the format). The client
mirrors the Rust ``rdma::contract::ContractClient``:

* **Connect.** :meth:`JobClient.connect` tries for
  ``options.connect_within`` seconds (the agent may still be starting) and
  returns once the agent answered ``hello`` with ``ok``. A refused hello
  raises :class:`AgentRefused` with the agent's reason; no agent raises
  :class:`AgentUnavailable` naming the socket.

* **Calls.** :meth:`~JobClient.checkpointed`, :meth:`~JobClient.order_done`
  and :meth:`~JobClient.checkpoint_done` send one line and wait (at most
  ``options.call_timeout``) for the agent's ``ok`` / ``error``. ``ok``
  returns :attr:`Delivery.ACKED`; ``error`` raises :class:`AgentRefused`;
  no answer in time raises :class:`CallTimeout`.

* **Orders.** A background thread reads the socket. Orders go into a
  bounded queue (``options.order_queue``), each order id once even if the
  agent repeats it (it does after a reconnect); take them with
  :meth:`~JobClient.poll_order` and answer each with
  :meth:`~JobClient.order_done`. When the queue is full the client answers
  the order as failed itself, so the agent is never left waiting.

* **Agent restarts.** When the connection breaks (the agent closed it,
  restarted, or sent a line that breaks the contract) the client reconnects
  in the background with capped backoff and says ``hello`` again, then
  re-sends the newest ``checkpointed`` step and every order answer the
  agent did not take. Calls made meanwhile return immediately with
  :attr:`Delivery.DEFERRED` (an order answer is kept and sent after
  reconnecting). With ``ClientOptions(reconnect=False)`` a broken
  connection is final instead: calls raise :class:`AgentGone`.

Nothing blocks without a bound: connecting, every call, every line begun
by the agent (``options.line_timeout``), and :meth:`~JobClient.close`.

The client does not register RDMA connections (``conn_up`` and friends):
a PyTorch job's transports are NCCL/gloo's, which the agent cannot move. A
job that does own connections can send those messages with
:meth:`~JobClient.call`, but they are not re-sent after a reconnect.
"""

from __future__ import annotations

import collections
import enum
import logging
import math
import os
import queue
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Deque, List, Optional, Set, Tuple

from .contract import (
    MAX_DETAIL_LEN,
    Checkpointed,
    ContractError,
    Error,
    HeldOut,
    Hello,
    Order,
    OrderDone,
    JobMessage,
    LineReader,
    decode_agent,
    encode,
    truncate,
    validate,
)
from .env import JobEnv

__all__ = [
    "Delivery",
    "ClientOptions",
    "AgentUnavailable",
    "AgentRefused",
    "AgentGone",
    "ClientClosed",
    "CallTimeout",
    "JobClient",
    "NullClient",
]

log = logging.getLogger("railguard.client")

#: Order ids remembered to deliver each order once.
SEEN_ORDERS = 1024
#: Calls written and not yet answered, at most.
MAX_PENDING = 256
#: Order answers kept while the agent is away, at most (oldest dropped).
MAX_DEFERRED_DONE = 256


class Delivery(enum.Enum):
    """How a call reached the agent."""

    #: The agent answered ``ok``.
    ACKED = "acked"
    #: The agent is away; the client sends it again after reconnecting.
    DEFERRED = "deferred"
    #: No agent at all (:class:`NullClient`, a standalone run).
    STANDALONE = "standalone"


class AgentUnavailable(ContractError):
    """The agent's socket could not be reached."""

    def __init__(self, path: str, reason: Any):
        self.path = path
        self.reason = reason
        super().__init__(f"agent socket {path}: {reason}")


class AgentRefused(ContractError):
    """The agent answered ``error`` (its message)."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(f"the agent refused: {message}")


class AgentGone(ContractError):
    """The connection broke and the client does not reconnect
    (``ClientOptions(reconnect=False)``)."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"lost the agent at {path}: {reason}")


class ClientClosed(ContractError):
    """The client was closed."""

    def __init__(self) -> None:
        super().__init__("the contract client has stopped")


class CallTimeout(ContractError):
    """No answer within the call timeout."""

    def __init__(self, seconds: float, what: str = "the agent"):
        self.seconds = seconds
        super().__init__(f"no answer from {what} within {seconds:g} s")


@dataclass
class ClientOptions:
    """Client settings (seconds). The defaults are the Rust client's."""

    #: How long :meth:`JobClient.connect` keeps trying to reach the agent.
    connect_within: float = 5.0
    #: Limit of one call (and of the agent's answer to ``hello``).
    call_timeout: float = 5.0
    #: Reconnect backoff: first and largest pause.
    backoff_min: float = 0.05
    backoff_max: float = 1.0
    #: Orders received and not yet taken with :meth:`JobClient.poll_order`.
    order_queue: int = 64
    #: Once a line from the agent has begun it must end within this.
    line_timeout: float = 5.0
    #: Reconnect after the connection breaks (False: calls then raise
    #: :class:`AgentGone`).
    reconnect: bool = True

    def check(self) -> None:
        for name in ("connect_within", "call_timeout", "backoff_min", "backoff_max", "line_timeout"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"ClientOptions.{name} must be a positive number of seconds, not {v!r}")
        if self.order_queue < 1:
            raise ValueError("ClientOptions.order_queue must be at least 1")


# Outcomes of a call.
_OK, _REFUSED, _GONE, _CLOSED = "ok", "refused", "gone", "closed"


class _Call:
    __slots__ = ("event", "outcome", "message", "done")

    def __init__(self, done: Optional[OrderDone]):
        self.event = threading.Event()
        self.outcome: Optional[str] = None
        self.message = ""
        self.done = done

    def resolve(self, outcome: str, message: str = "") -> None:
        self.outcome, self.message = outcome, message
        self.event.set()


# What an answer from the agent is for: ("hello", None), ("resync", msg),
# ("done", OrderDone) for an answer the client sent by itself, or
# ("call", _Call) for a caller waiting.
_Pending = Tuple[str, Any]


class _End(Exception):
    """Ends a session: kind is "lost", "refused" or "closed"."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class JobClient:
    """One rank's connection to its node agent. Thread-safe.

    Make one with :meth:`connect` or :meth:`from_env`; close it with
    :meth:`close` (or use it as a context manager)."""

    active = True

    def __init__(self, path: str, hello: Hello, options: Optional[ClientOptions] = None):
        """Prepares a client; :meth:`connect` / :meth:`from_env` also start it."""
        validate(hello)
        encode(hello)
        self.path = os.fspath(path)
        self.hello = hello
        self.options = options or ClientOptions()
        self.options.check()
        self.env: Optional[JobEnv] = None
        #: Why the last connection attempt or session ended (for people).
        self.last_error: Optional[str] = None
        # _wlock orders writes (and their pending entries); _lock guards the
        # state. Taken in that order; the reader thread pops answers with
        # _lock alone, so a slow write never stops it from reading.
        self._wlock = threading.Lock()
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._pending: Deque[_Pending] = collections.deque()
        self._live = False
        self._connected = threading.Event()
        self._closing = threading.Event()
        self._gone: Optional[AgentGone] = None
        self._orders: "queue.Queue[Order]" = queue.Queue(self.options.order_queue)
        self._seen_order: Deque[int] = collections.deque()
        self._seen: Set[int] = set()
        self._deferred: Deque[OrderDone] = collections.deque()
        self._newest_checkpoint: Optional[int] = None
        self._held_out: frozenset = frozenset()
        self._first = threading.Event()
        self._first_error: Optional[ContractError] = None
        self._thread: Optional[threading.Thread] = None

    # --- making one -------------------------------------------------------

    @classmethod
    def connect(
        cls,
        path: str,
        job: str,
        rank: int,
        pid: Optional[int] = None,
        options: Optional[ClientOptions] = None,
    ) -> "JobClient":
        """Connects as rank ``rank`` of ``job`` (the hello's pid is this
        process's unless given) and returns once the agent accepted hello."""
        c = cls(path, Hello(job=job, rank=rank, pid=os.getpid() if pid is None else pid), options)
        c.start()
        return c

    @classmethod
    def from_env(
        cls,
        environ: Optional[Any] = None,
        options: Optional[ClientOptions] = None,
        require: bool = False,
    ) -> "JobClient | NullClient":
        """The client for this process as the agent launched it
        (``RAILGUARD_AGENT_SOCKET``, ``RAILGUARD_JOB``, ``RAILGUARD_RANK``).
        Without the socket variable (plain ``torchrun``, a laptop) returns a
        :class:`NullClient` that does nothing, unless ``require``, which
        raises :class:`railguard.env.NotUnderRailguard`."""
        env = JobEnv.from_environ(environ, require=require)
        if not env.under_railguard:
            return NullClient(env)
        assert env.socket_path is not None and env.job is not None
        c = cls(env.socket_path, Hello(job=env.job, rank=env.rank, pid=os.getpid()), options)
        c.env = env
        c.start()
        return c

    def start(self) -> None:
        """Starts the background thread and waits (bounded) for the agent to
        accept hello. Raises what stopped it."""
        if self._thread is not None:
            raise RuntimeError("the client was started already")
        self._thread = threading.Thread(
            target=self._run, name=f"railguard-client-{self.hello.rank}", daemon=True
        )
        self._thread.start()
        limit = self.options.connect_within + self.options.call_timeout + 1.0
        if not self._first.wait(limit):
            self.close()
            raise CallTimeout(limit, f"the agent at {self.path}")
        if self._first_error is not None:
            self.close()
            raise self._first_error

    # --- state ------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Connected to the agent and hello accepted, right now."""
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        """Waits at most ``timeout`` seconds until connected."""
        return self._connected.wait(_seconds(timeout))

    @property
    def held_out(self) -> frozenset:
        """The host's NICs an admin holds out of service for connections,
        as the agent last said (kept across reconnects until it says
        otherwise). A job with its own transport keeps off them."""
        with self._lock:
            return self._held_out

    # --- orders -----------------------------------------------------------

    def poll_order(self, timeout: float = 0.0) -> Optional[Order]:
        """The next order, waiting at most ``timeout`` seconds (0: only one
        that is already here); None if there is none. Answer every order
        with :meth:`order_done` (or :meth:`checkpoint_done`)."""
        t = _seconds(timeout)
        try:
            if t == 0:
                return self._orders.get_nowait()
            return self._orders.get(timeout=t)
        except queue.Empty:
            return None

    # --- calls ------------------------------------------------------------

    def checkpointed(self, step: int) -> Delivery:
        """This rank's checkpoint at ``step`` is durable (written, fsync'd and
        renamed into place). Send it for periodic and ordered checkpoints
        alike; the newest step is sent again after a reconnect."""
        msg = Checkpointed(step=step)
        validate(msg)
        encode(msg)
        with self._lock:
            prev = self._newest_checkpoint
            self._newest_checkpoint = step if prev is None else max(prev, step)
        return self.call(msg)

    def order_done(
        self, order_id: int, ok: bool, detail: str = "", step: Optional[int] = None
    ) -> Delivery:
        """Answers an order. ``detail`` is for people (cut to 1024 bytes);
        ``step`` names the checkpoint a successful checkpoint order wrote
        (only with ``ok``). An answer the agent cannot take now is kept and
        sent after reconnecting."""
        return self.call(
            OrderDone(order_id=order_id, ok=ok, detail=truncate(detail, MAX_DETAIL_LEN), step=step)
        )

    def checkpoint_done(self, order_id: int, step: int) -> Delivery:
        """Answers a checkpoint order: this rank's checkpoint at ``step`` is
        durable (send :meth:`checkpointed` for it too)."""
        return self.order_done(order_id, True, f"checkpoint at step {step}", step)

    def call(self, msg: JobMessage) -> Delivery:
        """Sends one job message and waits for the agent's answer (see the
        module docstring for the outcomes)."""
        if self._closing.is_set():
            raise ClientClosed()
        if self._thread is None:
            raise RuntimeError("the client is not started (use JobClient.connect)")
        validate(msg)
        line = encode(msg)
        t = self.options.call_timeout
        c = _Call(msg if isinstance(msg, OrderDone) else None)
        if not self._wlock.acquire(timeout=t):
            raise CallTimeout(t)
        try:
            with self._lock:
                if self._gone is not None:
                    raise self._gone
                if not self._live:
                    if c.done is not None:
                        self._defer(c.done)
                    return Delivery.DEFERRED
                if len(self._pending) >= MAX_PENDING:
                    raise ContractError(f"{MAX_PENDING} calls are already waiting for the agent's answer")
                self._pending.append(("call", c))
                sock = self._sock
            self._write(sock, line)
        finally:
            self._wlock.release()
        if not c.event.wait(t):
            raise CallTimeout(t)
        if c.outcome == _OK:
            return Delivery.ACKED
        if c.outcome == _REFUSED:
            raise AgentRefused(c.message)
        if c.outcome == _CLOSED:
            raise ClientClosed()
        if self._gone is not None:
            raise self._gone
        return Delivery.DEFERRED

    # --- closing ----------------------------------------------------------

    def close(self, timeout: float = 2.0) -> None:
        """Closes the connection and stops the background thread (waits at
        most ``timeout`` seconds). Idempotent."""
        self._closing.set()
        with self._lock:
            self._kill_sock()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(_seconds(timeout))

    #: The same as :meth:`close`. (There is no job -> agent "stop" message:
    #: ``stop`` is an order the agent may send, see :class:`contract.Stop`.)
    stop = close

    def __enter__(self) -> "JobClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- internals --------------------------------------------------------

    def _write(self, sock: Optional[socket.socket], line: bytes) -> None:
        """Writes a line (_wlock held). A failed write ends the session; the
        reader thread then answers what is pending."""
        if sock is None:
            return
        try:
            sock.sendall(line)
        except OSError as e:
            log.info("write to the agent failed: %s", e)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _kill_sock(self) -> None:
        """Wakes the reader: the session ends (lock held)."""
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _defer(self, d: OrderDone) -> None:
        """Keeps an order answer for the next connection (lock held)."""
        if len(self._deferred) >= MAX_DEFERRED_DONE:
            old = self._deferred.popleft()
            log.warning(
                "too many order answers waiting for the agent; dropping the answer to order %d",
                old.order_id,
            )
        self._deferred.append(d)

    def _first_result(self, err: Optional[ContractError]) -> None:
        if not self._first.is_set():
            self._first_error = err
            self._first.set()

    def _run(self) -> None:
        o = self.options
        deadline = time.monotonic() + o.connect_within
        backoff = o.backoff_min
        while not self._closing.is_set():
            err: ContractError
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(o.call_timeout)
                sock.connect(self.path)
            except OSError as e:
                sock.close()
                if isinstance(e, socket.timeout):
                    reason = f"connect timed out after {o.call_timeout:g} s"
                else:
                    reason = f"{e.strerror or e} (errno {e.errno})" if e.errno else str(e)
                err = AgentUnavailable(self.path, reason)
            else:
                end, said_hello = self._session(sock)
                if said_hello:
                    backoff = o.backoff_min
                if end.kind == "closed":
                    self._first_result(ClientClosed())
                    return
                if end.kind == "refused":
                    err = AgentRefused(end.reason)
                    if not self._first.is_set():
                        self.last_error = str(err)
                        self._first_result(err)
                        return
                    log.warning("the agent refused hello (%s); retrying", end.reason)
                else:
                    err = AgentGone(self.path, end.reason)
                    log.info("lost the agent at %s (%s)", self.path, end.reason)
            self.last_error = str(err)
            if not self._first.is_set():
                if time.monotonic() >= deadline:
                    self._first_result(err)
                    return
            elif not o.reconnect:
                gone = err if isinstance(err, AgentGone) else AgentGone(self.path, str(err))
                with self._lock:
                    self._gone = gone
                return
            if self._closing.wait(backoff):
                break
            backoff = min(backoff * 2, o.backoff_max)
        self._first_result(ClientClosed())

    def _session(self, sock: socket.socket) -> Tuple[_End, bool]:
        """One connection: resync, then read until it ends. Returns why it
        ended and whether hello was accepted."""
        reader = LineReader(self.options.line_timeout)
        state = {"hello": False}
        end: Optional[_End] = None
        with self._wlock, self._lock:
            self._sock = sock
            self._pending = collections.deque()
            resync: List[Tuple[Any, _Pending]] = [(self.hello, ("hello", None))]
            if self._newest_checkpoint is not None:
                m = Checkpointed(step=self._newest_checkpoint)
                resync.append((m, ("resync", m)))
            while self._deferred:
                d = self._deferred.popleft()
                resync.append((d, ("done", d)))
            # Everything is pending before the first write: if a write
            # fails, the cleanup below keeps every order answer for the next
            # connection (none is dropped with the rest of the resync).
            self._pending.extend(p for _, p in resync)
            try:
                sock.sendall(b"".join(encode(msg) for msg, _ in resync))
            except OSError as e:
                end = _End("lost", f"write failed: {e}")
            else:
                self._live = not self._closing.is_set()
        hello_by = time.monotonic() + self.options.call_timeout
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI)
        try:
            while end is None:
                if self._closing.is_set():
                    raise _End("closed", "closed")
                now = time.monotonic()
                if not state["hello"] and now >= hello_by:
                    raise _End("lost", f"no answer to hello within {self.options.call_timeout:g} s")
                reader.check_timeout(now)
                try:
                    ready = poller.poll(100)
                except (OSError, ValueError) as e:
                    raise _End("lost", f"socket failed: {e}") from None
                if not ready:
                    continue
                try:
                    data = sock.recv(1 << 16)
                except (BlockingIOError, InterruptedError, socket.timeout):
                    continue
                except OSError as e:
                    raise _End("lost", f"read failed: {e}") from None
                if not data:
                    if self._closing.is_set():
                        raise _End("closed", "closed")
                    reader.eof()
                    raise _End("lost", "the agent closed the connection")
                for line in reader.feed(data):
                    self._handle(sock, line, state)
        except _End as e:
            end = e
        except ContractError as e:
            end = _End("lost", str(e))
        assert end is not None
        with self._lock:
            self._live = False
            self._sock = None
            pending, self._pending = self._pending, collections.deque()
            self._connected.clear()
            outcome = _CLOSED if self._closing.is_set() else _GONE
            if outcome == _GONE and not self.options.reconnect and state["hello"]:
                self._gone = AgentGone(self.path, end.reason)
            for kind, p in pending:
                if kind == "done":
                    self._defer(p)
                elif kind == "call":
                    if p.done is not None and outcome == _GONE:
                        self._defer(p.done)
                    p.resolve(outcome)
        try:
            sock.close()
        except OSError:
            pass
        return end, state["hello"]

    def _handle(self, sock: socket.socket, line: bytes, state: dict) -> None:
        try:
            msg = decode_agent(line)
        except ContractError as e:
            raise _End("lost", f"bad line from the agent: {e}") from None
        if isinstance(msg, Order):
            self._take_order(msg)
            return
        if isinstance(msg, HeldOut):
            with self._lock:
                if frozenset(msg.nics) != self._held_out:
                    log.info("NICs held out of service: %s", ", ".join(msg.nics) or "none")
                self._held_out = frozenset(msg.nics)
            return
        refused = msg.message if isinstance(msg, Error) else None
        with self._lock:
            if not self._pending:
                why = "an answer nobody asked for"
                raise _End("lost", f"{why}: {refused}" if refused is not None else why)
            kind, p = self._pending.popleft()
        if kind == "hello":
            if refused is not None:
                raise _End("refused", refused)
            state["hello"] = True
            self._connected.set()
            self._first_result(None)
            log.debug("hello accepted by the agent at %s", self.path)
        elif kind == "call":
            p.resolve(_OK if refused is None else _REFUSED, refused or "")
        elif refused is not None:
            log.warning("the agent refused a re-sent %s: %s", p.TYPE, refused)

    def _take_order(self, o: Order) -> None:
        with self._lock:
            if o.order_id in self._seen:
                log.debug("order %d repeated by the agent; already delivered", o.order_id)
                return
            self._seen.add(o.order_id)
            self._seen_order.append(o.order_id)
            if len(self._seen_order) > SEEN_ORDERS:
                self._seen.discard(self._seen_order.popleft())
        try:
            self._orders.put_nowait(o)
            return
        except queue.Full:
            pass
        log.warning("order %d refused: the job's order queue is full", o.order_id)
        d = OrderDone(order_id=o.order_id, ok=False, detail="the job's order queue is full")
        with self._wlock:
            with self._lock:
                self._pending.append(("done", d))
                sock = self._sock
            self._write(sock, encode(d))


class NullClient:
    """The client of a run without an agent (no ``RAILGUARD_AGENT_SOCKET``):
    no orders ever arrive and every call returns
    :attr:`Delivery.STANDALONE`, so the same training script runs under
    plain ``torchrun``."""

    active = False
    connected = False
    last_error: Optional[str] = None
    path: Optional[str] = None
    held_out: frozenset = frozenset()

    def __init__(self, env: Optional[JobEnv] = None):
        self.env = env

    def wait_connected(self, timeout: float) -> bool:
        return False

    def poll_order(self, timeout: float = 0.0) -> Optional[Order]:
        t = _seconds(timeout)
        if t:
            time.sleep(t)
        return None

    def checkpointed(self, step: int) -> Delivery:
        return Delivery.STANDALONE

    def order_done(self, order_id: int, ok: bool, detail: str = "", step: Optional[int] = None) -> Delivery:
        return Delivery.STANDALONE

    def checkpoint_done(self, order_id: int, step: int) -> Delivery:
        return Delivery.STANDALONE

    def call(self, msg: JobMessage) -> Delivery:
        return Delivery.STANDALONE

    def close(self, timeout: float = 2.0) -> None:
        pass

    stop = close

    def __enter__(self) -> "NullClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _seconds(t: Any) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise ValueError(f"a timeout must be a finite number of seconds >= 0, not {t!r}")
    return float(t)
