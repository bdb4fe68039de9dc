"""The contract's wire format, checked against the shapes serde gives the Rust
types (rdma/src/contract/messages.rs) and the rules of wire.rs."""

import json

import pytest

from railguard import contract as c

# Exactly what serde_json writes for each message (tag first, then the
# fields in declaration order; None as null except OrderAnswer.step, which
# is skipped).
SHAPES = [
    (c.Hello(job="j", rank=3, pid=42), '{"type":"hello","job":"j","rank":3,"pid":42}'),
    (
        c.ConnUp(job="j", rank=0, conn_id=2**64 - 1, nic="rail0", peer_host="h1", peer_rank=1, rail=0),
        '{"type":"conn_up","job":"j","rank":0,"conn_id":18446744073709551615,"nic":"rail0",'
        '"peer_host":"h1","peer_rank":1,"rail":0}',
    ),
    (c.ConnMoved(conn_id=7, nic="rail1"), '{"type":"conn_moved","conn_id":7,"nic":"rail1"}'),
    (c.ConnClosed(conn_id=7), '{"type":"conn_closed","conn_id":7}'),
    (c.ConnStalled(conn_id=7), '{"type":"conn_stalled","conn_id":7}'),
    (c.OrderDone(order_id=9, ok=False, detail="d"), '{"type":"order_done","order_id":9,"ok":false,"detail":"d"}'),
    (
        c.OrderDone(order_id=10, ok=True, detail="", step=40),
        '{"type":"order_done","order_id":10,"ok":true,"detail":"","step":40}',
    ),
    (c.Checkpointed(step=12), '{"type":"checkpointed","step":12}'),
]
AGENT_SHAPES = [
    (c.Ok(), '{"type":"ok"}'),
    (c.Error(message="no"), '{"type":"error","message":"no"}'),
    (
        c.Order(order_id=1, kind=c.Migrate(conn_ids=[1, 2], to_nic="rail1")),
        '{"type":"order","order_id":1,"kind":{"type":"migrate","conn_ids":[1,2],"to_nic":"rail1"}}',
    ),
    (
        c.Order(order_id=2, kind=c.Pace(conn_id=1, bytes_per_s=None)),
        '{"type":"order","order_id":2,"kind":{"type":"pace","conn_id":1,"bytes_per_s":null}}',
    ),
    (
        c.Order(order_id=3, kind=c.Checkpoint(step=100, halt=False)),
        '{"type":"order","order_id":3,"kind":{"type":"checkpoint","step":100,"halt":false}}',
    ),
    (
        c.Order(order_id=1730000000000004, kind=c.Checkpoint(step=None, halt=True)),
        '{"type":"order","order_id":1730000000000004,"kind":{"type":"checkpoint","step":null,"halt":true}}',
    ),
    (c.Order(order_id=4, kind=c.Stop()), '{"type":"order","order_id":4,"kind":{"type":"stop"}}'),
    (c.HeldOut(nics=["rail0"]), '{"type":"held_out","nics":["rail0"]}'),
    (c.HeldOut(), '{"type":"held_out","nics":[]}'),
]


@pytest.mark.parametrize("msg,line", SHAPES)
def test_job_messages_have_the_rust_shapes_and_round_trip(msg, line):
    assert c.encode(msg) == line.encode() + b"\n"
    assert c.decode_job(line.encode()) == msg
    c.validate(msg)


@pytest.mark.parametrize("msg,line", AGENT_SHAPES)
def test_agent_messages_have_the_rust_shapes_and_round_trip(msg, line):
    assert c.encode(msg) == line.encode() + b"\n"
    assert c.decode_agent(line.encode()) == msg


def test_defaults_unknown_fields_and_crlf_are_taken_as_serde_does():
    # The module docs' example, written by hand.
    assert c.decode_job(b'{"type":"conn_moved","conn_id":7,"nic":"rail1"}') == c.ConnMoved(7, "rail1")
    o = c.decode_agent(b'{"type":"order","order_id":5,"kind":{"type":"migrate","conn_ids":[7]}}')
    assert o.kind == c.Migrate(conn_ids=(7,), to_nic=None)
    o = c.decode_agent(b'{"type":"order","order_id":6,"kind":{"type":"checkpoint"}}')
    assert o.kind == c.Checkpoint(step=None, halt=False)
    # #[serde(default)] detail; no step.
    assert c.decode_job(b'{"type":"order_done","order_id":1,"ok":true}') == c.OrderDone(1, True, "", None)
    # Unknown fields are ignored (no deny_unknown_fields).
    assert c.decode_agent(b'{"type":"ok","extra":[1,{"a":null}]}') == c.Ok()
    assert c.decode_job(b'{"pid":1,"rank":0,"job":"j","type":"hello","future":true}') == c.Hello("j", 0, 1)
    r = c.LineReader()
    assert r.feed(b'{"type":"ok"}\r\n') == [b'{"type":"ok"}']


