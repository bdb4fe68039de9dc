"""JobClient against an in-test agent (tests/fake_agent.py, which serves the
socket the way nodeagent/src/control/session.rs does) and against scripted
servers that misbehave on purpose. Every wait is bounded."""

import os
import socket
import threading
import time

import pytest

from fake_agent import FakeAgent
from railguard import contract as c
from railguard.client import (
    AgentGone,
    AgentRefused,
    AgentUnavailable,
    CallTimeout,
    ClientClosed,
    ClientOptions,
    Delivery,
    JobClient,
)

FAST = dict(connect_within=1.0, call_timeout=1.0, backoff_min=0.02, backoff_max=0.1, line_timeout=0.5)


def opts(**kw):
    o = dict(FAST)
    o.update(kw)
    return ClientOptions(**o)


@pytest.fixture
def agent(sockdir):
    a = FakeAgent(os.path.join(sockdir, "agent.sock"))
    yield a
    a.close()


def connect(agent_or_path, rank=0, **kw):
    path = agent_or_path.path if isinstance(agent_or_path, FakeAgent) else agent_or_path
    return JobClient.connect(path, "train", rank, options=opts(**kw))


def wait_until(pred, timeout=3.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.01)


def test_hello_then_a_checkpoint_order_is_reported_and_answered(agent):
    with connect(agent, rank=1) as client:
        hello = agent.wait_for(lambda m: isinstance(m, c.Hello))
        assert hello == c.Hello(job="train", rank=1, pid=os.getpid())
        assert client.connected
        oid = agent.order("train", 1, c.Checkpoint(step=None, halt=True))
        o = client.poll_order(timeout=2.0)
        assert o == c.Order(order_id=oid, kind=c.Checkpoint(step=None, halt=True))
        assert client.checkpointed(40) is Delivery.ACKED
        assert client.checkpoint_done(o.order_id, 40) is Delivery.ACKED
        answer = agent.wait_answer(oid)
        assert answer == c.OrderDone(order_id=oid, ok=True, detail="checkpoint at step 40", step=40)
        assert agent.checkpoints == [("train", 1, 40)]
        assert client.poll_order() is None


def test_an_order_repeated_by_the_agent_is_delivered_once(agent):
    with connect(agent) as client:
        oid = agent.order("train", 0, c.Stop())
        agent.push("train", 0, c.Order(order_id=oid, kind=c.Stop()))
        other = agent.order("train", 0, c.Checkpoint(step=7))
        assert client.poll_order(2.0).order_id == oid
        assert client.poll_order(2.0).order_id == other
        assert client.poll_order(0.2) is None


def test_an_error_line_raises_with_the_agents_message(agent):
    with connect(agent) as client:
        with pytest.raises(AgentRefused) as e:
            client.order_done(999, True, "done")
        assert "order 999 is not pending" in str(e.value)
        assert str(e.value).startswith("the agent refused: ")
        # The connection stays usable after a refusal.
        assert client.checkpointed(1) is Delivery.ACKED
        # What the agent would refuse as invalid is refused before sending.
        with pytest.raises(c.Invalid, match="names checkpoint step"):
            client.order_done(1, False, "no", step=3)
        # A long detail is cut, not refused.
        oid = agent.order("train", 0, c.Stop())
        client.poll_order(2.0)
        assert client.order_done(oid, False, "é" * 2000) is Delivery.ACKED
        assert len(agent.wait_answer(oid).detail.encode()) <= c.MAX_DETAIL_LEN


def test_a_refused_hello_fails_connect_with_the_reason(sockdir):
    path = os.path.join(sockdir, "agent.sock")
    with FakeAgent(path, admit=lambda h: f"pid {h.pid} is not a rank of job {h.job}"):
        t0 = time.monotonic()
        with pytest.raises(AgentRefused, match="is not a rank of job train"):
            connect(path)
        assert time.monotonic() - t0 < 2.0


def test_no_agent_fails_clearly_and_in_time(sockdir):
    path = os.path.join(sockdir, "none.sock")
    t0 = time.monotonic()
    with pytest.raises(AgentUnavailable) as e:
        connect(path, connect_within=0.3)
    assert time.monotonic() - t0 < 1.5
    assert "none.sock" in str(e.value) and "No such file" in str(e.value)


