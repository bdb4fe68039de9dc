"""A node agent's control socket for tests, serving the job contract the way
``nodeagent/src/control/session.rs`` and ``Control::handle`` in
``nodeagent/src/control.rs`` do:

* the first line must be ``hello`` and come within ``hello_timeout``
  (else ``error`` "no hello within N ms; closing the connection", closed);
  before hello is accepted a connection gets exactly one answer (anything
  else: ``error`` "say hello first", closed);
* every line is answered with exactly one ``ok`` / ``error``, in order;
  orders are written between answers; malformed or invalid lines after
  hello get ``error`` (the Rust error's text) and the connection stays;
* an oversized line, or one begun and not finished within
  ``line_timeout``, gets ``error`` "<why>; closing the connection", closed;
* after hello is accepted, the NICs held out of service (``held_out``,
  the whole set) and then the rank's orders not yet answered are sent to
  the new connection (the client delivers an id once);
* ``order_done`` must answer a pending order of the same job and rank;
  ``checkpointed`` is recorded.

Order ids start from the clock in microseconds, as the agent's do.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from railguard.contract import (
    Checkpointed,
    ConnClosed,
    ConnMoved,
    ConnUp,
    ContractError,
    Error,
    HeldOut,
    Hello,
    LineReader,
    LineTimeout,
    LineTooLong,
    Ok,
    Order,
    OrderDone,
    decode_job,
    encode,
    validate,
)

MAX_SESSIONS_PER_RANK = 4


class _Session:
    def __init__(self, sid: int, sock: socket.socket):
        self.sid = sid
        self.sock = sock
        self.hello: Optional[Hello] = None
        self.conns: Dict[int, ConnUp] = {}
        self.wlock = threading.Lock()
        # Held-out sets go to a session only once it has had its ``ok`` to
        # the hello (as the agent does): one read earlier could otherwise
        # land behind a newer one.
        self.greeted = False

    def send(self, msg) -> bool:
        with self.wlock:
            try:
                self.sock.sendall(encode(msg))
                return True
            except OSError:
                return False


class FakeAgent:
    def __init__(
        self,
        path: str,
        hello_timeout: float = 10.0,
        line_timeout: float = 5.0,
        admit: Optional[Callable[[Hello], Optional[str]]] = None,
        nics: Tuple[str, ...] = ("rail0", "rail1"),
    ):
        self.path = path
        self.hello_timeout = hello_timeout
        self.line_timeout = line_timeout
        self.admit = admit
        self.nics = nics
        #: When False the agent reads lines but answers nothing (a hung agent).
        self.answering = True
        self.cond = threading.Condition()
        self.received: List[Tuple[int, object]] = []
        self.sessions: Dict[int, _Session] = {}
        self.pending: Dict[int, Tuple[str, int, Order]] = {}
        self.answers: Dict[int, OrderDone] = {}
        self.checkpoints: List[Tuple[str, int, int]] = []
        self.held: Tuple[str, ...] = ()
        self._next_sid = 1
        self._next_order = int(time.time() * 1e6)
        self._closed = False
        self._threads: List[threading.Thread] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(64)
        self._listener.settimeout(0.05)
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    # --- test API -----------------------------------------------------------

    def order(self, job: str, rank: int, kind) -> int:
        """Sends ``kind`` to every connection of (job, rank); the order stays
        pending (and is re-sent on a new hello) until answered."""
        with self.cond:
            oid = self._next_order
            self._next_order += 1
            o = Order(order_id=oid, kind=kind)
            self.pending[oid] = (job, rank, o)
            targets = [s for s in self.sessions.values() if s.hello and (s.hello.job, s.hello.rank) == (job, rank)]
        for s in targets:
            s.send(o)
        return oid

    def hold_out(self, *nics: str) -> None:
        """Makes ``nics`` the set held out of service and tells every
        connection, as the agent does."""
        with self.cond:
            self.held = tuple(nics)
            # Sent under the lock, so sets reach each session in order.
            for s in self.sessions.values():
                if s.greeted:
                    s.send(HeldOut(nics=self.held))

    def push(self, job: str, rank: int, msg) -> None:
        """Writes any message to the connections of (job, rank)."""
        with self.cond:
            targets = [s for s in self.sessions.values() if s.hello and (s.hello.job, s.hello.rank) == (job, rank)]
        for s in targets:
            s.send(msg)

    def wait_for(self, pred, timeout: float = 5.0, what: str = "a message"):
        """The first received message matching ``pred`` (waits for it)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for _, m in self.received:
                    if pred(m):
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} within {timeout} s; got {self.received!r}")
                self.cond.wait(left)

    def wait_answer(self, order_id: int, timeout: float = 5.0) -> OrderDone:
        return self.wait_for(
            lambda m: isinstance(m, OrderDone) and m.order_id == order_id, timeout, f"answer to order {order_id}"
        )

    def count(self, pred) -> int:
        with self.cond:
            return sum(1 for _, m in self.received if pred(m))

    def connected(self, job: str, rank: int) -> int:
        with self.cond:
            return sum(1 for s in self.sessions.values() if s.hello and (s.hello.job, s.hello.rank) == (job, rank))

    def wait_connected(self, job: str, rank: int, n: int = 1, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while sum(1 for s in self.sessions.values() if s.hello and (s.hello.job, s.hello.rank) == (job, rank)) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"job {job} rank {rank} did not connect within {timeout} s")
                self.cond.wait(left)

    def drop_connections(self) -> None:
        """Closes every job connection (the agent keeps running)."""
        with self.cond:
            socks = [s.sock for s in self.sessions.values()]
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Stops the agent: the listener and every connection; the socket
        file is removed (an agent restart binds it again)."""
        self._closed = True
        self._threads[0].join(2.0)  # accepts nothing more
        self._listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.drop_connections()
        for t in self._threads:
            t.join(2.0)

    def __enter__(self) -> "FakeAgent":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- serving ------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                s, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            s.settimeout(None)
            with self.cond:
                sid = self._next_sid
                self._next_sid += 1
            t = threading.Thread(target=self._serve, args=(_Session(sid, s),), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, sess: _Session) -> None:
        sock = sess.sock
        reader = LineReader(self.line_timeout)
        hello_by = time.monotonic() + self.hello_timeout
        sock.settimeout(0.02)
        try:
            while not self._closed:
                if sess.hello is None and time.monotonic() >= hello_by:
                    ms = int(self.hello_timeout * 1000)
                    sess.send(Error(f"no hello within {ms} ms; closing the connection"))
                    return
                try:
                    reader.check_timeout()
                    try:
                        data = sock.recv(1 << 16)
                    except socket.timeout:
                        continue
                    except OSError:
                        return
                    if not data:
                        return
                    lines = reader.feed(data)
                except (LineTooLong, LineTimeout) as e:
                    sess.send(Error(f"{e}; closing the connection"))
                    return
                for line in lines:
                    if not self._line(sess, line):
                        return
        finally:
            with self.cond:
                self.sessions.pop(sess.sid, None)
                self.cond.notify_all()
            try:
                sock.close()
            except OSError:
                pass

    def _line(self, sess: _Session, line: bytes) -> bool:
        """Handles one line; False: close the connection."""
        try:
            msg = decode_job(line)
            validate(msg)
        except ContractError as e:
            msg, reply, then = None, Error(str(e)), []
        else:
            with self.cond:
                self.received.append((sess.sid, msg))
                self.cond.notify_all()
            refusal = None
            if isinstance(msg, Hello) and sess.hello is None and self.admit is not None:
                refusal = self.admit(msg)
            if refusal is not None:
                reply, then = Error(refusal), []
            else:
                err, then = self._handle(sess, msg)
                reply = Ok() if err is None else Error(err)
        if not self.answering:
            return True
        closed = not sess.send(reply)
        if isinstance(reply, Ok) and sess.hello is not None and not sess.greeted:
            # The held-out set between the answer and the orders.
            with self.cond:
                sess.greeted = True
                closed |= not sess.send(HeldOut(nics=self.held))
        for m in then:
            closed |= not sess.send(m)
        # Before a hello is accepted one answer is all a connection gets.
        return not closed and sess.hello is not None

    def _handle(self, sess: _Session, msg) -> Tuple[Optional[str], list]:
        with self.cond:
            if isinstance(msg, Hello):
                if sess.hello is not None:
                    return "hello was already said on this connection", []
                same = sum(
                    1
                    for s in self.sessions.values()
                    if s.hello and (s.hello.job, s.hello.rank) == (msg.job, msg.rank)
                )
                if same >= MAX_SESSIONS_PER_RANK:
                    return (
                        f"job {msg.job} rank {msg.rank} already holds {MAX_SESSIONS_PER_RANK} connections to the agent",
                        [],
                    )
                sess.hello = msg
                self.sessions[sess.sid] = sess
                self.cond.notify_all()
                again = [o for (j, r, o) in self.pending.values() if (j, r) == (msg.job, msg.rank)]
                return None, again
            if sess.hello is None:
                return "say hello first", []
            job, rank = sess.hello.job, sess.hello.rank
            if isinstance(msg, Checkpointed):
                self.checkpoints.append((job, rank, msg.step))
                return None, []
            if isinstance(msg, ConnUp):
                if (msg.job, msg.rank) != (job, rank):
                    return (
                        f"connection of job {json.dumps(msg.job)} rank {msg.rank} on the connection of job {json.dumps(job)} rank {rank}",
                        [],
                    )
                if msg.nic not in self.nics:
                    return f"NIC {json.dumps(msg.nic)} is not a data NIC of this host (it has {', '.join(self.nics)})", []
                sess.conns[msg.conn_id] = msg
                return None, []
            if isinstance(msg, (ConnMoved, ConnClosed)):
                if msg.conn_id not in sess.conns:
                    return f"connection {msg.conn_id} is not registered on this connection", []
                if isinstance(msg, ConnClosed):
                    del sess.conns[msg.conn_id]
                return None, []
            if isinstance(msg, OrderDone):
                p = self.pending.get(msg.order_id)
                if p is None:
                    return (
                        f"order {msg.order_id} is not pending (answered already, timed out, or from before an agent restart)",
                        [],
                    )
                if (p[0], p[1]) != (job, rank):
                    return f"order {msg.order_id} is not for job {json.dumps(job)} rank {rank}", []
                del self.pending[msg.order_id]
                self.answers[msg.order_id] = msg
                return None, []
        return f"unexpected {msg!r}", []