@pytest.mark.parametrize(
    "line,error,text",
    [
        (b"hello there", c.Malformed, "malformed message: not JSON"),
        (b"[1,2]", c.Malformed, "not a JSON object"),
        (b'{"job":"j"}', c.Malformed, 'no "type" field'),
        (b'{"type":7}', c.Malformed, '"type" is not a string'),
        (b'{"type":"conn_teleported","conn_id":1}', c.UnknownType, "conn_teleported"),
        (b'{"type":"conn_moved","conn_id":"x","nic":"a"}', c.Malformed, "malformed message: conn_moved"),
        (b'{"type":"conn_up","job":"j"}', c.Malformed, "missing field `rank`"),
        (b'{"type":"checkpointed","step":1.0}', c.Malformed, "expected u64"),
        (b'{"type":"checkpointed","step":true}', c.Malformed, "expected u64"),
        (b'{"type":"checkpointed","step":-1}', c.Malformed, "expected u64"),
        (b'{"type":"checkpointed","step":18446744073709551616}', c.Malformed, "expected u64"),
        (b'{"type":"hello","job":"j","rank":4294967296,"pid":1}', c.Malformed, "expected u32"),
        (b'{"type":"order_done","order_id":1,"ok":1}', c.Malformed, "expected a boolean"),
        (b'{"type":"order_done","order_id":1,"ok":true,"detail":null}', c.Malformed, "expected a string"),
        (b'{"type":"checkpointed","step":NaN}', c.Malformed, "not JSON"),
        (b'{"type":"hello","job":"\\ud800","rank":0,"pid":1}', c.Malformed, "not JSON"),
        (b'{"type":"hello","job":"\xff","rank":0,"pid":1}', c.Malformed, "not JSON"),
        (b'{"type":"ok"} x', c.Malformed, "not JSON"),
        (b"", c.Malformed, "not JSON"),
    ],
)
def test_bad_job_lines_are_refused_with_the_rust_wording(line, error, text):
    with pytest.raises(error) as e:
        c.decode_job(line)
    assert text in str(e.value)


def test_unknown_types_name_what_is_known():
    with pytest.raises(c.UnknownType) as e:
        c.decode_job(b'{"type":"ok"}')
    assert "conn_moved" in str(e.value) and e.value.found == "ok"
    with pytest.raises(c.UnknownType) as e:
        c.decode_agent(b'{"type":"hello","job":"j","rank":0,"pid":1}')
    assert e.value.expected == c.AGENT_MESSAGE_TYPES
    with pytest.raises(c.Malformed) as e:
        c.decode_agent(b'{"type":"order","order_id":1,"kind":{"type":"teleport"}}')
    assert "unknown variant `teleport`" in str(e.value)
    with pytest.raises(c.Malformed):
        c.decode_agent(b'{"type":"order","order_id":1,"kind":"stop"}')
    with pytest.raises(c.Malformed) as e:
        c.decode_agent(b'{"type":"error"}')
    assert "missing field `message`" in str(e.value)


def test_a_held_out_set_is_bounded_and_its_names_checked_like_the_rust_side():
    with pytest.raises(c.Invalid, match="whitespace"):
        c.decode_agent(b'{"type":"held_out","nics":["rail 0"]}')
    many = json.dumps({"type": "held_out", "nics": [f"n{i}" for i in range(c.MAX_HELD_OUT_NICS + 1)]})
    with pytest.raises(c.Invalid, match="at most"):
        c.decode_agent(many.encode())
    with pytest.raises(c.Malformed, match="missing field `nics`"):
        c.decode_agent(b'{"type":"held_out"}')
    with pytest.raises(c.Malformed):
        c.decode_agent(b'{"type":"held_out","nics":[1]}')