def _listen(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    s.settimeout(3.0)
    return s


def test_an_agent_that_never_answers_hello_does_not_hang_connect(sockdir):
    path = os.path.join(sockdir, "mute.sock")
    srv = _listen(path)
    held = []

    def accept_forever():
        try:
            while True:
                held.append(srv.accept()[0])
        except OSError:
            pass

    threading.Thread(target=accept_forever, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(c.ContractError, match="hello"):
        connect(path, connect_within=0.3, call_timeout=0.3)
    assert time.monotonic() - t0 < 2.0
    srv.close()
    for h in held:
        h.close()


def test_a_hung_agent_makes_calls_time_out(agent):
    with connect(agent, call_timeout=0.3) as client:
        agent.answering = False
        t0 = time.monotonic()
        with pytest.raises(CallTimeout, match="0.3 s"):
            client.checkpointed(5)
        assert time.monotonic() - t0 < 1.0


def test_without_reconnect_a_closed_connection_is_a_clear_error(agent):
    client = connect(agent, reconnect=False)
    try:
        agent.close()
        wait_until(lambda: not client.connected, what="disconnect")
        with pytest.raises(AgentGone) as e:
            client.checkpointed(3)
        assert "the agent closed the connection" in str(e.value)
        assert agent.path in str(e.value)
        assert client.poll_order() is None
    finally:
        client.close()


def test_held_out_nics_follow_the_agent_and_survive_a_reconnect(agent):
    client = connect(agent)
    try:
        assert client.held_out == frozenset()
        agent.hold_out("rail0")
        wait_until(lambda: client.held_out == {"rail0"}, what="the held-out set")
        # Orders still flow beside it, and a reconnect keeps the set (the
        # agent says it again after the hello).
        agent.drop_connections()
        wait_until(lambda: agent.connected("train", 0) == 1, what="reconnect")
        oid = agent.order("train", 0, c.Stop())
        assert client.poll_order(2.0).order_id == oid
        assert client.held_out == {"rail0"}
        agent.hold_out()
        wait_until(lambda: client.held_out == frozenset(), what="the empty set")
    finally:
        client.close()


def test_the_client_survives_an_agent_restart(sockdir):
    path = os.path.join(sockdir, "agent.sock")
    a1 = FakeAgent(path)
    client = connect(path)
    try:
        oid = a1.order("train", 0, c.Checkpoint())
        assert client.poll_order(2.0).order_id == oid
        assert client.checkpointed(10) is Delivery.ACKED
        a1.close()  # the agent goes away
        wait_until(lambda: not client.connected, what="disconnect")
        # Calls meanwhile return at once, deferred; the answer is kept.
        t0 = time.monotonic()
        assert client.checkpointed(20) is Delivery.DEFERRED
        assert client.checkpoint_done(oid, 20) is Delivery.DEFERRED
        assert time.monotonic() - t0 < 0.5
        assert agent_path_in(client.last_error, path)
        a2 = FakeAgent(path)  # a new agent on the same path
        try:
            assert client.wait_connected(3.0)
            a2.wait_for(lambda m: isinstance(m, c.Hello))
            # Re-sent: the newest checkpoint and the kept order answer (the
            # new agent does not know the order, and says so: logged only).
            a2.wait_for(lambda m: m == c.Checkpointed(20))
            a2.wait_for(lambda m: isinstance(m, c.OrderDone) and m.order_id == oid and m.step == 20)
            assert client.checkpointed(30) is Delivery.ACKED
            # Orders keep flowing.
            oid2 = a2.order("train", 0, c.Stop())
            assert client.poll_order(2.0).order_id == oid2
        finally:
            a2.close()
    finally:
        client.close()


def test_a_dropped_connection_is_resumed_and_open_orders_are_not_delivered_twice(agent):
    with connect(agent) as client:
        oid = agent.order("train", 0, c.Checkpoint(halt=True))
        assert client.poll_order(2.0).order_id == oid
        agent.drop_connections()
        wait_until(lambda: agent.count(lambda m: isinstance(m, c.Hello)) == 2, what="second hello")
        assert client.wait_connected(2.0)
        # The agent sent the open order again on the new connection.
        assert client.poll_order(0.3) is None
        assert client.checkpoint_done(oid, 5) is Delivery.ACKED
        assert agent.wait_answer(oid).step == 5


def agent_path_in(error, path):
    return error is not None and path in error


def _scripted(path, script):
    """Serves one connection with ``script(conn, lines)``: lines yields the
    client's lines."""
    srv = _listen(path)

    def run():
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        conn.settimeout(3.0)
        f = conn.makefile("rb")
        try:
            script(conn, f)
        except OSError:
            pass
        finally:
            f.close()
            conn.close()
            srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(
    "bad,why",
    [
        (b"garbage\n", "bad line from the agent: malformed message: not JSON"),
        (b'{"type":"hello","job":"j","rank":0,"pid":1}\n', "unknown message type"),
        (b"x" * (c.MAX_LINE + 10) + b"\n", "line longer than 65536 bytes"),
        (b'{"type":"ok"}\n', "an answer nobody asked for"),
        (b'{"type":"order","order_id":1', "a line was not finished within 500 ms"),
    ],
    ids=["garbage", "job-message", "oversized", "unasked-answer", "unfinished-line"],
)
def test_a_line_that_breaks_the_contract_ends_the_connection(sockdir, bad, why):
    path = os.path.join(sockdir, "bad.sock")

    def script(conn, f):
        assert c.decode_job(f.readline().rstrip(b"\n")).TYPE == "hello"
        conn.sendall(c.encode(c.Ok()))
        conn.sendall(bad)
        conn.recv(1)  # until the client hangs up (bounded by the timeout)

    t = _scripted(path, script)
    client = connect(path, reconnect=False)
    try:
        wait_until(lambda: not client.connected, what="disconnect")
        with pytest.raises(AgentGone) as e:
            client.checkpointed(1)
        assert why in str(e.value)
    finally:
        client.close()
        t.join(3.0)


def test_the_agents_hello_timeout_error_is_a_refusal(sockdir):
    # What the agent sends a connection that is late with its hello.
    path = os.path.join(sockdir, "late.sock")

    def script(conn, f):
        f.readline()
        conn.sendall(c.encode(c.Error("no hello within 10000 ms; closing the connection")))

    t = _scripted(path, script)
    with pytest.raises(AgentRefused, match="no hello within 10000 ms"):
        connect(path)
    t.join(3.0)


def test_a_full_order_queue_answers_orders_as_failed(agent):
    with connect(agent, order_queue=2) as client:
        ids = [agent.order("train", 0, c.Checkpoint(step=i + 1)) for i in range(3)]
        refused = agent.wait_answer(ids[2])
        assert refused == c.OrderDone(order_id=ids[2], ok=False, detail="the job's order queue is full")
        assert [client.poll_order(1.0).order_id for _ in range(2)] == ids[:2]


def test_close_is_bounded_and_final(agent):
    client = connect(agent)
    t0 = time.monotonic()
    client.close()
    client.close()
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(ClientClosed):
        client.checkpointed(1)
    assert not client.connected
    with pytest.raises(ValueError):
        client.poll_order(timeout=-1)


def test_from_env_connects_under_railguard(agent):
    env = {
        "RAILGUARD_AGENT_SOCKET": agent.path,
        "RAILGUARD_JOB": "train",
        "RAILGUARD_RANK": "1",
        "RAILGUARD_WORLD_SIZE": "2",
    }
    client = JobClient.from_env(env, options=opts())
    try:
        assert client.active and client.env.rank == 1
        assert agent.wait_for(lambda m: isinstance(m, c.Hello)) == c.Hello("train", 1, os.getpid())
    finally:
        client.close()


def test_calls_from_many_threads_are_answered_in_order(agent):
    with connect(agent) as client:
        errors = []

        def worker(base):
            try:
                for i in range(25):
                    assert client.checkpointed(base + i) is Delivery.ACKED
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k * 1000,)) for k in range(6)]
        for t in threads:
            t.start()
        ids = [agent.order("train", 0, c.Checkpoint(step=i + 1)) for i in range(20)]
        got = [client.poll_order(2.0) for _ in ids]
        for t in threads:
            t.join(10.0)
        assert not errors and not any(t.is_alive() for t in threads)
        assert [o.order_id for o in got] == ids
        assert len(agent.checkpoints) == 150
        # A refusal goes to the caller it belongs to, not a neighbour.
        with pytest.raises(AgentRefused):
            client.order_done(1, True)
        assert client.checkpointed(1) is Delivery.ACKED