def test_validation_matches_the_rust_checks():
    with pytest.raises(c.Invalid, match="whitespace"):
        c.validate(c.ConnMoved(1, "rail 0"))
    with pytest.raises(c.Invalid, match="1..=253 bytes"):
        c.validate(c.Hello("", 0, 0))
    c.validate(c.Hello("j" * 253, 0, 0))
    with pytest.raises(c.Invalid):
        c.validate(c.Hello("j" * 253 + "é", 0, 0))  # 255 bytes
    for bad in ("a\tb", "a\x00b", "a\x7fb", "a\u3000b", "a\u2028b", "a\x85b"):
        with pytest.raises(c.Invalid):
            c.validate(c.Hello(bad, 0, 0))
    c.validate(c.Hello("ジョブ-1.x_y", 0, 0))
    with pytest.raises(c.Invalid, match="detail longer than 1024 bytes"):
        c.validate(c.OrderDone(1, True, "x" * 1025))
    with pytest.raises(c.Invalid, match="step 3"):
        c.validate(c.OrderDone(1, False, "", 3))
    for bad in (c.ConnUp("j", 0, 1, "rail0", "h 1", 1, 0), c.ConnUp("", 0, 1, "rail0", "h1", 1, 0)):
        with pytest.raises(c.Invalid):
            c.validate(bad)


def test_encode_refuses_what_the_other_side_would_refuse():
    # A Python bool or float where serde wants an integer.
    with pytest.raises(c.Invalid, match="expected u32"):
        c.encode(c.Hello("j", True, 1))
    with pytest.raises(c.Invalid, match="expected u64"):
        c.encode(c.Checkpointed(1.0))
    with pytest.raises(c.Invalid, match="expected u64"):
        c.encode(c.Checkpointed(-1))
    with pytest.raises(c.Invalid, match="expected u64"):
        c.encode(c.Checkpointed(2**64))
    with pytest.raises(c.Invalid):
        c.encode(c.OrderDone(1, "yes"))
    with pytest.raises(c.Invalid, match="UTF-8"):
        c.encode(c.Error("\ud800"))
    # Too long for a line (the Rust test's case: encode does not validate).
    with pytest.raises(c.LineTooLong) as e:
        c.encode(c.OrderDone(1, True, "z" * c.MAX_LINE))
    assert "65536" in str(e.value)
    assert c.truncate("aé", 2) == "a"
    assert c.truncate("aé", 3) == "aé"


def test_non_ascii_is_written_as_utf8_like_serde():
    line = c.encode(c.Error("é"))
    assert line == '{"type":"error","message":"é"}\n'.encode("utf-8")
    assert json.loads(line) == {"type": "error", "message": "é"}


def test_line_reader_enforces_the_limit_and_the_line_timeout():
    r = c.LineReader()
    ok = b"y" * c.MAX_LINE
    assert r.feed(ok[:1000]) == []
    assert r.feed(ok[1000:] + b"\n") == [ok]  # exactly the limit is fine
    r = c.LineReader()
    with pytest.raises(c.LineTooLong):
        r.feed(b"x" * (c.MAX_LINE + 1))
    r = c.LineReader()
    with pytest.raises(c.LineTooLong):
        r.feed(b"x" * c.MAX_LINE + b"x\n")
    with pytest.raises(c.LineTooLong):
        c.decode_agent(b"x" * (c.MAX_LINE + 1))
    # Several lines in one read, one across reads.
    r = c.LineReader()
    assert r.feed(b'{"type":"ok"}\n{"type":"error","mess') == [b'{"type":"ok"}']
    assert r.partial
    assert r.feed(b'age":"x"}\n') == [b'{"type":"error","message":"x"}']
    assert not r.partial
    # Waiting between lines is not limited; a begun line is.
    r = c.LineReader(line_timeout=0.1)
    r.check_timeout(now=1e9)
    r.feed(b'{"type"', now=100.0)
    r.check_timeout(now=100.05)
    with pytest.raises(c.LineTimeout, match="100 ms"):
        r.check_timeout(now=100.2)
    # The stream ending inside a line.
    with pytest.raises(c.Malformed, match="middle of a line"):
        r.eof()
    c.LineReader().eof()


def test_socket_path_defaults_like_the_rust_side():
    assert c.socket_path({}) == c.DEFAULT_SOCKET == "/run/railguard/agent.sock"
    assert c.socket_path({"RAILGUARD_AGENT_SOCKET": ""}) == c.DEFAULT_SOCKET
    assert c.socket_path({"RAILGUARD_AGENT_SOCKET": "/tmp/a.sock"}) == "/tmp/a.sock"
